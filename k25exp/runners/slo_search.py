"""slo_search: the highest load whose latencies meet an SLO, on one server start.

Each probe is one macro level (the macro runner, called with that single level: the server is
found by its launch key and reused, so only the first probe may start it), logged as a child
run: a request rate (open loop), a concurrency (closed loop), a trace's speedup (load=trace:
the trace replayed at its times / x) or a number of multi-turn sessions in flight
(load=sessions with search_over=concurrency: the question a chat service asks, how many
conversations it holds within the SLO). A probe meets the SLO when the experiment's percentile
of every SLO metric is at or below its bound and the level is valid (no client lag, no
delivery stall, rate kept). A sessions probe's percentile is over every turn of its sessions
together, each turn's TTFT and E2E from its own scheduled send (the end of the answer before
it plus the think time: the think time is the user's, never the server's); its per-turn
TTFTs are in the probe's run (turn<k>_ttft_ms_*).
Bracketing: from `start`, double while probes meet (until one fails or `highest`), or halve
while they fail (until one meets or `lowest`); then bisection between the highest meeting and
the lowest failing load, until (fail − pass) / pass <= tolerance (rates) or fail − pass <= 1
(concurrency), or max_probes. No probe meeting the SLO ends the job failed, saying so.

Artifacts: probes.txt/.csv (every probe in order), plots/probes.png, probe<k>/ (each probe's
macro files).
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from pathlib import Path
from typing import Optional

from k25exp import plots, tables
from k25exp.config.experiments import SloSearchConfig
from k25exp.config.schema import K25Config
from k25exp.runners import macro
from k25exp.tracking.recorder import MemoryRecorder, Recorder

log = logging.getLogger(__name__)

# SLO key → the level figure it is judged on (TTFT and E2E from the scheduled send)
FIGURE = {"ttft_ms": "ttft_sched_ms", "tpot_ms": "tpot_ms", "e2e_ms": "e2e_sched_ms"}


class NoLoadMeetsSlo(RuntimeError):
    pass


def probe_figure(figs: dict, key: str, q: int) -> Optional[float]:
    return figs.get(f"{FIGURE[key]}_p{q}")


def verdict(figs: dict, slo: dict, q: int) -> tuple[bool, str]:
    """(meets, why not) for one probe's level figures."""
    why = []
    for k, bound in slo.items():
        v = probe_figure(figs, k, q)
        if v is None:
            why.append(f"no p{q} {k} (n={figs.get(FIGURE[k] + '_n', 0):.0f})")
        elif v > bound:
            why.append(f"p{q} {k} {v:.1f} > {bound:g}")
    if not figs.get("valid", 0):
        why.append("level invalid")
    return not why, "; ".join(why)


def bracket(history: list[tuple[float, bool]]) -> tuple[Optional[float], Optional[float]]:
    """(the highest load that met, the lowest load above it that did not): None where there is
    none (with nothing met, the lowest load that did not)."""
    passed = max((x for x, m in history if m), default=None)
    failed = min((x for x, m in history if not m and (passed is None or x > passed)), default=None)
    return passed, failed


class Search:
    """Bracketing then bisection over a load axis; `probe(x)` says whether x meets."""

    def __init__(self, exp: SloSearchConfig):
        self.exp = exp
        self.integer = exp.search_over == "concurrency"

    def _round(self, x: float) -> float:
        return float(max(1, round(x))) if self.integer else x

    def next(self, history: list[tuple[float, bool]]) -> Optional[float]:
        """The next load to probe, or None when the search is done."""
        e = self.exp
        if len(history) >= e.max_probes:
            return None
        if not history:
            return self._round(e.start)
        passed, failed = bracket(history)
        if passed is None:  # nothing met yet: halve
            x = self._round(failed / 2)
            return x if x >= e.lowest and x < failed else None
        if failed is None:  # everything met: double
            x = self._round(passed * 2)
            return x if x <= e.highest and x > passed else None
        if self.done(passed, failed):
            return None
        x = self._round((passed + failed) / 2) if not self.integer else float(
            math.floor((passed + failed) / 2))
        return x if passed < x < failed else None

    def done(self, passed: float, failed: float) -> bool:
        """Whether the bracket [passed, failed) is narrow enough to stop."""
        if self.integer:
            return failed - passed <= 1
        return (failed - passed) / passed <= self.exp.tolerance


