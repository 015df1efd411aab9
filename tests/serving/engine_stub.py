"""A stub of vLLM's engine that steps as vLLM does, writes its steps as a Kineto-style trace,
and takes injected delays: the ground truth for k25exp.traces.token_gaps / tail_causes.

Every step (`EngineStub._engine`): the requests waiting are admitted (their prefill: the step
lasts `prefill_s_per_token` × their prompt tokens longer), the running ones decode; the step
lasts `step_s` (+ the prefill, + an injected slowdown), then each request in it gets its token
(an admitted one its first), written at once unless held; then a host gap of `host_s` (+ an
injected one). The step is recorded as vLLM records it: a host `user_annotation`
`execute_context_{C}({Ct})_generation_{G}({G})` over the forward, a `cpu_op` inside it, a
`gpu_model_runner: sample` scope after it (the tokens are written once it ends), all on the host's
system clock (time.time_ns: Kineto's clock) relative to `baseTimeNanoseconds`.

Injections, by step index (steps counted from the recording's start), `Injection`:
    slow_ms     the step lasts that much longer (a long step of another kind)
    host_ms     a host gap that much longer after it
    skip        (request ordinal, steps): that request is left out of this step and the next
                steps - 1 (its tokens come later)
    hold        (request ordinal, ms): that request's tokens from this step on are held back
                and released in one write that many ms after the step's end (late delivery)
    admit_at    waiting requests are not admitted before step admit_at (a burst of prefills)
A request's ordinal is its arrival order among completions (0, 1, ...).

The stub keeps what it did: `log` (per step: index, start/end ns, admitted and decoding
ordinals), `tokens[ordinal]` (the step of each of the request's tokens), so a test counts the
slow tokens each injection made by hand.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tests.serving.stub_server import StubServer, _answer


@dataclass
class Injection:
    slow_ms: float = 0.0
    host_ms: float = 0.0
    skip: Optional[tuple[int, int]] = None
    hold: Optional[tuple[int, float]] = None
    admit_at: Optional[int] = None


class EngineStub(StubServer):
    def __init__(self, step_s: float = 0.02, prefill_s_per_token: float = 0.0, host_s: float = 0.001,
                 injections: Optional[dict[int, Injection]] = None, trace_dir: Optional[Path] = None,
                 record: bool = True, **kw):
        super().__init__(step_s=step_s, misbehave=False, **kw)
        self.prefill_s_per_token, self.host_s = prefill_s_per_token, host_s
        self.injections = dict(injections or {})
        self.trace_dir = trace_dir
        self.recording = record
        self.events: list[dict] = []
        self.log: list[dict] = []
        self.tokens: dict[int, list[int]] = {}
        self.base_ns = (time.time_ns() // 10**15) * 10**15  # Kineto floors its base likewise
        self._ordinal = 0
        self._step = 0

    def _ev(self, name: str, cat: str, s_ns: int, e_ns: int) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": os.getpid(), "tid": 1,
                            "ts": (s_ns - self.base_ns) / 1e3, "dur": (e_ns - s_ns) / 1e3})

    def trace(self) -> dict:
        return {"schemaVersion": 1, "deviceProperties": [],
                "distributedInfo": {"rank": 0, "world_size": 1},
                "baseTimeNanoseconds": self.base_ns, "traceEvents": list(self.events)}

    def write_trace(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(json.dumps(self.trace()).encode()))
        return path

    async def _respond(self, method, path, body, headers, writer) -> bool:
        if path == "/start_profile" and method == "POST":
            self.events, self.log, self.tokens, self._step = [], [], {}, 0
            self._ordinal, self.recording = 0, True
            _answer(writer, "200 OK", b"", "text/plain")
            return True
        if path == "/stop_profile" and method == "POST":
            self.recording = False
            if self.trace_dir is not None:
                self.write_trace(Path(self.trace_dir) / f"stub_rank0.{time.time_ns()}.pt.trace.json.gz")
            _answer(writer, "200 OK", b"", "text/plain")
            return True
        return await super()._respond(method, path, body, headers, writer)

    def _inj(self, k: int) -> Injection:
        return self.injections.get(k, Injection()) if self.recording else Injection()

    def _skipped(self, o: int, k: int) -> bool:
        return self.recording and any(inj.skip and inj.skip[0] == o and at <= k < at + inj.skip[1]
                                      for at, inj in self.injections.items())

    def _admit_blocked(self, k: int) -> bool:
        return self.recording and any(inj.admit_at is not None and at <= k < inj.admit_at
                                      for at, inj in self.injections.items())

    def _flush(self, s) -> None:
        """A held stream's tokens, released in one write."""
        data, self._pending[s] = b"".join(self._pending[s]), []
        self._hold[s] = 0.0
        if data and not s.writer.transport.is_closing():
            s.writer.write(data)
            s.writes.extend([time.perf_counter()] * data.count(b"data:"))
        if s.i >= s.n and not s.done.done():
            s.done.set_result(None)

    async def _engine(self) -> None:
        self._ord, self._pending, self._hold = {}, {}, {}
        running: list = []
        loop = asyncio.get_running_loop()
        while True:
            if not self._batch and not running:
                self._wake.clear()
                await self._wake.wait()
            k = self._step
            inj = self._inj(k)
            # a new list: arrivals during the step join the next one, not this one
            admit, self._batch = ([], self._batch) if self._admit_blocked(k) else (self._batch, [])
            for s in admit:
                self._ord[s], self._pending[s], self._hold[s] = self._ordinal, [], 0.0
                self._ordinal += 1
            members = [s for s in running if not self._skipped(self._ord[s], k)]
            ctx_tokens = sum(s.pt for s in admit)
            t0_ns, t0 = time.time_ns(), time.perf_counter()
            await asyncio.sleep(max(0.0, t0 + self.step_s + self.prefill_s_per_token * ctx_tokens
                                    + inj.slow_ms / 1e3 - time.perf_counter()))
            t1_ns = time.time_ns()
            t2_ns = t1_ns + 20_000  # the sampler's scope; the tokens leave after it, as vLLM's do
            while time.time_ns() < t2_ns:
                pass
            for s in admit + members:
                o = self._ord[s]
                self.tokens.setdefault(o, []).append(k)
                tok = self._token(s.pt, s.i, s.ids)
                s.i += 1
                if inj.hold and inj.hold[0] == o:
                    self._hold[s] = 1.0
                    loop.call_later(inj.hold[1] / 1e3, self._flush, s)
                if self._hold[s]:
                    self._pending[s].append(tok)
                    continue
                if s.writer.transport.is_closing():
                    if not s.done.done():
                        s.done.set_exception(ConnectionResetError("client gone"))
                    continue
                s.writer.write(tok)
                s.writes.append(time.perf_counter())
                if s.i >= s.n and not s.done.done():
                    s.done.set_result(None)
            if self.recording:
                name = (f"execute_context_{len(admit)}({ctx_tokens})_generation_{len(members)}"
                        f"({len(members)})")
                self._ev(name, "user_annotation", t0_ns, t1_ns)
                self._ev("aten::mm", "cpu_op", t0_ns + 1000, t1_ns - 1000)
                self._ev("gpu_model_runner: sample", "user_annotation", t1_ns, t2_ns)
                self.log.append({"step": k, "start_ns": t0_ns, "end_ns": t1_ns,
                                 "admitted": [self._ord[s] for s in admit],
                                 "decoded": [self._ord[s] for s in members]})
            running = [s for s in running + admit if s.i < s.n and not s.done.done()]
            self._step += 1
            await asyncio.sleep(self.host_s + inj.host_ms / 1e3)


class EngineThread:
    """The engine stub on its own event loop in a thread (as stub_server.StubThread)."""

    def __init__(self, **kw):
        import threading

        self.loop = asyncio.new_event_loop()
        self.stub = EngineStub(**kw)
        self._t = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> EngineStub:
        self._t.start()
        asyncio.run_coroutine_threadsafe(self.stub.start(), self.loop).result(10)
        return self.stub

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.stub.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._t.join(5)
