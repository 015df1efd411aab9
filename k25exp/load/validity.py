"""Whether the client kept up with a level: the client-lag rule, by name
(experiment.validity.rule; its keys: k25exp.config.experiments.validity).

A level's send lag is each send's actual less its scheduled time (lag_ms: in an open loop
without the wait for a slot under the cap). Under either rule a client CPU above 90 % of a
core is client lag too (one event loop near a full core).

relative (the default): the lag is held against the level's own step, its mean ITL (the mean
    gap between token-carrying chunks on the client's clock: every decode step, those that
    shared a prefill included, one chunk per step with speculative decoding too; a delivery
    burst does not shrink it, the silence before it pays for it), or, for an SLO probe, the
    SLO's tightest bound (MacroConfig.lag_reference). A send is late when it left at least
    lag_frac × that after it was due. The level lagged when more than `tail` of its sends,
    and at least min_late of them, were late (count-aware: the p99 of a level of fewer than
    100 sends would be its single worst send, so one late wake-up would void it), or when its
    event loop's mean wake-up lag reached lag_frac × the step. A level that measured no step
    (no request streamed two chunks) is judged by the absolute limit, and says so.
absolute: the rule before experiment.validity existed: the send lag's p99 (its max under 100
    sends) or the mean loop lag above experiment.max_client_lag_ms (20 ms).

judge() returns the verdict's figures: client_lagged; client_lag_limit_ms (the lag a send was
held against), client_late_sends (sends at or past it; absolute: past it), client_lag_ref_ms
(relative: the step or bound the limit is a fraction of); and client_lag_rule, the rule and
its numbers in words (a string: the level's `why`, never logged as a metric).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from k25exp.config.experiments.validity import ValidityConfig

MAX_CLIENT_CPU = 0.9  # of one core: beyond it the single event loop is the bottleneck
STEP_NAME = "ITL mean"  # the relative rule's step (the level figure itl_ms_mean)


def send_lag_judged(m: dict) -> float:
    """The send lag the absolute rule judges: its p99 where 100 sends support one, else its
    max (a p99 of a few sends would be the max anyway, and the max errs on the safe side)."""
    return m.get("client_lag_ms_p99", m.get("client_lag_ms_max", 0.0))


def judge(m: dict, lags: Sequence[float], validity: Optional[ValidityConfig], limit_ms: float,
          reference: Optional[tuple[float, str]] = None) -> dict:
    """The client-lag verdict of a level whose figures so far are `m` (its send lag, loop lag,
    CPU and ITL figures) and whose sends were late by `lags` (ms): by `validity`'s rule (None:
    absolute), `limit_ms` being the absolute limit (experiment.max_client_lag_ms) and
    `reference` (ms, name) a fixed time to hold the lag against instead of the step."""
    cpu = m.get("client_cpu_util", 0.0) > MAX_CLIENT_CPU
    loop = m.get("client_loop_lag_ms_mean", 0.0)
    if validity is not None and validity.rule == "relative":
        ref, source = reference or (m.get("itl_ms_mean"), STEP_NAME)
        if ref:
            return _relative(lags, loop, cpu, validity, ref, source)
    return _absolute(m, lags, loop, cpu, limit_ms,
                     "" if validity is None or validity.rule == "absolute"
                     else "no step measured: ")


def _relative(lags: Sequence[float], loop: float, cpu: bool, v: ValidityConfig, ref: float,
              source: str) -> dict:
    limit = v.lag_frac * ref
    late = sum(1 for x in lags if x >= limit)
    # more than `tail` of the sends, and at least min_late (the epsilon: 0.07 × 100 is 7.000…1)
    allowed = max(v.min_late - 1, math.floor(v.tail * len(lags) + 1e-9))
    sends, looped = late > allowed, loop >= limit
    text = (f"relative: {late} of {len(lags)} sends late by >= {limit:.1f} ms = {v.lag_frac:g} x "
            f"{source} {ref:.1f} ms ({allowed} allowed)")
    if looped:
        text += f"; loop lag mean {loop:.1f} ms >= {limit:.1f} ms"
    return _verdict(sends or looped or cpu, limit, late, text, cpu) | {"client_lag_ref_ms": ref}


def _absolute(m: dict, lags: Sequence[float], loop: float, cpu: bool, limit: float,
              prefix: str) -> dict:
    judged = send_lag_judged(m)
    which = "p99" if "client_lag_ms_p99" in m else f"max of {len(lags)}"
    text = (f"{prefix}absolute: send lag {which} {judged:.1f} ms, loop lag mean {loop:.1f} ms; "
            f"limit {limit:g} ms")
    return _verdict(judged > limit or loop > limit or cpu, limit,
                    sum(1 for x in lags if x > limit), text, cpu)


def _verdict(lagged: bool, limit: float, late: int, text: str, cpu: bool) -> dict:
    out = {"client_lagged": float(lagged), "client_late_sends": float(late),
           "client_lag_rule": text + ("; client CPU above 90 % of a core" if cpu else "")}
    if math.isfinite(limit):  # inf: no limit (a caller that judges no lag)
        out["client_lag_limit_ms"] = limit
    return out


def describe(validity: ValidityConfig, limit_ms: float,
             reference: Optional[tuple[float, str]] = None) -> str:
    """The rule a run's levels were judged by, in words (its tag macro.validity)."""
    cpu = "; or client CPU above 90 % of a core"
    if validity.rule == "absolute":
        return (f"absolute: send lag p99 (its max under 100 sends) or mean loop lag above "
                f"{limit_ms:g} ms (experiment.max_client_lag_ms){cpu}")
    ref = (f"{reference[1]} ({reference[0]:g} ms)" if reference else
           f"the level's {STEP_NAME} (its step; where none: the absolute {limit_ms:g} ms)")
    return (f"relative: a send late by >= {validity.lag_frac:g} x {ref}; lagged when more than "
            f"{validity.tail:.0%} of the level's sends and at least {validity.min_late} were, "
            f"or the mean loop lag reached it{cpu}")
