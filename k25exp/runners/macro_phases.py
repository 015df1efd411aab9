"""One phase of a macro job (warm-up, single stream, one level of the sweep): its requests,
sent by the client, and its figures, with the server's view merged and the records written.

A phase's raw result is the client's: the request records, wall and CPU time, the event
loop's lag. `figures()` turns it into the level's figures (k25exp.serving.figures) once the
server's own counters for it are known, and only then writes its records to requests.jsonl:
no disk I/O in the event loop while a phase is timed.
"""

from __future__ import annotations

import gc
import logging
import signal
from typing import BinaryIO, Callable, Optional

import orjson

from k25exp.config.schema import MacroConfig
from k25exp.serving.arrivals import schedule
from k25exp.serving.client import CompletionClient, run_level, run_open_level
from k25exp.serving.endpoint import Connection
from k25exp.serving.figures import goodput, level_figures, rate_figures, tpot_gap_pct
from k25exp.serving.progress import Progress
from k25exp.serving.stalls import StallRule

log = logging.getLogger(__name__)


OPEN_LOOP_CAP = 256  # requests in flight when experiment.max_concurrency is unset: a socket each


def max_in_flight(exp: MacroConfig) -> int:
    """The most requests a phase has in flight: the closed loop's largest concurrency, or the
    open loop's cap (experiment.max_concurrency, else OPEN_LOOP_CAP). The client's connection
    pool is sized above it, so no request waits inside the HTTP library, where the wait would
    land in its TTFT."""
    if exp.load == "open":
        return exp.max_concurrency or OPEN_LOOP_CAP
    return max(exp.concurrency)


def completed(res: dict) -> int:
    """Requests of a phase that completed."""
    return sum(1 for r in res["records"] if r["ok"])


class Phases:
    """Runs a job's phases (warm-up, single stream, each level) against one server, through one
    client, into one requests.jsonl: `run` one, then `figures` of it (which writes it)."""

    def __init__(self, exp: MacroConfig, conn: Connection, client: CompletionClient,
                 prompt: Callable[[int], object], jsonl: BinaryIO, progress: Progress, t0: float):
        self.exp, self.conn, self.client, self.prompt = exp, conn, client, prompt
        self.jsonl, self.progress, self.t0 = jsonl, progress, t0
        self.rule = StallRule(exp.stall_burst_frac, exp.stall_min_chunks, exp.stall_min_gap_ms)
        self.killed = False  # the fault hook has fired (it fires once per job)

    def dead(self) -> bool:
        return not self.conn.alive()

    async def run(self, name: str, level: float, c: int, n: Optional[int],
                  duration: Optional[float], first_prompt: int, rate: Optional[float] = None) -> dict:
        """One phase: a closed loop of c workers, or an open loop at `rate` req/s; its raw result."""
        exp, errors, done = self.exp, 0, 0
        task = self.progress.task(f"{name} " + (f"{rate:g}/s" if rate else f"c={c}"), n)
        f = exp.fault
        kill_here = name == "sweep" and f.kill_server_at_level == level and self.conn.managed

        def on_record(r: dict) -> None:
            nonlocal errors, done
            errors += not r["ok"]
            done += 1
            self.progress.update(task, r, errors)
            if kill_here and not self.killed and done >= f.after_requests:
                self.killed = True  # the fault hook: a crash, as SIGKILL of every process
                log.warning("fault: killing the server at concurrency %d", level)
                self.conn.managed.kill(signal.SIGKILL)

        def nth_prompt(i: int):
            return self.prompt(first_prompt + i)

        # No garbage collection while a level runs: a full pass over the half million objects
        # transformers leaves behind stalls the event loop for 0.2-1 s (seen as client lag);
        # reference counting frees the level's garbage, the rest goes after.
        gc.disable()
        try:
            if rate is not None:
                due = schedule(rate, exp.burstiness, exp.seed + int(level * 1000), n, duration,
                               exact=exp.exact_rate and n is not None)
                res = await run_open_level(self.client, nth_prompt, phase=name, level=level,
                                           due_s=due, max_tokens=exp.output_tokens, t0=self.t0,
                                           max_concurrency=max_in_flight(exp),
                                           input_tokens=exp.input_tokens, on_record=on_record,
                                           should_stop=self.dead)
                res["rate"] = rate
            else:
                res = await run_level(self.client, nth_prompt, phase=name, level=level,
                                      concurrency=c, max_tokens=exp.output_tokens, t0=self.t0,
                                      n_requests=n,
                                      duration_s=duration, input_tokens=exp.input_tokens,
                                      on_record=on_record, should_stop=self.dead,
                                      ramp_s=exp.ramp_s if name == "sweep" else 0.0)
        finally:
            gc.enable()
        gc.collect()
        return res

    def write(self, res: dict) -> None:
        """The phase's records into requests.jsonl, once (after the phase is over)."""
        if not res.get("written"):
            self.jsonl.write(b"".join(orjson.dumps(r) + b"\n" for r in res["records"]))
            self.jsonl.flush()
            res["written"] = True

    def figures(self, res: dict, srv: dict) -> dict:
        """The phase's figures with the server's view merged; marks each record's delivery
        stalls against the engine's own TPOT when the server gave one (delivery cannot
        compress it, unlike the client's, which collapses when every chunk came in a burst),
        else against the level's median request TPOT; then writes the records."""
        exp = self.exp
        step = srv.get("server_tpot_ms_mean")
        figs = self._client_figures(res, step_ref_s=step / 1e3 if step else None)
        figs.update(srv)
        gap = tpot_gap_pct(figs)  # client's TPOT against the server's
        if gap is not None:
            figs["tpot_gap_pct"] = gap
        if res.get("rate") is not None:
            # each repeat against its own schedule; the level keeps the worst one's
            rf = [rate_figures(x["records"], x["due_s"], x["rate"], exp.max_rate_error)
                  for x in res.get("repeats", [res])]
            figs.update(max(rf, key=lambda f: (f["rate_missed"], abs(f.get("rate_error_pct") or 0))))
            figs["valid"] = float(figs["valid"] and not figs["rate_missed"])
        figs.update(goodput(res["records"], res["wall_s"], exp.slo.bounds()))
        self.write(res)
        return figs

    def repeat_figures(self, reps: list[dict]) -> list[dict]:
        """Each repeat's own figures (client view only), for the spread between repeats."""
        return [self._client_figures(x) for x in reps]

    def _client_figures(self, res: dict, step_ref_s: Optional[float] = None) -> dict:
        exp = self.exp
        return level_figures(res["records"], res["wall_s"], res["cpu_s"], res["loop_lag_ms"],
                             exp.max_client_lag_ms, exp.output_tokens, exp.input_tokens,
                             self.rule, step_ref_s=step_ref_s)
