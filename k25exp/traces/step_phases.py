"""Where a decode step's whole cycle goes: the forward, the sampler, the drafter, bookkeeping
and the host gap, from vLLM's own scopes.

With `VLLM_CUSTOM_SCOPES_FOR_PROFILING=1` in the server's environment (conf/experiment/
profile.yaml sets it), vLLM's model runner wraps its parts in profiler ranges named
`gpu_model_runner: <part>` (`record_function_or_nullcontext` in vllm/v1/utils.py; the CPU
runner inherits them): preprocess, forward and postprocess inside the step annotation
(`execute_...`, traces.steps), then, outside it, `sample` (the sampler; under speculative
decoding the rejection sampler), `draft` (the drafter's proposal) and `bookkeep`.

A cycle is one analysed decode step from its start to the start of the next annotated step.
Every instant of it goes to the first phase busy then, in this order:
  verify    the `forward` scope inside the step (the target model's forward over every
            scheduled token: under speculative decoding, the verification of k + 1 tokens per
            request); the whole step annotation where the trace has no forward scope
  sample    the sampler scope
  draft     the drafter scope
  bookkeep  vLLM's bookkeeping scope
  other     the step's time outside its forward (preprocess, postprocess: on a GPU under
            speculative decoding the device waits there while the host reads back how many
            drafts were accepted) and any other `gpu_model_runner:` scope
  gap       none of them: scheduling, output processing, waiting on the host
so the phases add up to the cycle exactly. On a GPU trace the timeline is the device's (the
scopes' gpu_user_annotation copies span their kernels): a drafter that runs on the host
(vLLM's CPU `ngram`) launches no kernel, so its time shows as gap there; its host-side
duration is given beside (`host_ms`). Cycles longer than 4× the median (a pause between
requests, an unanalysed prefill) are left out and counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from k25exp.stats import median
from k25exp.traces.intervals import total
from k25exp.traces.reader import Annotation
from k25exp.traces.steps import Step

SCOPE_PREFIX = "gpu_model_runner: "
# vLLM's scopes outside the step annotation, by the phase they are
SCOPE_PHASE = {"sample": "sample", "draft": "draft", "bookkeep": "bookkeep"}
FORWARD = "forward"  # the model's forward, inside the step: the verify phase
PHASES = ("verify", "sample", "draft", "bookkeep", "other", "gap")
# the environment variable that turns vLLM's scopes on
ENV = {"VLLM_CUSTOM_SCOPES_FOR_PROFILING": "1"}


@dataclass
class StepPhases:
    timeline: str                       # device | host
    cycles: int                         # cycles analysed
    dropped: int                        # cycles left out (longer than 4× the median)
    ms: dict[str, float]                # mean ms per cycle: each phase and `cycle`
    host_ms: dict[str, float] = field(default_factory=dict)  # device timeline: host scopes' mean

    def metrics(self) -> dict[str, float]:
        out = {f"phase_{p}_ms": v for p, v in self.ms.items()}
        out.update({f"phase_host_{p}_ms": v for p, v in self.host_ms.items()})
        out["phase_cycles"] = float(self.cycles)
        return out


def scope_part(name: str) -> str | None:
    """`gpu_model_runner: draft` → draft; None for any other annotation."""
    return name[len(SCOPE_PREFIX):] if name.startswith(SCOPE_PREFIX) else None


def step_phases(annotations: list[Annotation], steps: list[Step], source: str
                ) -> StepPhases | None:
    """The phases of the analysed decode steps (module docstring); None when the trace has
    no vLLM scopes (the server ran without VLLM_CUSTOM_SCOPES_FOR_PROFILING) or no cycle."""
    device = source == "gpu_user_annotation"
    cat = "gpu_user_annotation" if device else "user_annotation"
    scopes = [(a, part) for a in annotations
              if a.cat == cat and (part := scope_part(a.name)) is not None]
    if not scopes or source == "window":
        return None
    cycles = [(st.start_ns, st.limit_ns, st.end_ns) for st in steps
              if st.limit_ns is not None and st.limit_ns > st.start_ns]
    if not cycles:
        return None
    limit = 4 * median([lim - s for s, lim, _ in cycles])
    kept = [c for c in cycles if c[1] - c[0] <= limit]
    scopes.sort(key=lambda x: x[0].start_ns)
    starts = np.array([a.start_ns for a, _ in scopes], dtype=np.int64)
    longest = max(a.end_ns - a.start_ns for a, _ in scopes)
    sums = dict.fromkeys(PHASES, 0)
    forward = any(part == FORWARD for _, part in scopes)
    for s, lim, end in kept:
        lo = int(np.searchsorted(starts, s - longest, side="left"))
        hi = int(np.searchsorted(starts, lim, side="left"))
        inside = (s, min(end, lim))
        by: dict[str, list[tuple[int, int]]] = ({"verify": [], "other": [inside]} if forward
                                                else {"verify": [inside]})
        for a, part in scopes[lo:hi]:
            a0, a1 = max(a.start_ns, s), min(a.end_ns, lim)
            if a1 > a0:
                phase = "verify" if part == FORWARD else SCOPE_PHASE.get(part, "other")
                by.setdefault(phase, []).append((a0, a1))
        claimed: list[tuple[int, int]] = []
        for p in PHASES[:-1]:
            before = _len(claimed)
            claimed += by.get(p, [])
            sums[p] += _len(claimed) - before
        sums["gap"] += (lim - s) - _len(claimed)
    n = len(kept)
    ms = {p: v / n / 1e6 for p, v in sums.items()}
    ms["cycle"] = sum(lim - s for s, lim, _ in kept) / n / 1e6
    host: dict[str, float] = {}
    if device:  # the host side of every scope, per call (a host drafter's time is here)
        calls: dict[str, list[int]] = {}
        for a in annotations:
            if a.cat == "user_annotation" and (part := scope_part(a.name)) in SCOPE_PHASE:
                calls.setdefault(SCOPE_PHASE[part], []).append(a.end_ns - a.start_ns)
        host = {p: float(np.mean(v)) / 1e6 for p, v in calls.items()}
    return StepPhases("device" if device else "host", n, len(cycles) - n, ms, host)


def _len(ivs: list[tuple[int, int]]) -> int:
    if not ivs:
        return 0
    a = np.array(ivs, dtype=np.int64)
    return total(a[:, 0], a[:, 1])


# vLLM 0.26+'s drafters that keep async scheduling on (vllm/config/vllm.py); every other
# method (ngram, suffix, medusa, draft_model ...) turns it off
ASYNC_KEPT = ("eagle", "eagle3", "mtp", "ngram_gpu", "dflash")
SPLIT = ("scheduling", "verification", "sampler", "drafter", "host")


def schedules_as_baseline(method: str, device: str) -> bool:
    """Whether a speculative server of `method` schedules as its baseline does, so the baseline
    (not the baseline without async scheduling) is its reference: a drafter vLLM keeps async
    scheduling for, or vLLM's CPU build, which runs every server without it."""
    return method in ASYNC_KEPT or device == "cpu"


