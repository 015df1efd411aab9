"""Whether a pair's runs sent the same requests (k25exp.compare.shapes), from runs as the
macro logs them: its params and its macro.* tags (k25exp.load.workload.Workload.describe)."""

from __future__ import annotations

from k25exp.compare.resolve import Pair
from k25exp.compare.shapes import differences, shape_notes
from k25exp.tracking.read import RunView

FIXED = "fixed 128"
UNIFORM = "uniform, mean 128, range_ratio 0.5, clipped to [1, none]"


def run(rid: str, load: str = "closed", tags: dict | None = None, **params) -> RunView:
    base = {"macro.input_len": FIXED, "macro.output_len": "fixed 64"}
    return RunView(rid, "1", "macro", "FINISHED", 0,
                   params={"experiment.load": load, "experiment.prefix_tokens": "0",
                           "experiment.prefix_groups": "1", **params},
                   tags={**base, **(tags or {})})


def test_a_length_distribution_against_fixed_lengths_is_said_with_both_shapes():
    a, b = run("a"), run("b", tags={"macro.input_len": UNIFORM})
    assert differences(a, b) == [("input lengths", FIXED, UNIFORM)]
    (note,) = shape_notes([Pair("macro", {}, a, b)])
    assert note.startswith(f"the requests differ (macro): input lengths: A `{FIXED}`, B `{UNIFORM}`. "
                           "A and B did not send the same requests")
    assert shape_notes([Pair("macro", {}, a, run("a2"))]) == []  # the same shape: nothing to say


def test_one_trace_in_two_folders_is_one_workload_and_another_trace_is_not():
    def traced(rid, path, sha):
        return run(rid, "trace", tags={"macro.trace": f"{path}: 32 requests over 7.750 s, blocks of "
                                                      f"512 tokens (sha256 {sha})"},
                   **{"experiment.trace.path": path, "experiment.trace.speedup": "[1.0, 2.0]"})
    a = traced("a", "/runs/a/trace.jsonl", "0123456789abcdef")
    assert differences(a, traced("b", "/elsewhere/trace.jsonl", "0123456789abcdef")) == []
    other = traced("c", "/runs/a/trace.jsonl", "fedcba9876543210")  # rewritten in place
    assert differences(a, other) == [
        ("trace", "32 requests over 7.750 s, blocks of 512 tokens (sha256 0123456789abcdef)",
         "32 requests over 7.750 s, blocks of 512 tokens (sha256 fedcba9876543210)")]


def test_sessions_against_a_closed_loop_name_the_load_and_the_sessions():
    sessions = "3 turns a session, 4 sessions a level; ..."
    d = differences(run("a"), run("b", "sessions", tags={"macro.sessions": sessions}))
    assert d == [("load", "closed", "sessions"), ("sessions", "(none)", sessions)]


def test_runs_from_before_the_shape_tags_are_compared_on_their_params():
    def old(rid, **params):
        return RunView(rid, "1", "macro", "FINISHED", 0, tags={},
                       params={"experiment.load": "closed", "experiment.input_tokens": "128",
                               "experiment.trace.speedup": "[1.0]", **params})
    a, b = old("a", **{"experiment.input_tokens": "128"}), old("b", **{"experiment.input_tokens": "1536"})
    assert differences(a, b) == [("experiment.input_tokens", "128", "1536")]
    # a sweep's own axis is not the shape
    assert differences(old("a"), old("b", **{"experiment.trace.speedup": "[2.0]"})) == []


def test_pairs_with_the_same_difference_share_one_note():
    pairs = [Pair("macro", {"experiment.concurrency": str(c)}, run(f"a{c}"),
                  run(f"b{c}", tags={"macro.output_len": "normal, mean 64, stddev 16, clipped to [1, 128]"}))
             for c in (1, 2)]
    (note,) = shape_notes(pairs)
    assert note.startswith("the requests differ (macro [concurrency=1], macro [concurrency=2]): "
                           "output lengths: A `fixed 64`, B `normal, mean 64, stddev 16, clipped to [1, 128]`")
