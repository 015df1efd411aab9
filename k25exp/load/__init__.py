"""The load generator: the async HTTP client that drives a server (one process or several
sharing one schedule), the arrival schedules, exact-length prompts, and the per-level figures
computed from its records. It talks HTTP to any OpenAI-compatible server (k25exp.serving
launches vLLM's); nothing here imports Hydra, MLflow or vLLM."""
