"""One phase of load sent by several client processes (experiment.client_processes).

One event loop keeps up with a few thousand streamed chunks a second (measured:
benchmarks.client_capacity); a GPU serving 256 streams sends more. So the load is split
over P worker processes, each with its own event loop and connections, and stays ONE load:
  closed loop  the C workers are dealt round-robin (shard p runs workers p, p + P, ...; a
               ramp starts worker w at w × ramp_s / C whichever process runs it), and every
               worker takes its next request index from one counter in shared memory, so
               "n requests, each sent when its worker's last one ended" holds across processes;
  sessions     as the closed loop, a session claimed from the one counter and all its turns
               sent by the process that claimed it (k25exp.load.sessions, messages shipped built);
  open loop    the one drawn schedule is split by request index (shard p sends requests
               p, p + P, ...) at their due times; a cap (max_concurrency) is split into P
               equal shares, one per process (a request may then wait for its own shard's
               slot while another shard has one free: the tag macro.client says so);
and every process starts from one start time (perf_counter, one clock for every process on
the machine), handed out after each has its share in hand, so due times and ramps are one
schedule's.

Each process streams its records back as they complete (so a process that dies loses only
the requests it had in flight), and reports its own CPU time and event-loop lag: the
client's health is judged per process (the busiest one's CPU, the laggiest one's loop),
never averaged away. A process that fails is reported: the requests it had claimed and not
finished become failed records naming it, the phase's `client_failures` counts it, and the
next phase starts a fresh one.

Long because the parent's side (one schedule, merging, failures) and the child process's
side of one protocol are read together.
"""

from __future__ import annotations

import asyncio
import gc
import math
import multiprocessing as mp
import os
import signal
import time
import traceback
from typing import Callable, Optional, Sequence

START_MARGIN_S = 0.1  # from handing out the start time to the start: every process is waiting
READY_TIMEOUT_S = 120.0  # a process's start (imports) and its share of prompts


