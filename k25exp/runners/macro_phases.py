"""One phase of a macro job (warm-up, single stream, one level of the sweep): its requests,
sent by the client, and its figures, with the server's view merged and the records written.

A phase's raw result is the client's: the request records, wall and CPU time, the event
loop's lag. A level whose load one event loop cannot keep up with is sent by several client
processes as one load (experiment.client_processes; k25exp.load.shards), its records merged
into the same requests.jsonl and figures, the client's health judged per process. `figures()` turns it into the level's figures (k25exp.load.level_figures) once the
server's own counters for it are known, and only then writes its records to requests.jsonl:
no disk I/O in the event loop while a phase is timed.
"""

from __future__ import annotations

import gc
import logging
import math
import signal
from typing import BinaryIO, Callable, Optional

import orjson

from k25exp.config.experiments import MacroConfig
from k25exp.load.arrivals import rate_of, schedule
from k25exp.load.client import CompletionClient, run_level, run_open_level
from k25exp.serving.endpoint import Connection
from k25exp.load.level_figures import (goodput, level_figures, rate_figures, send_lag_figures,
                                       tpot_gap_pct)
from k25exp.load.progress import Progress
from k25exp.load.sessions import SessionPlan, run_session_level
from k25exp.load.shards import ShardPool, Prompts, auto_processes
from k25exp.load.stalls import StallRule
from k25exp.load.tail_client import client_tail
from k25exp.telemetry import host_cpu
from k25exp.telemetry.procs import served_engine

log = logging.getLogger(__name__)


def completed(res: dict) -> int:
    """Requests of a phase that completed."""
    return sum(1 for r in res["records"] if r["ok"])


