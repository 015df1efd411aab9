"""The campaign report: sources (MLflow → RunViews), budget (arithmetic), render (MD/HTML)."""
