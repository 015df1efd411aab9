"""Device-side step windows rebuilt from kernel launches when Kineto wrote no
gpu_user_annotation copies (CUDA-graph traces seen so on an H100 with vLLM 0.26)."""

from __future__ import annotations

import pytest

from k25exp.traces.reader import read_trace
from k25exp.traces.steps import select_steps
from tests.traces.builders import DECODE, PREFILL, ev, step, write_trace

GRAPH = ("cudaGraphLaunch", "cuda_runtime")


def launch(t: float, corr: int, tid: int = 100) -> dict:
    return ev(GRAPH[0], t, 0.5, cat=GRAPH[1], pid=100, tid=tid, args={"correlation": corr})


def kernel(name: str, t: float, dur: float, corr: int) -> dict:
    return ev(name, t, dur, pid=0, tid=7, args={"correlation": corr})


def graph_trace(tmp_path, with_copies: bool = False):
    # host (µs): prefill [0, 6] launches corr 1; decode A [10, 15] launches corr 2 and 3;
    # decode B [31, 36] launches corr 4. Device: corr 1 [1, 9]; corr 2 [12, 20] and
    # corr 3 [20, 30] (A's kernels run long after its host range ends); corr 4 [32, 52].
    # Thread 200 launches corr 5 at t = 11, inside A's time but not its thread: not A's.
    events = [step(PREFILL, 0, 6), launch(1, 1), kernel("prefill_k", 1, 8, 1),
              step(DECODE, 10, 5), launch(11, 2), launch(14, 3),
              kernel("moe_k", 12, 8, 2), kernel("attn_k", 20, 10, 3),
              launch(11, 5, tid=200), kernel("other_thread_k", 53, 2, 5),
              step(DECODE, 31, 5), launch(32, 4), kernel("moe_k", 32, 20, 4)]
    if with_copies:
        events += [step(DECODE, 12, 18, device=True), step(DECODE, 32, 20, device=True),
                   step(PREFILL, 1, 8, device=True)]
    path = tmp_path / "t.json"
    write_trace(path, events)
    return path


@pytest.mark.parametrize("linked", [None, lambda name: False])
def test_steps_of_a_graph_trace_span_their_kernels_not_their_host_ranges(tmp_path, linked):
    t = read_trace(graph_trace(tmp_path), linked=linked)  # the analysis reads collectives only
    sel = select_steps(t, True, t.dur_ns >= 0)
    assert sel.source == "gpu_user_annotation"
    # by hand: A = [12, 30] (corr 2 and 3), B = [32, 52]; host ranges were [10, 15], [31, 36]
    got = [((s.start_ns - t.start_ns.min()) / 1000, (s.end_ns - t.start_ns.min()) / 1000)
           for s in sel.steps]
    assert got == [(11.0, 29.0), (31.0, 51.0)]  # relative to the first event (the kernel at 1)
    assert any("rebuilt from kernel launches" in w for w in sel.warnings)
    copies = [a for a in t.annotations if a.cat == "gpu_user_annotation"]
    assert sorted((a.name, (a.end_ns - a.start_ns) / 1000) for a in copies) == sorted(
        [(PREFILL, 8.0), (DECODE, 18.0), (DECODE, 20.0)])


def test_copies_that_kineto_wrote_are_kept_as_they_are(tmp_path):
    t = read_trace(graph_trace(tmp_path, with_copies=True))
    copies = [a for a in t.annotations if a.cat == "gpu_user_annotation"]
    assert len(copies) == 3 and "k25exp_device_copies" not in t.metadata
    sel = select_steps(t, True, t.dur_ns >= 0)
    assert not any("rebuilt" in w for w in sel.warnings)


def test_on_a_real_h200_trace_the_rebuilt_copies_are_kinetos_own(tmp_path):
    # The H200 fixture holds Kineto's gpu_user_annotation copies. Dropped from the file, the
    # copies rebuilt from the launches (kernels and the steps' input copies) must land where
    # Kineto put them: a check against what torch's profiler wrote, not against this module.
    import gzip
    import json
    from pathlib import Path

    from k25exp.traces.steps import parse_step_name

    src = Path(__file__).parent / "data" / "h200_decode_6steps.rank0.pt.trace.json.gz"
    kineto = sorted((a.start_ns, a.end_ns) for a in read_trace(src).annotations
                    if a.cat == "gpu_user_annotation")
    assert len(kineto) == 6  # one prefill and five decode steps
    data = json.loads(gzip.decompress(src.read_bytes()))
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("cat") != "gpu_user_annotation"]
    stripped = tmp_path / "stripped.json"
    stripped.write_text(json.dumps(data))
    t = read_trace(stripped, linked=lambda name: False)
    ours = sorted((a.start_ns, a.end_ns) for a in t.annotations
                  if a.cat == "gpu_user_annotation" and parse_step_name(a.name))
    assert len(ours) == 6
    for (ks, ke), (s, e) in zip(kineto, ours):  # µs timestamps rounded to ns: 1 ns apart at most
        assert abs(s - ks) <= 1 and abs(e - ke) <= 1