class Phases:
    """Runs a job's phases (warm-up, single stream, each level) against one server, through one
    client, into one requests.jsonl: `run` one, then `figures` of it (which writes it)."""

    def __init__(self, exp: MacroConfig, conn: Connection, client: CompletionClient,
                 prompt: Callable[[int], object], jsonl: BinaryIO, progress: Progress, t0: float,
                 client_kw: Optional[dict] = None):
        self.exp, self.conn, self.client, self.prompt = exp, conn, client, prompt
        self.client_kw = client_kw or {}  # CompletionClient's arguments, for client processes
        self.jsonl, self.progress, self.t0 = jsonl, progress, t0
        self.rule = StallRule(exp.stall_burst_frac, exp.stall_min_chunks, exp.stall_min_gap_ms)
        self.killed = False  # the fault hook has fired (it fires once per job)
        self.single_tpot_s: Optional[float] = None  # the single stream's, for auto processes
        self.pool: Optional[ShardPool] = None  # client processes, started when first needed
        # the processes whose CPU time is the measured system's (telemetry.host_cpu): this
        # job's tree, and the engine's when the job attached to a server on this host
        self.own_roots = host_cpu.own_roots(
            served_engine(conn.base_url)[0] if conn is not None and conn.managed is None else ())

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def processes(self, c: int, n: Optional[int], rate: Optional[float],
                  output_tokens: Optional[float] = None) -> int:
        """Client processes for a phase: experiment.client_processes, or auto (shards'
        rule), never more than the phase has streams (closed) or requests (open: `rate` set,
        inf for a schedule without one)."""
        exp = self.exp
        # every process needs a stream (closed) or a slot of the cap and a request (open)
        most = c if rate is None else min(n or exp.max_in_flight(), exp.max_in_flight())
        if exp.client_processes:
            return max(1, min(exp.client_processes, most))
        return min(most, auto_processes(c if rate is None else exp.max_in_flight(),
                                        self.single_tpot_s, rate, output_tokens or exp.output_tokens))

    def dead(self) -> bool:
        return not self.conn.alive()

    async def run(self, name: str, level: float, c: int, n: Optional[int],
                  duration: Optional[float], first_prompt: int, rate: Optional[float] = None,
                  due=None, prompt: Optional[Callable[[int], object]] = None,
                  sessions: Optional[SessionPlan] = None) -> dict:
        """One phase: a closed loop of c workers, an open loop at `rate` req/s, the
        schedule `due` (a trace's: s from the start, request i from prompt(i); default the
        job's prompts), or n multi-turn `sessions` from session first_prompt on, c in flight
        (each turn waits for its session's last answer; over client processes as a closed
        loop is, k25exp.load.shards.run_sessions); its raw result."""
        exp, errors, done = self.exp, 0, 0
        source = prompt or self.prompt
        what = (f"x{level:g}" if due is not None else f"{rate:g}/s" if rate else f"c={c}")
        task = self.progress.task(f"{name} {what}", n * sessions.turns if sessions and n else n)
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
            return source(first_prompt + i)

        out_mean = None
        if due is not None:  # a trace: its own rate (none: all at once) and output lengths
            rate = rate_of(due) or float("inf")
            out_mean = sum(source(first_prompt + i)[2] for i in range(len(due))) / max(len(due), 1)
        elif rate is not None:
            due = schedule(rate, exp.burstiness, exp.seed + int(level * 1000), n, duration,
                           exact=exp.exact_rate and n is not None)
        P = self.processes(c, n, rate, out_mean)
        # No garbage collection while a level runs: a full pass over the half million objects
        # transformers leaves behind stalls the event loop for 0.2-1 s (seen as client lag);
        # reference counting frees the level's garbage, the rest goes after.
        if P == 1:  # a lane per stream before the clock starts (~0.13 ms each to build)
            self.client.prepare(c if rate is None else min(len(due), exp.max_in_flight()))
        gc.disable()
        try:
            if P > 1 and sessions is not None:
                res = await self._shards().run_sessions(
                    sessions, phase=name, level=level, concurrency=c, n_sessions=n,
                    first_session=first_prompt, t0=self.t0, on_record=on_record,
                    should_stop=self.dead, processes=P,
                    ramp_s=exp.ramp_s if name == "sweep" else 0.0)
            elif P > 1:
                res = await self._run_processes(P, name, level, c, n, duration, first_prompt,
                                                due, on_record, source)
            elif sessions is not None:
                res = await run_session_level(self.client, sessions, phase=name, level=level,
                                              concurrency=c, n_sessions=n, t0=self.t0,
                                              first_session=first_prompt, on_record=on_record,
                                              should_stop=self.dead,
                                              ramp_s=exp.ramp_s if name == "sweep" else 0.0)
            elif due is not None:
                res = await run_open_level(self.client, nth_prompt, phase=name, level=level,
                                           due_s=due, max_tokens=exp.output_tokens, t0=self.t0,
                                           max_concurrency=exp.max_in_flight(),
                                           input_tokens=exp.input_tokens, on_record=on_record,
                                           should_stop=self.dead)
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
        if due is not None:  # a trace's target is its own rate (none: every request at once)
            res["rate"] = rate if math.isfinite(rate) else None
            res["scheduled"] = True
        for why in res.get("client_failures", ()):
            log.warning("%s %s: %s", name, what, why)
        return res

    async def _run_processes(self, P: int, name: str, level: float, c: int, n: Optional[int],
                             duration: Optional[float], first_prompt: int, due, on_record,
                             source) -> dict:
        """The phase over P client processes (k25exp.load.shards): each gets the prompts it
        may send (a count: the texts; a duration: the prompt builder), one start time."""
        exp = self.exp
        self._shards()
        count = n if due is None else len(due)
        prompts = (Prompts(builder=source, first=first_prompt) if count is None else
                   Prompts({i: source(first_prompt + i) for i in range(count)}))
        common = dict(phase=name, level=level, max_tokens=exp.output_tokens, t0=self.t0,
                      input_tokens=exp.input_tokens, on_record=on_record,
                      should_stop=self.dead, processes=P)
        if due is not None:
            return await self.pool.run_open(prompts, due_s=due,
                                            max_concurrency=exp.max_in_flight(), **common)
        return await self.pool.run_closed(prompts, concurrency=c, n_requests=n,
                                          duration_s=duration,
                                          ramp_s=exp.ramp_s if name == "sweep" else 0.0, **common)

    def _shards(self) -> ShardPool:
        """The job's client processes, started when a phase first needs them."""
        if self.pool is None:
            self.pool = ShardPool(self.client_kw, self.exp.client_event_loop)
        return self.pool

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
        if res.get("rate") is not None or res.get("scheduled"):  # sent on a schedule: how closely
            figs.update(send_lag_figures(res["records"]))
        figs.update(goodput(res["records"], res["wall_s"], exp.slo.bounds()))
        # the ITL tail by cause, as far as the records tell without a trace (stalls marked above)
        ct = client_tail(res["records"], prefill_us_per_token=figs.get("prefill_shared_us_per_token"))
        if ct is not None:
            figs.update(ct.metrics())
        self.write(res)
        return figs

    def repeat_figures(self, reps: list[dict]) -> list[dict]:
        """Each repeat's own figures (client view only), for the spread between repeats."""
        return [self._client_figures(x) for x in reps]

    def _client_figures(self, res: dict, step_ref_s: Optional[float] = None) -> dict:
        exp = self.exp
        return level_figures(res["records"], res["wall_s"], res["cpu_s"], res["loop_lag_ms"],
                             exp.max_client_lag_ms, exp.output_tokens, exp.input_tokens,
                             self.rule, step_ref_s=step_ref_s,
                             loop_lag_by_process=res.get("loop_lag_ms_by_process"),
                             client_failures=res.get("client_failures", ()),
                             client_processes=res.get("client_processes"),
                             validity=exp.validity, lag_reference=exp.lag_reference(),
                             spans=[(x["start"] - self.t0, x["start"] - self.t0 + x["wall_s"])
                                    for x in res.get("repeats", [res]) if "start" in x])
