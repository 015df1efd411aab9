"""The profile's ITL tail by cause: the profiled requests' tokens joined to the captured steps.

After the breakdown, the profile runner hands the profiled level's request records, the
client clock it read (k25exp.traces.token_gaps.ClientClock) and the copied traces here: the
lowest rank's trace gives the engine's steps (every rank runs the same steps), the tokens
are joined to them, each gap of the tail gets its cause (k25exp.traces.tail_causes), and
the same tail is decomposed from the client's records alone (k25exp.load.tail_client) and
checked against it (tail_client.agree_pct). Files go to out/tail/ (the run's artifacts),
figures to the run (tail.*, clock.*, tail_client.*). Everything here is under the profiler:
its slowdown is in every gap, and the figures say what the tail is made of, not how long it is
without it. A failure here is a tag (tail.skipped), never a lost capture.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Optional, Sequence

from k25exp.load import stalls
from k25exp.load.tail_client import agreement, client_tail
from k25exp.load.level_figures import decode_prefills, stall_reference
from k25exp.traces import read_trace
from k25exp.traces.tail_causes import tail
from k25exp.traces.tail_outputs import causes_table, step_categories, write_tail
from k25exp.traces.token_gaps import ClientClock, engine_steps, join
from k25exp.tracking.recorder import Recorder

log = logging.getLogger(__name__)

CLOCK_FILE = "clock.json"  # the client clock of the profiled window, in the run folder


def lowest_rank(paths: Sequence[Path]) -> Path:
    """The trace of the lowest rank by vLLM's file names (…_rank<N>.…), else the first."""
    def rank(p: Path) -> tuple[int, str]:
        m = re.search(r"rank(\d+)", p.name)
        return (int(m[1]) if m else 1 << 30, p.name)
    return min(paths, key=rank)


def save_clock(out: Path, clock: ClientClock) -> None:
    (out / CLOCK_FILE).write_text(json.dumps(clock.to_dict()))


def profiled_records(out: Path) -> list[dict]:
    lines = (out / "requests.jsonl").read_bytes().splitlines()
    return [r for r in map(json.loads, lines) if r.get("phase") == "profiled"]


def read_clock(out: Path) -> ClientClock:
    """The client clock the profiled window was read on (save_clock)."""
    return ClientClock.from_dict(json.loads((out / CLOCK_FILE).read_text()))


def tail_of(traces: Sequence[Path], records: list[dict], clock: ClientClock,
            out: Optional[Path], rec: Recorder, quiet: bool = False,
            threshold_ms: Optional[float] = None, breakdown: Optional[Path] = None
            ) -> dict[str, float]:
    """The tail by cause (module docstring); {} with a tag saying why where it cannot be.
    out: the run folder (its breakdown/ read, tail/ written); None: figures only (`k25exp
    analyze --tail` without --out). quiet: no table on stdout; threshold_ms: the tail is the
    gaps above it (an SLO) instead of the p99; breakdown: the folder with the breakdown's
    steps_<rank>.csv (default out/breakdown, where the profile runner writes it)."""
    try:
        # the macro's reference (level_figures): a step without prefills where steps shared them
        ok = [r for r in records if r.get("ok")]
        stalls.mark(records, step_s=stall_reference(records, None, decode_prefills(ok)))
        trace = read_trace(lowest_rank(traces))
        steps, offset = engine_steps(trace), trace.clock_offset_ns
        del trace  # its events: only the steps are needed from here
        j = join(steps, records, clock)
        t = tail(j, threshold_ms)
        # what grew in a slow token's step, where the breakdown analysed it
        if out is None:
            metrics = {**t.metrics(), **j.alignment.metrics()}
        else:
            found = sorted((breakdown or out / "breakdown").glob("steps_rank*.csv"),
                           key=lambda p: int(re.sub(r"\D", "", p.stem) or 1 << 30))
            # the lowest rank's file whose steps are this trace's (a reused --out folder may
            # hold another trace's: its starts match none)
            cats = next((c for f in found if (c := step_categories(f, offset, steps))), {})
            metrics = write_tail(t, out / "tail", categories=cats)
        by_trace = {(g.gap.request, g.gap.chunk): g.cause for g in t.gaps}
        fit = decode_prefills(records)
        ct = client_tail(records, t.threshold_ms, fit.get("prefill_shared_us_per_token"))
        if ct is not None:
            metrics.update(ct.metrics())
            hit, of = agreement(ct, by_trace)
            if of:
                metrics["tail_client.agree_pct"] = 100.0 * hit / of
                metrics["tail_client.agree_n"] = float(of)
    except (ValueError, OSError) as e:  # a trace without steps, records it cannot read
        log.warning("no ITL tail by cause: %s", e)
        rec.set_tags({"tail.skipped": f"{type(e).__name__}: {e}"[:500]})
        return {}
    al = j.alignment
    rec.set_tags({"tail.note": "gaps of the profiled window, under the profiler; whether a "
                  "request was in a step is inferred (no request ids in the trace)",
                  **({"clock.note": al.note[:500]} if al.note else {}),
                  **({"tail.notes": "; ".join(t.notes)[:500]} if t.notes else {})})
    rec.log_metrics(metrics)
    if not quiet:
        print(causes_table(t), flush=True)
    log.info("clock: trace − client within [%.3f, %.3f] ms (shift %.3f ms); the tail's named "
             "causes hold %s %%", al.lo_ms, al.hi_ms, al.shift_ms,
             f"{t.caused_pct():.1f}" if t.caused_pct() is not None else "n/a")
    return metrics
