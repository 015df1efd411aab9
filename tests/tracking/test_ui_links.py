"""Links into MLflow's UI, written out by hand (`k25exp ui`'s lines on a real store are
tested end to end in tests/compare/test_compare_cli.py and tests/tracking/test_ui_first_screen.py)."""

from __future__ import annotations

from k25exp.tracking.read import RunView
from k25exp.tracking.ui_links import compare_url, run_url, runs_url


def test_a_run_page_an_experiments_runs_and_a_compare_view():
    r = RunView("abc123", "7", "macro", "FINISHED", 0)
    assert run_url("http://h:5000/", r) == "http://h:5000/#/experiments/7/runs/abc123"
    assert runs_url("http://h:5000", "7") == "http://h:5000/#/experiments/7/runs?workflowType=machine_learning"
    assert runs_url("http://h:5000", "7", "tags.campaign = 'A'") == (
        "http://h:5000/#/experiments/7/runs?workflowType=machine_learning"
        "&searchFilter=tags.campaign%20%3D%20%27A%27")
    # experiments once each, sorted
    assert compare_url("http://h:5000", ["a", "b"], ["2", "1", "2"]) == (
        "http://h:5000/#/compare-runs?runs=%5B%22a%22%2C%20%22b%22%5D"
        "&experiments=%5B%221%22%2C%20%222%22%5D&workflowType=machine_learning")
