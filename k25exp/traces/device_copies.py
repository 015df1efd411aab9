"""Device-side copies of host annotations, rebuilt from kernel launches where Kineto wrote none.

A vLLM step annotation (`execute_context_..._generation_...`) and its model-runner scopes are
host ranges. Kineto adds a `gpu_user_annotation` copy of each, spanning the kernels launched
inside it, and the analysis times a GPU step by that copy: the host range ends when the work
is queued, the device work later. With CUDA graphs the copies can be missing (seen with vLLM
0.26.0 and torch 2.11 on an H100: host ranges only). A decode step of 256 requests then reads
as a 4.7 ms host range every 21.5 ms, its kernels outside it, and a token's wait for the
device looks like delivery.

The trace still says what launched each kernel: the kernel's `correlation` id is its launch
call's (`cudaLaunchKernel`, or `cudaGraphLaunch` for every kernel of a graph replay). A copy
here spans, on the device, the kernels whose launch falls inside the host range on the host
range's own thread: the copy Kineto would have written.

Kineto may copy some annotations and not others: on an H100 (vLLM 0.26, torch 2.11) it wrote
device copies of the model-runner scopes (`gpu_model_runner: forward` ...) and none of the step
annotations. So copies are rebuilt kind by kind (the steps; each scope name) for every host
annotation of a kind with no device copy in the trace, not only when the trace has none at all.

Kineto may also write a step's copy over only the kernels launched in the step itself and
not in the scopes nested in it: on an H100 (vLLM 0.26, torch 2.11, n-gram drafts on the GPU)
each step's copy was 1-10 µs while its `forward` scope's copy, launched inside the step, ran
8.6 ms. `widen_steps` makes each step's device extent hold its nested annotations' copies
(found by the host annotation's External id): the kernels launched inside the step, as the
copies rebuilt from launches hold them.
"""

from __future__ import annotations

import numpy as np

from k25exp.traces.reader import DEVICE_CATS, Annotation, Trace
from k25exp.traces.step_phases import SCOPE_PREFIX
from k25exp.traces.steps import parse_step_name

HOST, DEVICE = "user_annotation", "gpu_user_annotation"


def family(name: str) -> str | None:
    """The annotations the analysis times on the device, by kind: "step" for vLLM's steps,
    the scope's own name for its model-runner scopes; None for any other (`nccl:all_reduce`
    goes without a copy in Kineto's traces too)."""
    if parse_step_name(name) is not None:
        return "step"
    return name if name.startswith(SCOPE_PREFIX) else None


def uncovered(trace: Trace) -> list[Annotation]:
    """The host annotations of each timed kind (`family`) of which Kineto wrote no device
    copy at all, that launched device work on their own thread (those with nothing inside
    them would get no copy from Kineto either). By kind, not one by one: a step cut off by
    the profiler's stop has no copy in a trace whose other steps have theirs. Reads the
    launches alone, which every read keeps."""
    if not trace.has_device_work() or trace.launches is None or trace.launches.corr.size == 0:
        return []
    copied = {family(a.name) for a in trace.annotations if a.cat == DEVICE}
    host = [a for a in trace.annotations
            if a.cat == HOST and (f := family(a.name)) is not None and f not in copied]
    if not host:
        return []
    order = np.argsort(trace.launches.start_ns, kind="stable")
    t, lane = trace.launches.start_ns[order], trace.launches.lane[order]
    out = []
    for a in host:
        lo = int(np.searchsorted(t, a.start_ns, side="left"))
        hi = int(np.searchsorted(t, a.end_ns, side="right"))
        if (lane[lo:hi] == a.lane).any():
            out.append(a)
    return out


def add(trace: Trace, host: list[Annotation]) -> int:
    """Appends a `gpu_user_annotation` copy of each of `host` (uncovered's) (its name, on the
    device lane of its first kernel); returns how many. Needs every device event's
    correlation id (read_trace with linked=None)."""
    if trace.corr is None or trace.launches is None or trace.launches.corr.size == 0:
        return 0
    dev_ids = [i for i, c in enumerate(trace.cats) if c in DEVICE_CATS]
    idx = np.nonzero(np.isin(trace.cat_id, dev_ids) & (trace.corr >= 0))[0]
    at = trace.launches.find(trace.corr[idx])
    idx, at = idx[at >= 0], at[at >= 0]
    if idx.size == 0:
        return 0
    t_launch = trace.launches.start_ns[at]
    lane_launch = trace.launches.lane[at]
    order = np.argsort(t_launch, kind="stable")
    idx, t_launch, lane_launch = idx[order], t_launch[order], lane_launch[order]
    start = trace.start_ns[idx]
    end = start + trace.dur_ns[idx]
    copies = []
    for a in host:
        lo = int(np.searchsorted(t_launch, a.start_ns, side="left"))
        hi = int(np.searchsorted(t_launch, a.end_ns, side="right"))
        inside = np.nonzero(lane_launch[lo:hi] == a.lane)[0] + lo
        if inside.size == 0:
            continue
        first = inside[np.argmin(start[inside])]
        copies.append(Annotation(a.name, DEVICE, int(start[inside].min()), int(end[inside].max()),
                                 int(trace.lane_id[idx[first]]), a.ext_id))
    trace.annotations.extend(copies)
    trace.metadata["k25exp_device_copies"] = "from_launches"
    return len(copies)


def widen_steps(trace: Trace) -> int:
    """Adds, for each host step with a device copy, a copy (its name and External id, so
    traces.steps merges it into the step's span) from its first to its last nested annotation's
    device copy where those reach outside the step's own copy: the annotations inside the host
    step on its thread, matched to their copies by External id. Returns how many steps widened."""
    host = sorted((a for a in trace.annotations if a.cat == HOST and a.ext_id is not None),
                  key=lambda a: a.start_ns)
    dev: dict[int, list[Annotation]] = {}
    for a in trace.annotations:
        if a.cat == DEVICE and a.ext_id is not None:
            dev.setdefault(a.ext_id, []).append(a)
    steps = [a for a in host if family(a.name) == "step" and a.ext_id in dev]
    if not steps:
        return 0
    starts = np.array([a.start_ns for a in host], dtype=np.int64)
    widened = []
    for st in steps:
        own = dev[st.ext_id]  # type: ignore[index]
        lo0, hi0 = min(a.start_ns for a in own), max(a.end_ns for a in own)
        lo, hi = lo0, hi0
        i0 = int(np.searchsorted(starts, st.start_ns, side="left"))
        i1 = int(np.searchsorted(starts, st.end_ns, side="right"))
        for a in host[i0:i1]:
            if a is st or a.lane != st.lane or a.end_ns > st.end_ns:
                continue
            for c in dev.get(a.ext_id, ()):  # type: ignore[arg-type]
                lo, hi = min(lo, c.start_ns), max(hi, c.end_ns)
        if (lo, hi) != (lo0, hi0):
            widened.append(Annotation(st.name, DEVICE, lo, hi, own[0].lane, st.ext_id))
    trace.annotations.extend(widened)
    if widened:
        trace.metadata["k25exp_steps_widened"] = str(len(widened))
    return len(widened)