def gap_split(spec: dict[str, float], base: dict[str, float], sync: dict[str, float] | None,
              async_kept: bool) -> dict[str, float]:
    """The speculative cycle's excess over the baseline's (ms per step; `phase_*` figures of
    three captures at one level) in parts that sum to it exactly:
      scheduling    the baseline without async scheduling less the baseline (0 for a drafter
                    that keeps async scheduling: its reference is the baseline itself)
      verification  the spec step's forward (k + 1 tokens per request) less the reference's
      sampler       the rejection sampler less the reference's sampler
      drafter       the drafter's scope (the reference has none)
      host          the rest of the cycle (gap, bookkeeping, other scopes) less the reference's
    Raises KeyError when a capture lacks its phases."""
    ref = base if async_kept or sync is None else sync
    if not async_kept and sync is None:
        raise KeyError("no baseline_sync capture for a drafter that turns async scheduling off")

    def rest(p: dict[str, float]) -> float:
        return p["phase_gap_ms"] + p["phase_bookkeep_ms"] + p["phase_other_ms"]

    out = {"scheduling": ref["phase_cycle_ms"] - base["phase_cycle_ms"],
           "verification": spec["phase_verify_ms"] - ref["phase_verify_ms"],
           "sampler": spec["phase_sample_ms"] - ref["phase_sample_ms"],
           "drafter": spec["phase_draft_ms"] - ref["phase_draft_ms"],
           "host": rest(spec) - rest(ref)}
    out["total"] = spec["phase_cycle_ms"] - base["phase_cycle_ms"]
    return out
