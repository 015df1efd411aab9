"""The ITL tail by cause at every profiled level, and, without a trace, at every macro level.

Profile runs (k25exp.runners.profile_tail) join each profiled token to the captured steps and
give every gap of the level's ITL tail (above its p99, and every delivery stall) a cause:
shared prefill, a long step of another kind, steps the request was left out of, host gap,
delivery or client lag (k25exp.traces.tail_causes); the table gives each cause's share of the
tail's excess over the median ITL, under the profiler. The closed-loop macro's levels have no
trace: the same tail decomposed from the client's records alone (k25exp.load.tail_client),
as far as they tell, beside what the server's /metrics gives (preemptions, the engine's own
ITL p99 bucket).
"""

from __future__ import annotations

from typing import Optional

from k25exp.load.tail_client import CAUSES as CLIENT_CAUSES
from k25exp.report.figures import Section, Table
from k25exp.report.sources import Campaign, RunView
from k25exp.traces.tail_causes import ALL as TRACE_CAUSES

TITLE = "The ITL tail by cause"


def _newest_per_level(runs: list[RunView]) -> list[tuple[int, RunView]]:
    """The newest profile run with a tail decomposition at each concurrency, by concurrency."""
    out: dict[int, RunView] = {}
    for r in runs:  # newest first
        c = r.param("experiment.concurrency", int)
        if c is not None and c not in out and "tail.itl_n" in r.metrics:
            out[c] = r
    return sorted(out.items())


def _n(v: Optional[float]) -> Optional[int]:
    return None if v is None else int(v)


def profiled_rows(c: Campaign) -> list[list]:
    rows = []
    for conc, r in _newest_per_level(c.of("profile")):
        m = r.metrics
        rows.append([conc, m.get("tail.itl_ms_p50"), m.get("tail.itl_ms_p99"), _n(m.get("tail.itl_n")),
                     _n(m.get("tail.gaps")), m.get("tail.excess_ms"),
                     *(m.get(f"tail.cause.{k}_pct") for k in TRACE_CAUSES),
                     m.get("tail.caused_pct"), m.get("clock.error_ms"),
                     m.get("tail_client.agree_pct"), r])
    return rows


def macro_rows(c: Campaign) -> list[list]:
    macro = c.closed_loop_macro()
    if macro is None:
        return []
    n = macro.history("tail_client.itl_n")
    rows = []
    for level in sorted(n):
        def at(key: str) -> Optional[float]:
            return macro.history(key).get(level)
        rows.append([level, at("tail_client.itl_ms_p50"), at("tail_client.itl_ms_p99"), _n(n[level]),
                     _n(at("tail_client.gaps")),
                     *(at(f"tail_client.cause.{k}_pct") for k in CLIENT_CAUSES),
                     _n(at("server_preemptions")), at("server_itl_ms_p99_le"), macro])
    return rows


def tail_section(c: Campaign) -> Section:
    sec = Section(TITLE)
    prof = profiled_rows(c)
    if prof:
        sec.tables.append(Table(
            "Profiled levels: the ITL tail's excess over the median, by cause (% of the excess)",
            ["c", "ITL p50 ms", "ITL p99 ms", "gaps n", "tail gaps", "excess ms", *TRACE_CAUSES,
             "named %", "clock error ms", "client-only agrees %", "run"], prof,
            "under the profiler (its slowdown is in every gap); the tail = gaps above the level's "
            "p99 (with ≥ 100 gaps) and every gap ending a delivery stall; each tail gap's excess "
            "over the p50 split by the engine steps joined to it (k25exp.traces.tail_causes): "
            "prefill = the step that made the token carried one, long_step = a longer pure "
            "decode step, skipped = decoding steps the request was left out of (inferred), "
            "host_gap, delivery (or client lag); named % = 100 − unexplained; clock error = the "
            "largest offset between the client's clock and the trace's the capture allows; "
            "client-only agrees = tail gaps the records alone named as the trace did"))
    else:
        sec.notes.append(c.why_missing("profile", "with an ITL tail decomposition (tail.*)")
                         if not c.of("profile") else
                         "no profile run carries an ITL tail decomposition (tail.*): runs "
                         "older than it, or its join failed (tag tail.skipped)")
    mac = macro_rows(c)
    if mac:
        sec.tables.append(Table(
            "Macro levels, no trace: the ITL tail by cause from the client's records (% of the "
            "excess)",
            ["c", "ITL p50 ms", "ITL p99 ms", "gaps n", "tail gaps", *CLIENT_CAUSES,
             "preemptions", "engine ITL p99 ≤ ms", "run"], mac,
            "k25exp.load.tail_client: engine = every request waited (a long step or a host gap: "
            "it cannot tell which), prefill = and another request's prefill ended in the gap, "
            "skipped = the others kept getting tokens, delivery = the gap ended in a burst (held "
            "back: the server or the client, it cannot tell which); preemptions and the engine's "
            "own ITL p99 bucket bound from /metrics over the level"))
    return sec