def split(total: int, parts: int) -> list[int]:
    """`total` in `parts` near-equal shares, the larger first: split(10, 4) = [3, 3, 2, 2]."""
    return [total // parts + (k < total % parts) for k in range(parts)]


class SharedCounter:
    """The closed loop's next request index, in shared memory (k25exp.load.client.Counter's
    interface): claimed under a lock, a few microseconds per request."""

    def __init__(self, ctx) -> None:
        self._v = ctx.Value("q", 0)

    @property
    def value(self) -> int:
        return self._v.value

    def reset(self) -> None:
        with self._v.get_lock():
            self._v.value = 0

    def claim(self, limit: Optional[int]) -> Optional[int]:
        with self._v.get_lock():
            i = self._v.value
            if limit is not None and i >= limit:
                return None
            self._v.value = i + 1
            return i


class Prompts:
    """A shard's prompts: texts by request index (a count-limited phase ships exactly those)
    or the prompt builder itself (a duration-limited phase cannot know how many)."""

    def __init__(self, texts: Optional[dict] = None, builder=None, first: int = 0):
        self.texts, self.builder, self.first = texts, builder, first

    def __call__(self, i: int) -> str:
        if self.texts is not None:
            return self.texts[i]
        return self.builder(self.first + i)


def _serve(conn, counter: SharedCounter, stop, client_kw: dict, loop_name: str) -> None:
    """A worker process: runs the phases it is sent, one at a time, until told to close."""
    from k25exp.load import loops
    from k25exp.load.client import CompletionClient, run_level, run_open_level

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    loop = loops.new_event_loop(loop_name)
    asyncio.set_event_loop(loop)
    client = CompletionClient(**client_kw)
    loop.run_until_complete(client.warm())
    gc.collect()
    gc.freeze()  # the imports' objects are never scanned again
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "close":
                break
            spec = msg[1]
            client.prepare(spec["lanes"])
            conn.send(("ready",))
            go = conn.recv()
            if go[0] != "go":
                continue  # the phase was called off before it started
            try:
                kw = dict(phase=spec["phase"], level=spec["level"], max_tokens=spec["max_tokens"],
                          t0=spec["t0"], input_tokens=spec["input_tokens"],
                          on_record=lambda r: conn.send(("rec", r)),
                          shard=spec["shard"],
                          should_stop=lambda: bool(stop.value), start_at=go[1])
                gc.disable()  # as in the parent: no collection pauses while timed
                try:
                    if spec["kind"] == "sessions":
                        from k25exp.load.sessions import run_session_level

                        kw.pop("max_tokens"), kw.pop("input_tokens")  # the plan holds both
                        res = loop.run_until_complete(run_session_level(
                            client, spec["plan"], concurrency=spec["concurrency"],
                            n_sessions=spec["n_sessions"], first_session=spec["first_session"],
                            workers=spec["workers"], counter=counter, ramp_s=spec["ramp_s"],
                            **kw))
                    elif spec["kind"] == "open":
                        res = loop.run_until_complete(run_open_level(
                            client, spec["prompts"], due_s=spec["due_s"], indices=spec["indices"],
                            max_concurrency=spec["max_concurrency"], **kw))
                    else:
                        res = loop.run_until_complete(run_level(
                            client, spec["prompts"], concurrency=spec["concurrency"],
                            workers=spec["workers"], counter=counter,
                            n_requests=spec["n_requests"], duration_s=spec["duration_s"],
                            ramp_s=spec["ramp_s"], **kw))
                finally:
                    gc.enable()
                res.pop("records")  # already sent, one by one
                res.pop("due_s", None)
                conn.send(("done", res))
            except Exception:
                conn.send(("error", traceback.format_exc(limit=8)))
            gc.collect()
    except (EOFError, OSError, KeyboardInterrupt):
        pass  # the parent has gone
    finally:
        loop.run_until_complete(client.aclose())
        loop.close()


class _Shard:
    def __init__(self, k: int) -> None:
        self.k, self.proc, self.conn = k, None, None
        self.state, self.result, self.error = "idle", None, None
        self.records: list[dict] = []

    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()


def _blocking(conn):
    """The pipe made blocking again: the event loop's add_reader leaves it non-blocking
    (asyncio's and uvloop's alike), and a message larger than the socket buffer is then written
    or read half-way, with BlockingIOError (a phase's prompts on send: seen on an H200, c = 128
    after 1, 8, 32; a long request's record on receive, which read as the process failing)."""
    os.set_blocking(conn.fileno(), True)
    return conn


def _send(conn, msg) -> None:
    _blocking(conn).send(msg)


def _dealt(common: dict, concurrency: int, P: int) -> list[dict]:
    """One spec per process, the `concurrency` workers dealt round-robin (worker w to process
    w mod P): a closed loop's or sessions' shards."""
    return [dict(common, shard=k, workers=list(range(k, concurrency, P)),
                 lanes=len(range(k, concurrency, P))) for k in range(P)]


class ShardPool:
    """Worker processes, started when a phase first needs them (a spawn takes a second or two
    of imports) and kept for the job's phases; `run_closed` / `run_open` run one phase over the
    first `processes` of them."""

    def __init__(self, client_kw: dict, loop_name: str = "auto"):
        # spawn, not fork: the parent has threads (the progress bar's, tokenizers') whose locks
        # a forked child could inherit held
        self.ctx = mp.get_context("spawn")
        self.client_kw, self.loop_name = client_kw, loop_name
        self.counter = SharedCounter(self.ctx)
        self.stop = self.ctx.Value("b", 0, lock=False)
        self.shards: list[_Shard] = []
        self.starts = 0  # processes started, the replacements of failed ones included

    def _ensure(self, processes: int) -> None:
        while len(self.shards) < processes:
            self.shards.append(_Shard(len(self.shards)))
        for s in self.shards[:processes]:
            if s.alive():
                continue
            parent, child = self.ctx.Pipe()
            s.proc = self.ctx.Process(target=_serve, name=f"k25exp-client-{s.k}", daemon=True,
                                      args=(child, self.counter, self.stop, self.client_kw,
                                            self.loop_name))
            s.proc.start()
            child.close()
            s.conn = parent
            self.starts += 1

    def close(self) -> None:
        for s in self.shards:
            if s.alive():
                try:
                    _send(s.conn, ("close",))
                except OSError:
                    pass
        for s in self.shards:
            if s.proc is not None:
                s.proc.join(5)
                if s.proc.is_alive():
                    s.proc.kill()
                    s.proc.join(5)
                s.conn.close()
            s.proc = None

    def __enter__(self) -> "ShardPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def run_closed(self, prompts: Prompts, *, phase: str, level: float, concurrency: int,
                         max_tokens: int, t0: float, n_requests: Optional[int],
                         duration_s: Optional[float], input_tokens: Optional[int] = None,
                         ramp_s: float = 0.0, on_record: Optional[Callable[[dict], None]] = None,
                         should_stop: Optional[Callable[[], bool]] = None,
                         processes: int = 2) -> dict:
        """run_level's closed loop of `concurrency` workers, over `processes` processes."""
        P = min(processes, concurrency)
        common = dict(kind="closed", phase=phase, level=level, max_tokens=max_tokens, t0=t0,
                      input_tokens=input_tokens, concurrency=concurrency, n_requests=n_requests,
                      duration_s=duration_s, ramp_s=ramp_s, prompts=prompts)
        specs = _dealt(common, concurrency, P)
        res = await self._run(specs, on_record, should_stop)

        def lost(k: int, reported: set) -> list[int]:
            # every index claimed and not reported once the others are done was the failed
            # processes' (in flight when they died)
            return [i for i in range(self.counter.value) if i not in reported]

        self._account(res, specs, lost, phase, level, max_tokens, input_tokens, prompts)
        return res

    async def run_sessions(self, plan, *, phase: str, level: float, concurrency: int,
                           n_sessions: int, first_session: int, t0: float, ramp_s: float = 0.0,
                           on_record: Optional[Callable[[dict], None]] = None,
                           should_stop: Optional[Callable[[], bool]] = None,
                           processes: int = 2) -> dict:
        """run_session_level's `concurrency` sessions in flight, over `processes` processes:
        workers dealt round-robin as in run_closed, each session claimed from the one shared
        counter, so turns that end on one step are sent by several event loops, not queued
        behind one. `plan`: a SessionPlan (its sessions are shipped built)."""
        P = min(processes, concurrency)
        shipped = plan.shipped(range(first_session, first_session + n_sessions))
        common = dict(kind="sessions", phase=phase, level=level, max_tokens=0, t0=t0,
                      input_tokens=None, concurrency=concurrency, n_sessions=n_sessions,
                      first_session=first_session, ramp_s=ramp_s, plan=shipped)
        specs = _dealt(common, concurrency, P)
        res = await self._run(specs, on_record, should_stop)
        # a failed process's session in flight ends there (its history is gone): named in
        # client_failures, its unsent turns not made up as records
        self._account(res, specs, lambda k, reported: [], phase, level, 0, None)
        return res

    async def run_open(self, prompts: Prompts, *, phase: str, level: float,
                       due_s: Sequence[float], max_tokens: int, t0: float,
                       max_concurrency: Optional[int] = None,
                       input_tokens: Optional[int] = None,
                       on_record: Optional[Callable[[dict], None]] = None,
                       should_stop: Optional[Callable[[], bool]] = None,
                       processes: int = 2) -> dict:
        """run_open_level's schedule, split by request index over `processes` processes."""
        P = min(processes, len(due_s))
        due = list(map(float, due_s))
        caps = split(max_concurrency, P) if max_concurrency else [None] * P
        if max_concurrency and max_concurrency < P:
            raise ValueError(f"a cap of {max_concurrency} in flight cannot be shared by {P} "
                             "client processes")
        indices = [list(range(k, len(due), P)) for k in range(P)]

        def own(k: int) -> Prompts:  # only the texts shard k sends (a builder is shared whole)
            if prompts.texts is None:
                return prompts
            return Prompts({i: prompts.texts[i] for i in indices[k]})
        specs = [dict(kind="open", shard=k, phase=phase, level=level, max_tokens=max_tokens, t0=t0,
                      input_tokens=input_tokens, prompts=own(k), due_s=due,
                      indices=indices[k], max_concurrency=caps[k],
                      lanes=min(caps[k] or 64, len(indices[k])))
                 for k in range(P)]
        res = await self._run(specs, on_record, should_stop)

        def lost(k: int, reported: set) -> list[int]:
            return [i for i in specs[k]["indices"] if i not in reported]

        self._account(res, specs, lost, phase, level, max_tokens, input_tokens, prompts)
        res["due_s"] = due
        return res

    async def _run(self, specs: list[dict], on_record, should_stop) -> dict:
        self._ensure(len(specs))
        shards = self.shards[:len(specs)]
        loop = asyncio.get_running_loop()
        for s, spec in zip(shards, specs):
            s.state, s.result, s.error, s.records = "sent", None, None, []
            _send(s.conn, ("phase", spec))
        deadline = time.monotonic() + READY_TIMEOUT_S
        for s in shards:  # each answers once it has its share and its lanes
            while s.state == "sent":
                if await loop.run_in_executor(None, s.conn.poll, 0.5):
                    try:
                        msg = s.conn.recv()
                    except (EOFError, OSError):
                        msg = ("gone",)
                    if msg[0] == "ready":
                        s.state = "ready"
                    else:
                        s.state, s.error = "failed", f"exited before the phase began ({msg[0]})"
                elif not s.alive() or time.monotonic() > deadline:
                    s.state = "failed"
                    s.error = ("exited before the phase began (exit code "
                               f"{s.proc.exitcode})" if not s.alive()
                               else f"not ready after {READY_TIMEOUT_S:g} s")
        self.counter.reset()
        self.stop.value = 0
        start_at = time.perf_counter() + START_MARGIN_S
        for s in shards:
            if s.state == "ready":
                _send(s.conn, ("go", start_at))
                s.state = "running"
        done = asyncio.Event()

        def drain(s: _Shard) -> None:
            try:
                while s.state == "running" and s.conn.poll():
                    msg = s.conn.recv()
                    if msg[0] == "rec":
                        s.records.append(msg[1])
                        if on_record:
                            on_record(msg[1])
                    elif msg[0] == "done":
                        s.state, s.result = "done", msg[1]
                    else:
                        s.state, s.error = "failed", msg[1]
            except (EOFError, OSError):
                s.proc.join(1)  # reaped, so its exit code (or signal) can be named
                s.state = "failed"
                s.error = f"exited during the phase (exit code {s.proc.exitcode})"
            if s.state != "running":
                loop.remove_reader(s.conn.fileno())
                if all(x.state != "running" for x in shards):
                    done.set()

        running = [s for s in shards if s.state == "running"]
        for s in running:
            loop.add_reader(s.conn.fileno(), drain, s)
            _blocking(s.conn)  # drain reads only when poll() says a message has begun
        if not running:
            done.set()
        while not done.is_set():
            try:
                await asyncio.wait_for(done.wait(), 0.05)
            except asyncio.TimeoutError:
                pass
            if should_stop and should_stop():
                self.stop.value = 1
            for s in running:
                if s.state == "running" and not s.alive():
                    drain(s)  # what it sent before it died
                    if s.state == "running":
                        loop.remove_reader(s.conn.fileno())
                        s.state = "failed"
                        s.error = f"exited during the phase (exit code {s.proc.exitcode})"
                        if all(x.state != "running" for x in shards):
                            done.set()
        end = time.perf_counter()
        ok = [s.result for s in shards if s.result]
        return {"records": [r for s in shards for r in s.records],
                "wall_s": max([x["end"] for x in ok] + ([end] if len(ok) < len(shards)
                                                        else [])) - start_at,
                # the busiest process's CPU: a level is judged by its most loaded event loop
                "cpu_s": max((x["cpu_s"] for x in ok), default=0.0),
                "cpu_s_total": sum(x["cpu_s"] for x in ok),
                "loop_lag_ms": [v for x in ok for v in x["loop_lag_ms"]],
                "loop_lag_ms_by_process": [x["loop_lag_ms"] for x in ok],
                "client_processes": len(shards),
                "start": start_at, "_shards": shards}

    def _account(self, res: dict, specs: list[dict], lost, phase, level, max_tokens,
                 input_tokens, prompts: Optional[Prompts] = None) -> None:
        """Failed processes: reported, and what they had not finished recorded as failed
        (with the lengths each was to be sent with)."""
        failed = [s for s in res.pop("_shards") if s.state == "failed"]
        res["client_failures"] = [f"client process {s.k} (pid {s.proc.pid if s.proc else '?'}): "
                                  f"{s.error}" for s in failed]
        if not failed:
            return
        from k25exp.load.client import finish, shaped  # the derived fields, as every record has them

        reported = {r["i"] for r in res["records"]}
        for s in failed:
            if s.alive():  # failed but running (a phase that raised): replaced next phase
                s.proc.kill()
                s.proc.join(5)
            for i in lost(s.k, reported):
                reported.add(i)
                _, n_in, n_out = shaped(prompts(i) if prompts else "", input_tokens, max_tokens)
                res["records"].append(finish({  # never sent: no sent_s, end_s
                    "phase": phase, "level": level, "i": i, "worker": None, "shard": s.k,
                    "prompt_tokens_target": n_in, "max_tokens": n_out,
                    "status": None, "chunk_s": [], "chunk_tokens": [], "usage": None,
                    "malformed": 0, "done": False,
                    "error": f"client process {s.k} failed before this request finished: "
                             f"{_last_line(s.error)}"}))


