"""The MLflow read side against a real SQLite store: runs as RunViews, the queries that find
them, metric histories and artifacts."""

from __future__ import annotations

import pytest
from mlflow.entities import Metric

from k25exp.tracking import read
from k25exp.tracking.read import RunView
from tests.conftest import seed_store


@pytest.fixture
def store(tmp_path):
    """(client, uri, {name: experiment id}) of a store with experiments k25exp/macro and
    k25exp/gemm, their artifacts under tmp_path/art."""
    seed_store(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    c = read.client(uri)
    exps = {n: c.create_experiment(f"k25exp/{n}", artifact_location=str(tmp_path / "art" / n))
            for n in ("macro", "gemm")}
    return c, uri, exps


def test_a_run_reads_as_a_view_with_its_history(store):
    c, _, exps = store
    r = c.create_run(exps["macro"], start_time=1234, run_name="m-1",
                     tags={"k25exp.experiment": "macro", "campaign": "A"})
    c.log_param(r.info.run_id, "experiment.load", "closed")
    # step 2 logged twice: the later timestamp wins, whatever the order they were sent in
    c.log_batch(r.info.run_id, metrics=[Metric("tpot_ms", 12.5, 20, 1), Metric("tpot_ms", 11.0, 30, 2),
                                        Metric("tpot_ms", 99.0, 10, 2)])
    c.set_terminated(r.info.run_id, "FINISHED")

    v = read.run(c, r.info.run_id)
    assert (v.run_id, v.experiment_id, v.phase, v.status, v.start_time, v.name) == (
        r.info.run_id, exps["macro"], "macro", "FINISHED", 1234, "m-1")
    assert v.params == {"experiment.load": "closed"} and v.tags["campaign"] == "A"
    assert v.metrics == {"tpot_ms": 11.0}  # the last step's value
    assert v.history("tpot_ms") == {1: 12.5, 2: 11.0} == read.history(c, v.run_id, "tpot_ms")
    assert v.history("absent") == {} and not v.is_parent


def test_an_unknown_or_malformed_run_id_is_none(store):
    c, _, _ = store
    assert read.run(c, "0" * 32) is None
    assert read.run(c, "campaign-20261129T120000Z") is None


def test_children_campaigns_and_recent_runs(store, monkeypatch):
    c, _, exps = store

    def make(exp: str, t: int, **tags) -> str:
        return c.create_run(exps[exp], start_time=t, tags=tags).info.run_id

    parent = make("macro", 1, **{"k25exp.role": "parent", "campaign": "A"})
    # a sweep over experiment=macro,gemm: its children sit in both MLflow experiments
    kids = {make("macro", 2, campaign="A", **{"mlflow.parentRunId": parent, "k25exp.experiment": "macro"}),
            make("gemm", 3, campaign="A", **{"mlflow.parentRunId": parent, "k25exp.experiment": "gemm"})}
    other = make("gemm", 4, campaign="B", **{"k25exp.experiment": "gemm"})

    assert read.run(c, parent).is_parent and read.is_parent({"k25exp.role": "parent"})
    assert {v.run_id for v in read.children(c, parent)} == kids
    assert {r.info.run_id for r in read.child_runs(c, parent)} == kids
    assert {v.run_id for v in read.campaign_runs(c, "A")} == kids  # the parent left out
    assert [v.run_id for v in read.campaign_runs(c, "B")] == [other]
    assert read.campaign_runs(c, "C") == []
    assert [v.start_time for v in read.recent_runs(c)] == [4, 3, 2, 1]
    assert [v.start_time for v in read.recent_runs(c, [exps["macro"]])] == [2, 1]
    assert read.recent_runs(c, []) == []
    monkeypatch.setattr(read, "RECENT", 2)
    assert [v.start_time for v in read.recent_runs(c)] == [4, 3]


def test_an_artifact_lands_under_its_basename_and_a_missing_one_raises(store, tmp_path):
    c, uri, exps = store
    rid = c.create_run(exps["macro"]).info.run_id
    src = tmp_path / "requests.jsonl"
    src.write_text('{"ok": true}\n')
    c.log_artifact(rid, str(src), "spec")
    dst = tmp_path / "got"
    dst.mkdir()
    read.download_artifact(uri, rid, "spec/requests.jsonl", dst)
    assert (dst / "requests.jsonl").read_text() == '{"ok": true}\n'
    with pytest.raises(Exception):
        read.download_artifact(uri, rid, "baseline/requests.jsonl", dst)


def test_a_hand_built_view_without_a_store():
    v = RunView("0123456789abcdef", "1", "gemm", "FINISHED", 0,
                params={"a": "3", "b": "null"}, steps={"x": {1: 2.0}})
    assert v.short == "01234567" and v.param("a", int) == 3 and v.param("b", int, 7) == 7
    assert v.history("x") == {1: 2.0} and v.history("y") == {}
