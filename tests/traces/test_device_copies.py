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


def test_on_a_real_h100_graph_trace_the_steps_hold_kinetos_own_forward_copies():
    # vLLM 0.26 with CUDA graphs on an H100: Kineto copied the model-runner scopes to the
    # device and not one step annotation. Each step is rebuilt (a copy of one kind present
    # must not stop the rebuild of the other), and the device copies Kineto did write of each
    # step's `gpu_model_runner: forward` (linked to the host scope by External id) must lie
    # inside that step's rebuilt copy and fill nearly all of it: Kineto's word, not ours.
    from pathlib import Path

    from k25exp.traces.steps import parse_step_name

    src = Path(__file__).parent / "data" / "h100_graphs_6steps.rank0.pt.trace.json.gz"
    t = read_trace(src, linked=lambda name: False)
    host = sorted((a for a in t.annotations
                   if a.cat == "user_annotation" and parse_step_name(a.name)), key=lambda a: a.start_ns)
    dev = sorted((a for a in t.annotations
                  if a.cat == "gpu_user_annotation" and parse_step_name(a.name)), key=lambda a: a.start_ns)
    assert len(host) == 7 and len(dev) == 6  # the 7th host step's kernels are cut off the file
    fwd_host = {a.ext_id: a for a in t.annotations
                if a.cat == "user_annotation" and a.name == "gpu_model_runner: forward"}
    fwd_dev = [a for a in t.annotations
               if a.cat == "gpu_user_annotation" and a.name == "gpu_model_runner: forward"]
    checked = 0
    for h, d in zip(host, dev):
        mine = [f for f in fwd_dev if fwd_host.get(f.ext_id) is not None
                and h.start_ns <= fwd_host[f.ext_id].start_ns < h.end_ns]
        assert mine, h.name
        for f in mine:
            assert d.start_ns <= f.start_ns and f.end_ns <= d.end_ns
        span = max(f.end_ns for f in mine) - min(f.start_ns for f in mine)
        assert span >= 0.95 * (d.end_ns - d.start_ns)
        # the host range is the queueing only: the device step is several times longer
        assert d.end_ns - d.start_ns > 3 * (h.end_ns - h.start_ns)
        checked += len(mine)
    assert checked == 12  # two lanes' copies per step, by hand from the file


def test_a_step_copy_over_its_own_kernels_only_is_widened_to_its_nested_scopes(tmp_path):
    """Kineto's step copy 1 µs wide while the forward launched inside the step ran 8 µs on the
    device (seen on an H100 with n-gram drafts on the GPU): the step spans its nested scopes'
    copies. A scope launched after the step's host range is not the step's."""
    fwd = "gpu_model_runner: forward"
    events = [step(DECODE, 0, 10, ext=1), step(fwd, 2, 3, ext=2),        # host: step ⊃ forward
              step(DECODE, 20, 10, ext=3), step(fwd, 21, 2, ext=4),
              step("gpu_model_runner: sample", 12, 2, ext=5),            # after step 1's host range
              # device: step 1's own copy [11, 12]; its forward [3, 11]; the sample [13, 14]
              step(DECODE, 11, 1, device=True, ext=1), step(fwd, 3, 8, device=True, ext=2),
              step("gpu_model_runner: sample", 13, 1, device=True, ext=5),
              step(DECODE, 21, 6, device=True, ext=3), step(fwd, 22, 4, device=True, ext=4),
              kernel("k", 3, 8, 9)]
    path = tmp_path / "t.json"
    write_trace(path, events)
    t = read_trace(path)
    sel = select_steps(t, True, t.dur_ns >= 0)
    got = [((s.start_ns - t.start_ns.min()) / 1000, (s.end_ns - t.start_ns.min()) / 1000)
           for s in sel.steps]
    # by hand: step 1 = [3, 12] (its forward [3, 11] and its own copy [11, 12], not the sample
    # at 13); step 2 keeps [21, 27]; relative to the first work event (the kernel at 3)
    assert got == [(0.0, 9.0), (18.0, 24.0)]
    assert t.metadata.get("k25exp_steps_widened") == "1"