def _last_line(text: Optional[str]) -> str:
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else "no reason given"


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# What auto gives one process, in streamed chunks a second. Measured on this project's 2-core
# development VM (benchmarks.client_capacity: the stub's step engine, 64-token requests,
# uvloop, lanes on k25exp.load.sockets; 2 runs): one process stayed unflagged up to
# 21,700-22,700 chunks/s at C = 128 (CPU 0.74-0.83 of a core) and was flagged at C = 256 from
# 20,400 (CPU 0.93-0.97: 256 requests ending on one step are sent again at once); at 11,500-
# 11,900 it used half a core. 8,000 keeps a process near a third of a core, with room for those
# bursts and for a host whose cores the server's own processes keep busy.
CHUNKS_PER_PROCESS = 8000
STREAMS_PER_PROCESS = 64  # when the load cannot be bounded (no single-stream TPOT)


def auto_processes(concurrency: int, single_tpot_s: Optional[float] = None,
                   rate: Optional[float] = None, output_tokens: int = 0,
                   cpus: Optional[int] = None) -> int:
    """Client processes for a level (experiment.client_processes = 0, auto): enough that each
    gets at most CHUNKS_PER_PROCESS chunks a second of the most the level can stream. A
    closed loop of C streams streams at most C / TPOT(batch 1) chunks a second (a larger
    batch only steps slower): the single-stream phase's TPOT bounds it; without one, C / 64.
    An open loop streams rate × output_tokens once it is in its steady state. Never more
    than half the machine's CPUs (the rest is the server's, on a shared host) nor than C."""
    if rate is not None:
        need = math.ceil(rate * output_tokens / CHUNKS_PER_PROCESS) if math.isfinite(rate) \
            else math.ceil(concurrency / STREAMS_PER_PROCESS)
    elif single_tpot_s:
        need = math.ceil(concurrency / single_tpot_s / CHUNKS_PER_PROCESS)
    else:
        need = math.ceil(concurrency / STREAMS_PER_PROCESS)
    most = max(1, (cpus or available_cpus()) // 2)
    return max(1, min(need, most, concurrency))
