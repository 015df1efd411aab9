"""The MLflow edge against a real SQLite store: batching limits, flattening, parent links."""

from __future__ import annotations

from k25exp.tracking.mlflow_store import MlflowStore
from k25exp.tracking.params import flatten


def test_flatten_nested_config():
    flat = flatten({"model": {"hidden_size": 7168, "quant": {"bits": 4}},
                    "experiment": {"tokens_per_gpu": [1, 2], "reference_tpot_ms": None}})
    assert flat == {"model.hidden_size": "7168", "model.quant.bits": "4",
                    "experiment.tokens_per_gpu": "[1, 2]", "experiment.reference_tpot_ms": "null"}


def test_batches_past_mlflow_limits_and_parent_links(tmp_path):
    store = MlflowStore(f"sqlite:///{tmp_path}/db/mlflow.db", str(tmp_path / "art"))
    parent = store.start_run("k25exp/test", run_name="parent")
    run = store.start_run("k25exp/test", run_name="child", parent_run_id=parent.run_id)
    run.log_params({f"p{i}": str(i) for i in range(250)})  # > 100 per batch
    for step in range(1200):  # > 1000 metrics per batch, flushed on the way and at end
        run.log_metrics({"a": step * 2.0, "b": 1.0}, step=step)
    run.end("FINISHED")
    c = store.client
    got = c.get_run(run.run_id)
    assert len(got.data.params) == 250 and got.info.status == "FINISHED"
    hist = c.get_metric_history(run.run_id, "a")
    assert len(hist) == 1200 and {m.step: m.value for m in hist}[1199] == 2398.0
    assert [r.info.run_id for r in store.children(parent.run_id)] == [run.run_id]
    exp = c.get_experiment_by_name("k25exp/test")
    assert exp.artifact_location == f"{tmp_path}/art/k25exp/test"


def test_bad_metric_name_is_refused_when_logged_not_at_flush(tmp_path):
    import pytest

    store = MlflowStore(f"sqlite:///{tmp_path}/mlflow.db", str(tmp_path / "art"))
    run = store.start_run("k25exp/test")
    run.log_metrics({"ok/name.tp2": 1.0})
    with pytest.raises(ValueError, match="shape@tp2"):
        run.log_metrics({"shape@tp2": 1.0})
    run.end("FINISHED")  # the good metric still lands
    assert store.client.get_run(run.run_id).data.metrics == {"ok/name.tp2": 1.0}
