"""Each inter-token gap a client saw, joined to the engine steps that ran inside it.

The client knows when each token arrived (k25exp.load.client: a request's send in seconds
after the run's t0, each chunk's arrival in seconds after the send, on perf_counter); the
server's trace knows what the engine did (vLLM's step annotations, k25exp.traces.steps).
Neither alone says why a token came late: this module puts both on one clock and joins them.

One clock (`ClientClock`, `align`). Kineto stamps the trace on the host's system clock
(CLOCK_REALTIME: baseTimeNanoseconds + ts, `Trace.clock_offset_ns`); the client's
perf_counter is CLOCK_MONOTONIC. The client reads the two together at its t0 and again at its
end (the tightest of several bracketed reads; `pair_ns` is half the bracket), so any client
time maps onto the system clock, the slew between the two reads interpolated. What that
mapping is worth is measured on every capture, from causality alone:
  lower bound  the j-th token the client received was made by then: the engine had produced
               j tokens. A step produces at most its generation tokens + its context
               requests, so the step where that count first reaches j ended no later than
               the true one:  trace − client ≥ max_j [done(that step) − arrival_j]
  upper bound  prompt tokens are prefilled only after they are sent: a step whose prefills
               bring the processed prompt tokens to P started after the first requests (in
               send order) holding P tokens were sent:
               trace − client ≤ min_k [start_k − send(the request that completes P)]
The offset lies in [lo, hi] (`Alignment`). On one host both sides read one system clock, so
0 lies in it and the bracket is the measured error (its width is the smallest delivery plus
the smallest send-to-prefill time seen). Clocks that disagree (0 outside) are corrected: the
client's times move to the nearest edge (`shift_ms`).

The join (`join`), per request. Whether a request was in a step is not in the trace (no
request ids): it is inferred. Each token chunk is given the step that made its last token by
a dynamic programme over the steps that ended before it arrived: steps only move forward, a
chunk of n tokens needs n steps that decoded (fewer under speculative decoding, up to the
most tokens a step gave one request), the first chunk comes from a step with a prefill, and
the path minimises Σ |delivery − the level's typical delivery| + λ × decoding steps the
request is left out of (λ = half the median step). A request left out of steps keeps its
later tokens on time only by skipping (each token's delivery would otherwise grow by the
steps it missed, token after token), whereas a token held back in delivery is followed by a
burst that no skip can explain: the two are told apart by the whole path, not by one gap.

Each gap a_j − a_{j−1} (arrivals of chunks j−1 and j, produced by steps p < s) is then cut
into parts that add up to it exactly:
  own_ms      the producing step s: its annotation and the model runner's scopes after it
              (sample, bookkeep ...) before the next step (`EngineStep.done_ns`)
  host_ms     the host gap before it: end of step s − 1 → start of s
  the steps strictly between p and s, each with the host gap before it, by what they were
  for this request:
    merged_ms     steps whose tokens came in this chunk (a chunk of n tokens: the last n − 1
                  decoding steps before s): made on time, delivered together
    skipped_ms    other decoding steps: the request was left out (waiting, preempted; inferred)
    prefill_ms    steps that decoded nothing and prefilled (the engine paused every decode)
    empty_ms      steps that did neither
  launch_ms   under async scheduling (the host launches step N + 1 before step N is done),
              the change in the part of the delivery delay spent before the next step was
              launched: vLLM hands a step's tokens on only after launching the next one, so a
              host blocked in that launch holds them. With L_s = end of step s + 1's host
              range: held_s = clamp(L_s − done_s, 0, a_j − done_s); launch = held_s − held_p
              (0 where the trace shows no async scheduling, or either L is unknown)
  delivery_ms the rest of the change in delivery delay, (a_j − done_s) − (a_{j−1} − done_p)
              − launch_ms
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from k25exp.stats import median
from k25exp.traces.reader import Trace
from k25exp.traces.step_phases import scope_part
from k25exp.traces.steps import StepInfo, merge_same_step, parse_step_name

PAIR_READS = 7  # bracketed (perf_counter, system clock) reads; the tightest is kept


def read_pair() -> tuple[int, int, int]:
    """(perf_counter ns, system clock ns, half-width ns): the system clock read between two
    perf_counter reads, the tightest of PAIR_READS tries (a preempted read is wide)."""
    best = None
    for _ in range(PAIR_READS):
        p0 = time.perf_counter_ns()
        w = time.time_ns()
        p1 = time.perf_counter_ns()
        if best is None or p1 - p0 < best[2] * 2:
            best = ((p0 + p1) // 2, w, (p1 - p0) // 2)
    return best  # type: ignore[return-value]


@dataclass(frozen=True)
class ClientClock:
    """The client's perf_counter (records' times are seconds from `perf_t0`) against the
    system clock the trace is stamped on: one pair read at the start, one at the end."""

    perf_t0: float           # the client's t0, perf_counter seconds
    wall_t0_ns: int          # the system clock at perf_t0
    pair_ns: int             # half-width of the start read
    perf_t1: Optional[float] = None  # the end read (perf_counter s, system ns)
    wall_t1_ns: Optional[int] = None

    @classmethod
    def start(cls, perf_t0: float) -> "ClientClock":
        p, w, half = read_pair()
        return cls(perf_t0, w - round((p / 1e9 - perf_t0) * 1e9), half)

    def finish(self) -> "ClientClock":
        p, w, _ = read_pair()
        return ClientClock(self.perf_t0, self.wall_t0_ns, self.pair_ns, p / 1e9, w)

    @property
    def drift_us(self) -> float:
        """How far the system clock moved against perf_counter between the two reads (NTP
        slewing it): 0 on a quiet host."""
        if self.perf_t1 is None or self.wall_t1_ns is None:
            return 0.0
        return ((self.wall_t1_ns - self.wall_t0_ns) - (self.perf_t1 - self.perf_t0) * 1e9) / 1e3

    def wall_ns(self, rel_s: float) -> float:
        """The system clock (ns) at `rel_s` seconds after t0, slew interpolated (a float:
        ~256 ns resolution at today's epoch; `ms_after` keeps ns)."""
        return self.wall_t0_ns + self._ns(rel_s)

    def ms_after(self, zero_ns: int, rel_s: float) -> float:
        """ms from the system clock's `zero_ns` to `rel_s` seconds after t0 (exact ints first,
        so no precision is lost to the epoch's magnitude)."""
        return ((self.wall_t0_ns - zero_ns) + self._ns(rel_s)) / 1e6

    def _ns(self, rel_s: float) -> float:
        span = (self.perf_t1 - self.perf_t0) if self.perf_t1 is not None else 0.0
        slope = 1.0 + (self.drift_us * 1e3 / (span * 1e9) if span > 0 else 0.0)
        return rel_s * 1e9 * slope

    def to_dict(self) -> dict:
        return {"perf_t0": self.perf_t0, "wall_t0_ns": self.wall_t0_ns, "pair_ns": self.pair_ns,
                "perf_t1": self.perf_t1, "wall_t1_ns": self.wall_t1_ns}

    @classmethod
    def from_dict(cls, d: dict) -> "ClientClock":
        try:
            return cls(float(d["perf_t0"]), int(d["wall_t0_ns"]), int(d["pair_ns"]),
                       None if d.get("perf_t1") is None else float(d["perf_t1"]),
                       None if d.get("wall_t1_ns") is None else int(d["wall_t1_ns"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"client clock {d!r}: expected perf_t0, wall_t0_ns, pair_ns "
                             f"(and perf_t1, wall_t1_ns): {e}") from None


@dataclass
class EngineStep:
    """One annotated engine step of any kind, on the system clock (ns)."""

    index: int
    name: str
    start_ns: int
    end_ns: int      # the step annotation's end (the forward)
    done_ns: int     # its outputs ready: the last model-runner scope after it, before the next step
    info: StepInfo
    # Under async scheduling (a device trace whose host launches step N + 1 before step N is
    # done), the end of step N + 1's host range: the engine hands step N's tokens on only
    # after it has launched the next step. None: not known, or not async.
    next_launched_ns: Optional[int] = None

    @property
    def decodes(self) -> bool:
        return self.info.generation_requests > 0

    @property
    def prefills(self) -> bool:
        return self.info.context_requests > 0

    @property
    def kind(self) -> str:
        if self.decodes:
            return "mixed" if self.prefills else "decode"
        return "prefill" if self.prefills else "empty"

    @property
    def tokens_out(self) -> int:
        """The most tokens it can have produced: generation tokens + context requests."""
        i = self.info
        g = i.generation_tokens if i.generation_tokens is not None else i.generation_requests
        return g + i.context_requests


def engine_steps(trace: Trace) -> list[EngineStep]:
    """Every vLLM step annotation of one rank's trace (device-side ones where the trace has
    them: the engine's timeline is the device's), merged per step, in time order, each
    extended over the model runner's scopes that follow it (VLLM_CUSTOM_SCOPES_FOR_PROFILING:
    the sampler runs after the step annotation ends, and a token exists only after it)."""
    device = any(a.cat == "gpu_user_annotation" and parse_step_name(a.name) is not None
                 for a in trace.annotations)
    cat = "gpu_user_annotation" if device else "user_annotation"
    anns = [a for a in trace.annotations if a.cat == cat and parse_step_name(a.name) is not None]
    merged = sorted(merge_same_step(anns), key=lambda s: (s.start_ns, s.end_ns))
    scopes = sorted((a.start_ns, a.end_ns) for a in trace.annotations
                    if a.cat == cat and scope_part(a.name) is not None)
    s_start = np.array([s for s, _ in scopes], dtype=np.int64)
    s_end = np.array([e for _, e in scopes], dtype=np.int64)
    off = trace.clock_offset_ns
    launched = _next_launched(trace, merged, anns) if device else [None] * len(merged)
    out: list[EngineStep] = []
    for i, st in enumerate(merged):
        limit = merged[i + 1].start_ns if i + 1 < len(merged) else None
        end = st.end_ns if limit is None else min(st.end_ns, limit)
        done = end
        if s_start.size:
            lo = int(np.searchsorted(s_start, st.start_ns, side="left"))
            hi = s_start.size if limit is None else int(np.searchsorted(s_start, limit, side="left"))
            if hi > lo:
                done = max(done, int(s_end[lo:hi].max()))
                if limit is not None:
                    done = min(done, limit)
        out.append(EngineStep(i, st.name, st.start_ns + off, max(st.start_ns, end) + off,
                              max(st.start_ns, done) + off, parse_step_name(st.name),  # type: ignore[arg-type]
                              None if launched[i] is None else launched[i] + off))
    return out


def _next_launched(trace: Trace, merged: list, device_anns: list) -> list[Optional[int]]:
    """Per device step, the end of the next step's host range (trace ns) where the trace shows
    async scheduling, else None for every step. A device step's host range is the host
    annotation its copies share an External id with (Kineto's link; k25exp.traces.
    device_copies keeps it on the copies it rebuilds). Async: the host starts step N + 1
    before step N is done on the device, for at least half the consecutive pairs."""
    host = {a.ext_id: a for a in trace.annotations
            if a.cat == "user_annotation" and a.ext_id is not None and parse_step_name(a.name) is not None}
    first: dict[int, int] = {}   # device step start → its host annotation's External id
    for a in sorted(device_anns, key=lambda a: a.start_ns):
        if a.ext_id in host:
            first.setdefault(a.start_ns, a.ext_id)
    rng = [(host[e].start_ns, host[e].end_ns) if (e := first.get(st.start_ns)) is not None else None
           for st in merged]
    pairs = [(rng[i + 1][0] < merged[i].end_ns) for i in range(len(merged) - 1)
             if rng[i + 1] is not None]
    if len(pairs) < 2 or 2 * sum(pairs) < len(pairs):
        return [None] * len(merged)
    return [rng[i + 1][1] if i + 1 < len(rng) and rng[i + 1] is not None else None
            for i in range(len(merged))]


@dataclass
class ClientRequest:
    """One request as the client saw it, times in ms on the timeline (the system clock
    less `zero_ns`)."""

    i: int
    send_ms: float
    arrive_ms: np.ndarray   # each token-carrying chunk
    tokens: np.ndarray      # tokens each chunk carried
    prompt_tokens: int
    stall_chunks: frozenset[int] = frozenset()  # chunks that ended a delivery stall (load.stalls)


def client_requests(records: Sequence[dict], clock: ClientClock, zero_ns: int) -> list[ClientRequest]:
    """The successful records that streamed tokens, on the timeline. A record needs sent_s,
    chunk_s and chunk_tokens (k25exp.load.client); its `stalls` (load.stalls.mark), if set,
    name the chunks after a delivery stall."""
    out = []
    for r in records:
        if not r.get("ok") or not r.get("chunk_s"):
            continue
        try:
            send = clock.ms_after(zero_ns, float(r["sent_s"]))
            arr = np.array([clock.ms_after(zero_ns, float(r["sent_s"]) + c) for c in r["chunk_s"]])
            tok = np.array(r.get("chunk_tokens") or [1] * len(r["chunk_s"]), dtype=np.int64)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"request record {r.get('i')!r}: expected sent_s, chunk_s and "
                             f"chunk_tokens (k25exp.load.client): {e}") from None
        if tok.size != arr.size:
            raise ValueError(f"request record {r.get('i')!r}: {arr.size} chunk times but "
                             f"{tok.size} chunk token counts")
        pt = r.get("prompt_tokens") or (r.get("usage") or {}).get("prompt_tokens") or 0
        out.append(ClientRequest(int(r.get("i", len(out))), send, arr, tok, int(pt),
                                 frozenset(int(s[0]) for s in r.get("stalls") or [])))
    return out


@dataclass
class Alignment:
    """The trace clock less the client's, bracketed by causality (module docstring), in ms,
    before any shift; shift_ms moved the client's times (0 when 0 lies in the bracket)."""

    lo_ms: float
    hi_ms: float
    lower_n: int      # tokens the lower bound is over
    upper_n: int      # prefill steps the upper bound is over
    shift_ms: float = 0.0
    pair_us: float = 0.0
    drift_us: float = 0.0
    note: str = ""

    @property
    def consistent(self) -> bool:
        return self.lo_ms <= self.hi_ms

    @property
    def error_ms(self) -> float:
        """The largest offset between the two clocks the capture allows, after the shift:
        max(|lo|, |hi|) of the shifted bracket; nan when the bounds contradict each other."""
        if not self.consistent or math.isinf(self.lo_ms) or math.isinf(self.hi_ms):
            return math.nan
        return max(abs(self.lo_ms - self.shift_ms), abs(self.hi_ms - self.shift_ms))

    def metrics(self) -> dict[str, float]:
        out = {"clock.lower_n": float(self.lower_n), "clock.upper_n": float(self.upper_n),
               "clock.shift_ms": self.shift_ms, "clock.pair_us": self.pair_us,
               "clock.drift_us": self.drift_us}
        for k, v in (("clock.lo_ms", self.lo_ms), ("clock.hi_ms", self.hi_ms),
                     ("clock.error_ms", self.error_ms)):
            if math.isfinite(v):
                out[k] = v
        return out


def align(steps: Sequence[EngineStep], reqs: Sequence[ClientRequest], zero_ns: int) -> Alignment:
    """The bracket of the trace clock against the client's (module docstring)."""
    done = np.array([(s.done_ns - zero_ns) / 1e6 for s in steps])
    start = np.array([(s.start_ns - zero_ns) / 1e6 for s in steps])
    cum_out = np.cumsum([s.tokens_out for s in steps])
    arr = np.concatenate([r.arrive_ms for r in reqs]) if reqs else np.zeros(0)
    tok = np.concatenate([r.tokens for r in reqs]) if reqs else np.zeros(0, dtype=np.int64)
    order = np.argsort(arr, kind="stable")
    arr, cum_in = arr[order], np.cumsum(tok[order])
    k = np.searchsorted(cum_out, cum_in, side="left") if cum_out.size else np.zeros(0, dtype=int)
    ok = k < len(steps)
    lo = float((done[k[ok]] - arr[ok]).max()) if ok.any() else -math.inf
    notes = []
    if (~ok).any():
        notes.append(f"{int((~ok).sum())} tokens arrived beyond what the trace's steps produced "
                     "(steps missing from the capture): left out of the lower bound")
    hi, upper_n = math.inf, 0
    by_send = sorted(reqs, key=lambda r: r.send_ms)
    sends = np.array([r.send_ms for r in by_send])
    cum_p = np.cumsum([r.prompt_tokens for r in by_send])
    ctx = [(i, s.info.context_tokens) for i, s in enumerate(steps) if s.prefills]
    if ctx and all(t is not None for _, t in ctx) and cum_p.size and cum_p[-1] > 0:
        cum_c = np.cumsum([t for _, t in ctx])
        j = np.searchsorted(cum_p, cum_c, side="left")
        fine = j < sends.size
        if fine.any():
            idx = np.array([i for i, _ in ctx])[fine]
            hi, upper_n = float((start[idx] - sends[j[fine]]).min()), int(fine.sum())
        if (~fine).any():
            notes.append(f"{int((~fine).sum())} prefill steps processed more prompt tokens than "
                         "had been sent (requests of another client?): left out of the upper bound")
    elif ctx and sends.size:  # no token counts (older vLLM): the first prefill after the first send
        hi, upper_n = float(start[ctx[0][0]] - sends[0]), 1
    shift = 0.0
    if lo <= hi:
        shift = lo if lo > 0 else (hi if hi < 0 else 0.0)
    else:
        notes.append(f"the bounds contradict each other (lo {lo:.3f} ms > hi {hi:.3f} ms): "
                     "the trace does not hold this client's requests alone; not shifted")
    return Alignment(lo, hi, int(ok.sum()), upper_n, shift, note="; ".join(notes))


@dataclass
class Gap:
    """One inter-token gap of one request: chunk `chunk` (≥ 1) after chunk − 1; its parts
    (ms) add up to gap_ms exactly (module docstring)."""

    request: int
    chunk: int
    tokens: int          # tokens the chunk carried
    gap_ms: float
    step: int            # the step that made its last token (inferred)
    prev_step: int       # the step that made the previous chunk's
    own_ms: float
    host_ms: float
    merged_ms: float
    skipped_ms: float
    prefill_ms: float
    empty_ms: float
    delivery_ms: float   # the change in delivery delay, less launch_ms
    deliver_ms: float    # this chunk's own delivery delay (step done → arrival)
    skipped_steps: int
    stall: bool          # the chunk ended a delivery stall (load.stalls)
    launch_ms: float = 0.0  # the change in the part of the delivery delay spent before the
    #                         next step was launched (async scheduling; module docstring)

    PARTS = ("own_ms", "host_ms", "merged_ms", "skipped_ms", "prefill_ms", "empty_ms",
             "launch_ms", "delivery_ms")

    def parts(self) -> dict[str, float]:
        return {p: getattr(self, p) for p in self.PARTS}


@dataclass
class TokenJoin:
    steps: list[EngineStep]
    zero_ns: int
    alignment: Alignment
    requests: list[ClientRequest]
    assigned: dict[int, np.ndarray]    # request → the step of each chunk (unjoined: absent)
    gaps: list[Gap]
    delivery_ms: float                 # the typical delivery delay the path was fitted to
    unjoined: dict[int, str] = field(default_factory=dict)  # request → why not
    batch_match: tuple[int, int] = (0, 0)  # (decoding steps whose batch the join reproduced, of)

    def step_ms(self) -> tuple[np.ndarray, np.ndarray]:
        """(start, done) of every step, ms on the timeline."""
        return (np.array([(s.start_ns - self.zero_ns) / 1e6 for s in self.steps]),
                np.array([(s.done_ns - self.zero_ns) / 1e6 for s in self.steps]))


def join(steps: Sequence[EngineStep], records: Sequence[dict], clock: ClientClock,
         horizon_ms: Optional[float] = None) -> TokenJoin:
    """Every gap of every successful record joined to the steps (module docstring).
    `horizon_ms`: the longest delivery delay considered (default max(1 s, 20 median steps);
    a request no path fits within it is tried at 5× that, then left unjoined with why)."""
    if not steps:
        raise ValueError("no vLLM step annotations in the trace: nothing to join the tokens to")
    steps = list(steps)
    zero = steps[0].start_ns
    reqs0 = client_requests(records, clock, zero)
    al = align(steps, reqs0, zero)
    al.pair_us, al.drift_us = clock.pair_ns / 1e3, clock.drift_us
    reqs = [ClientRequest(r.i, r.send_ms + al.shift_ms, r.arrive_ms + al.shift_ms, r.tokens,
                          r.prompt_tokens, r.stall_chunks) for r in reqs0]
    start = np.array([(s.start_ns - zero) / 1e6 for s in steps])
    done = np.array([(s.done_ns - zero) / 1e6 for s in steps])
    gen = np.array([s.decodes for s in steps])
    ctx = np.array([s.prefills for s in steps])
    cg = np.cumsum(gen)
    dec_ms = [d - s for d, s, g, c in zip(done, start, gen, ctx) if g and not c]
    step_med = median(dec_ms) if dec_ms else float(median(list(done - start)))
    # tokens a step can give one request (speculative decoding: its verified tokens + 1)
    tps = max([math.ceil(s.info.generation_tokens / s.info.generation_requests) for s in steps
               if s.decodes and s.info.generation_tokens], default=1)
    shifted = Alignment(al.lo_ms - al.shift_ms, al.hi_ms - al.shift_ms, 0, 0)
    tol_d = max(0.0, shifted.hi_ms if math.isfinite(shifted.hi_ms) else 0.0) + 1e-3
    tol_s = min(0.0, shifted.lo_ms if math.isfinite(shifted.lo_ms) else 0.0) - 1e-3
    horizon = horizon_ms or max(1000.0, 20 * step_med)
    typical = _fifo_delivery(done, steps, reqs)
    launched = np.array([np.nan if s.next_launched_ns is None else (s.next_launched_ns - zero) / 1e6
                         for s in steps])
    ctx_arr = _Steps(start, done, gen, ctx, cg, tps,
                     launched if np.isfinite(launched).any() else None)
    assigned, unjoined = {}, {}
    for _ in range(2):  # the typical delivery refitted once, on the first pass's paths
        assigned, unjoined = {}, {}
        for r in reqs:
            path, why = None, ""
            for h in (horizon, 5 * horizon):
                path, why = _path(r, ctx_arr, typical, 0.5 * step_med, h, tol_d, tol_s)
                if path is not None:
                    break
            if path is None:
                unjoined[r.i] = why
            else:
                assigned[r.i] = path
        ds = [d for r in reqs if r.i in assigned for d in r.arrive_ms - done[assigned[r.i]]]
        if not ds or abs(median(ds) - typical) < 0.05 * step_med:
            break
        typical = median(ds)
    gaps = [g for r in reqs if r.i in assigned for g in _gaps(r, assigned[r.i], ctx_arr, steps)]
    j = TokenJoin(steps, zero, al, reqs, assigned, gaps, typical, unjoined)
    j.batch_match = _batch_match(j)
    return j


@dataclass
class _Steps:
    start: np.ndarray
    done: np.ndarray
    gen: np.ndarray    # bool: the step decoded
    ctx: np.ndarray    # bool: it prefilled
    cg: np.ndarray     # cumulative count of decoding steps
    tps: int           # tokens a step can give one request
    launched: Optional[np.ndarray] = None  # next step's host range end (ms), NaN: unknown


def _fifo_delivery(done: np.ndarray, steps: Sequence[EngineStep], reqs: Sequence[ClientRequest]) -> float:
    """The typical delivery delay: the j-th token produced against the j-th token received,
    over every token (tokens leave in about the order they are made), the median."""
    prod = np.repeat(done, [s.tokens_out for s in steps])
    arr = np.sort(np.concatenate([np.repeat(r.arrive_ms, r.tokens) for r in reqs])) if reqs else prod[:0]
    n = min(prod.size, arr.size)
    return max(0.0, float(np.median(arr[:n] - prod[:n]))) if n else 0.0


def _path(r: ClientRequest, st: _Steps, typical: float, lam: float, horizon: float,
          tol_d: float, tol_s: float) -> tuple[Optional[np.ndarray], str]:
    """The step of each chunk of `r` (module docstring's dynamic programme), or None and why."""
    n = r.arrive_ms.size
    back: list[np.ndarray] = []
    cands: list[np.ndarray] = []
    a0 = r.arrive_ms[0]
    c = np.flatnonzero((st.done <= a0 + tol_d) & (st.done >= a0 - horizon)
                       & (st.start - r.send_ms >= tol_s) & st.ctx)
    if c.size == 0:
        return None, (f"no step with a prefill between its send ({r.send_ms:.1f} ms) and its "
                      f"first token ({a0:.1f} ms)")
    cost = np.abs(a0 - st.done[c] - typical)
    cands.append(c)
    for j in range(1, n):
        a, k = r.arrive_ms[j], int(r.tokens[j])
        cj = np.flatnonzero((st.done <= a + tol_d) & (st.done >= a - horizon) & st.gen)
        if cj.size == 0:
            return None, f"chunk {j}: no decoding step within {horizon:.0f} ms before it"
        prev = cands[-1]
        between = st.cg[cj][None, :] - st.cg[prev][:, None]
        ok = (cj[None, :] > prev[:, None]) & (between >= math.ceil(k / st.tps))
        total = (cost[:, None] + lam * np.maximum(0, between - k)
                 + np.abs(a - st.done[cj] - typical)[None, :])
        total = np.where(ok, total, np.inf)
        arg = np.argmin(total, axis=0)
        cost = total[arg, np.arange(cj.size)]
        if not np.isfinite(cost).any():
            return None, f"chunk {j}: no order of steps explains it after chunk {j - 1}"
        back.append(arg)
        cands.append(cj)
    path = np.empty(n, dtype=np.int64)
    idx = int(np.argmin(cost))
    for j in range(n - 1, -1, -1):
        path[j] = cands[j][idx]
        if j:
            idx = int(back[j - 1][idx])
    return path, ""


def _gaps(r: ClientRequest, path: np.ndarray, st: _Steps, steps: Sequence[EngineStep]) -> list[Gap]:
    out = []
    for j in range(1, path.size):
        p, s, k = int(path[j - 1]), int(path[j]), int(r.tokens[j])
        mid = np.arange(p + 1, s)
        seg = st.done[mid] - np.r_[st.done[p], st.done[mid[:-1]]] if mid.size else mid.astype(float)
        decoding = mid[st.gen[mid]] if mid.size else mid
        merged = set(decoding[max(0, decoding.size - (k - 1)):].tolist()) if k > 1 else set()
        parts = dict(merged_ms=0.0, skipped_ms=0.0, prefill_ms=0.0, empty_ms=0.0)
        skipped = 0
        for i, t in zip(mid.tolist(), seg.tolist()):
            if i in merged:
                parts["merged_ms"] += t
            elif st.gen[i]:
                parts["skipped_ms"] += t
                skipped += 1
            else:
                parts["prefill_ms" if st.ctx[i] else "empty_ms"] += t
        d_now, d_prev = r.arrive_ms[j] - st.done[s], r.arrive_ms[j - 1] - st.done[p]
        h_now, h_prev = _held(st, s, d_now), _held(st, p, d_prev)
        # both ends known, or none of it: one end alone would move the other's hold into delivery
        launch = h_now - h_prev if h_now is not None and h_prev is not None else 0.0
        out.append(Gap(r.i, j, k, float(r.arrive_ms[j] - r.arrive_ms[j - 1]), s, p,
                       float(st.done[s] - st.start[s]), float(st.start[s] - st.done[s - 1]),
                       float(parts["merged_ms"]), float(parts["skipped_ms"]),
                       float(parts["prefill_ms"]), float(parts["empty_ms"]),
                       float(d_now - d_prev - launch), float(d_now), skipped, j in r.stall_chunks,
                       float(launch)))
    return out


def _held(st: _Steps, s: int, deliver_ms: float) -> Optional[float]:
    """The part of step s's token's delivery delay spent before the next step was launched;
    None where the next launch is not known (no async scheduling, the last step, a step whose
    successor has no host range)."""
    if st.launched is None or not np.isfinite(st.launched[s]):
        return None
    return float(min(max(st.launched[s] - st.done[s], 0.0), max(deliver_ms, 0.0)))


def _batch_match(j: TokenJoin) -> tuple[int, int]:
    """How many decoding steps, of those inside the join's span, ran exactly the requests the
    join put in them (its batch size from the annotation): a check of the inferred paths."""
    if not j.assigned:
        return 0, 0
    counts = np.zeros(len(j.steps), dtype=np.int64)
    gen_steps = np.array([s.decodes for s in j.steps])
    for r in j.requests:
        path = j.assigned.get(r.i)
        if path is None:
            continue
        for jj in range(1, path.size):
            p, s, k = int(path[jj - 1]), int(path[jj]), int(r.tokens[jj])
            dec = [i for i in range(p + 1, s + 1) if gen_steps[i]]
            for i in dec[max(0, len(dec) - k):]:
                counts[i] += 1
    first = min(int(p[0]) for p in j.assigned.values())
    last = max(int(p[-1]) for p in j.assigned.values())
    span = [i for i in range(first + 1, last + 1) if gen_steps[i]]
    if j.unjoined:  # requests left out would be missing from every batch they were in
        return 0, len(span)
    hit = sum(1 for i in span if counts[i] == j.steps[i].info.generation_requests)
    return hit, len(span)