def run(cfg: K25Config, out: Path, rec: Recorder) -> dict[str, float]:
    exp: SloSearchConfig = cfg.experiment
    unit = {"rate": "req/s", "speedup": "speedup"}.get(
        exp.search_over, "sessions" if exp.load == "sessions" else "concurrency")
    slo = exp.slo.bounds()
    answer_key = f"max_{exp.search_over}_meeting_slo"
    rec.set_tags({"slo_search.slo": ", ".join(f"p{exp.percentile} {k} <= {v:g}" for k, v in slo.items()),
                  "slo_search.method": f"bracketing x2 from {exp.start:g} {unit}, then bisection to "
                  + ("1" if exp.search_over == "concurrency" else f"{exp.tolerance:.0%}")})
    search, history, rows = Search(exp), [], []
    make_child = getattr(rec, "child", None)
    while (x := search.next(history)) is not None:
        k = len(history)
        e = replace(exp, request_rate=[x], concurrency=[int(x)], trace=replace(exp.trace, speedup=[x]),
                    limit_points=None, warmup=exp.warmup if k == 0 else 0, single_stream_requests=0)
        name = f"probe {k}: {unit} {x:g}"
        sub = make_child(name, {"k25exp.experiment": "slo_search", "slo_search.probe": str(k)}) \
            if make_child else MemoryRecorder()
        capture = _Keep(sub)
        status = "FAILED"
        try:
            macro.run(replace(cfg, experiment=e), out / f"probe{k}", capture)
            status = "FINISHED"
        finally:
            if make_child and hasattr(sub, "end"):
                sub.end(status)
        figs = capture.level
        meets, why = verdict(figs, slo, exp.percentile)
        history.append((x, meets))
        row = [k, x, "yes" if meets else "no"] + [probe_figure(figs, key, exp.percentile)
                                                   for key in sorted(slo)] + [
            figs.get("achieved_rate_req_s"), figs.get("output_tok_s"), why or None]
        rows.append(row)
        rec.log_metrics({"probe_load": x, "probe_meets": float(meets)} | {
            f"probe_p{exp.percentile}_{key}": v for key, v in
            ((key, probe_figure(figs, key, exp.percentile)) for key in slo) if v is not None},
            step=k)
        log.info("%s: %s%s", name, "meets the SLO" if meets else "misses", f" ({why})" if why else "")

    cols = [tables.Column("probe", "{}", 6), tables.Column(unit, "{:g}", 12),
            tables.Column("meets", "{}", 6)] + [
        tables.Column(f"p{exp.percentile}_{key}", "{:.1f}", 14) for key in sorted(slo)] + [
        tables.Column("sent req/s", "{:.3f}", 11), tables.Column("tok/s", "{:.1f}", 9),
        tables.Column("why not", "{}", 40)]
    print(tables.write(out / "probes", cols, rows,
                       f"slo_search over {unit}: p{exp.percentile} of "
                       + ", ".join(f"{k} <= {v:g}" for k, v in slo.items())), flush=True)
    _plot(out, exp, history, rows)
    passed, failed = bracket(history)
    summary = {"probes": float(len(history))}
    if passed is None:
        rec.log_metrics(summary)
        tried = ", ".join(f"{x:g}" for x, _ in history)
        raise NoLoadMeetsSlo(f"no probed {unit} met the SLO (p{exp.percentile} of "
                             + ", ".join(f"{k} <= {v:g}" for k, v in slo.items())
                             + f"); tried {tried}, "
                             + (f"then stopped at experiment.max_probes={exp.max_probes}"
                                if len(history) >= exp.max_probes else
                                f"down to experiment.lowest={exp.lowest:g}")
                             + f": {rows[-1][-1]}")
    summary[answer_key] = passed
    if failed is not None:
        summary["lowest_failing_load"] = failed
    rec.log_metrics(summary)
    rec.set_tags({"slo_search.answer": answer(exp, history, unit)})
    return summary


def answer(exp: SloSearchConfig, history: list[tuple[float, bool]], unit: str) -> str:
    """The answer in words: the highest load that met the SLO, and why the search stopped
    there (a miss above it, the highest allowed load, or the probe budget), with any probe
    below it that missed (latencies that are not monotonic in load: a noisy answer)."""
    passed, failed = bracket(history)
    out_of_probes = len(history) >= exp.max_probes
    if failed is None:
        why = (f"every probe met it; the search stopped at experiment.max_probes={exp.max_probes} "
               "while still doubling" if out_of_probes and passed * 2 <= exp.highest else
               f"every probe up to experiment.highest={exp.highest:g} met it")
    else:
        why = f"the next probe up, {failed:g}, missed"
        if out_of_probes and not Search(exp).done(passed, failed):
            why += (f"; the search stopped at experiment.max_probes={exp.max_probes} before "
                    "narrowing to its tolerance")
    below = sorted(x for x, m in history if not m and x < passed)
    if below:
        why += f"; probes below it missed too: {', '.join(f'{x:g}' for x in below)}"
    return f"{passed:g} {unit} ({why})"


class _Keep(MemoryRecorder):
    """Passes a probe's figures on to its run and keeps its one level's figures."""

    def __init__(self, inner: Recorder):
        super().__init__()
        self.inner = inner
        self.level: dict = {}

    def log_metrics(self, metrics, step=None) -> None:
        super().log_metrics(metrics, step)
        self.inner.log_metrics(metrics, step)
        if step is not None:
            self.level.update(metrics)

    def set_tags(self, tags) -> None:
        super().set_tags(tags)
        self.inner.set_tags(tags)


def _plot(out: Path, exp: SloSearchConfig, history: list, rows: list) -> None:
    if not history:
        return
    key = sorted(exp.slo.bounds())[0]
    rows = sorted(rows, key=lambda r: r[1])
    xs = [r[1] for r in rows]
    plots.sweep(out / "plots" / "probes.png", xs, {
        f"p{exp.percentile} {key}": [r[3] for r in rows],
        "SLO": [exp.slo.bounds()[key]] * len(xs)},
        exp.search_over, f"{key.replace('_ms', '')} (ms)",
        f"SLO search: p{exp.percentile} {key} per probe")
