"""The load generator: streaming OpenAI completions over one httpx.AsyncClient.

One event loop, one connection pool (connections are reused across requests), one request
per worker at a time (closed loop): a level of concurrency C runs C workers, each sending its
next request as soon as its previous one finished. That moment is the request's *scheduled*
send time; the moment the client actually sends it is its *sent* time, and the difference is
the client's send lag. The other sign of a saturated client is its event loop waking late
(LoopLag): chunk arrival times are then stamped late, inflating TTFT, ITL and TPOT.

Every request becomes one record (a dict, one JSONL line): phase, level, index, scheduled and
sent time (seconds from the run's start), HTTP status, error, each streamed chunk's arrival
time (seconds after sending) and token count, the server's `usage`, malformed chunks seen.
Chunks are parsed cheaply: lines split on bytes, `orjson` on the `data:` payload only.
HTTP errors, timeouts and malformed chunks are recorded, never raised.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Optional, Sequence

import httpx
import orjson

from k25exp.serving.launch import auth_headers

DONE = b"[DONE]"


class CompletionClient:
    def __init__(self, base_url: str, model: str, api_key: Optional[str] = None,
                 timeout_s: float = 300.0, max_connections: int = 256,
                 continuous_usage: bool = True, temperature: float = 0.0, seed: int = 0):
        self.model = model
        self.timeout_s = timeout_s
        self.continuous_usage = continuous_usage
        self.temperature = temperature
        self.seed = seed
        # Idle connections are dropped after 1 s, well before the server's keep-alive timeout
        # (uvicorn's 5 s): reusing one the server is closing at that moment fails the request.
        limits = httpx.Limits(max_connections=max_connections,
                              max_keepalive_connections=max_connections, keepalive_expiry=1.0)
        self.http = httpx.AsyncClient(
            base_url=base_url, limits=limits, headers=auth_headers(api_key),
            timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)))

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> "CompletionClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    def payload(self, prompt: str, max_tokens: int) -> bytes:
        stream_options = {"include_usage": True}
        if self.continuous_usage:
            stream_options["continuous_usage_stats"] = True
        return orjson.dumps({
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": self.temperature,
            "seed": self.seed, "stream": True, "stream_options": stream_options,
        })

    async def complete(self, prompt: str, max_tokens: int, rec: dict, t0: float) -> dict:
        """Sends one streaming completion and fills `rec`. Never raises for request failures."""
        body = self.payload(prompt, max_tokens)
        sent = time.perf_counter()
        rec["sent_s"] = sent - t0
        if "scheduled_s" in rec:
            # the client's own lateness: from when the request could go (it was due and, in an
            # open loop under a cap, it had waited its queue_ms for a slot: ready_s)
            rec["lag_ms"] = (rec["sent_s"] - rec.get("ready_s", rec["scheduled_s"])) * 1e3
        rec.update(status=None, error=None, chunk_s=[], chunk_tokens=[], usage=None,
                   malformed=0, done=False)
        try:
            await asyncio.wait_for(self._stream(body, sent, rec), self.timeout_s)
        except asyncio.TimeoutError:
            rec["error"] = f"timeout: no complete response after {self.timeout_s:g} s"
        except httpx.TimeoutException as e:
            rec["error"] = f"timeout: {type(e).__name__}: {e}"
        except httpx.HTTPError as e:
            rec["error"] = f"transport: {type(e).__name__}: {e}"
        except Exception as e:  # anything else is still the request's failure, not the run's
            rec["error"] = f"client: {type(e).__name__}: {e}"
        rec["end_s"] = time.perf_counter() - sent
        finish(rec)
        return rec

    async def _stream(self, body: bytes, sent: float, rec: dict) -> None:
        headers = {"content-type": "application/json", "accept": "text/event-stream"}
        async with self.http.stream("POST", "/v1/completions", content=body,
                                    headers=headers) as resp:
            rec["status"] = resp.status_code
            if resp.status_code != 200:
                text = (await resp.aread())[:500].decode(errors="replace")
                rec["error"] = f"HTTP {resp.status_code}: {text}"
                return
            ctype = resp.headers.get("content-type", "")
            if "event-stream" not in ctype:  # a proxy's page, a JSON answer: not a stream
                text = (await resp.aread())[:200].decode(errors="replace")
                rec["error"] = (f"not an event stream: POST {resp.request.url} answered HTTP 200, "
                                f"content-type {ctype or 'none'}: {text!r}")
                return
            chunk_s, chunk_tokens = rec["chunk_s"], rec["chunk_tokens"]
            continuous = self.continuous_usage
            seen_tokens = 0
            buf = b""
            async for data in resp.aiter_bytes():
                t = time.perf_counter() - sent
                buf += data
                while True:
                    j = buf.find(b"\n")
                    if j < 0:
                        break
                    line, buf = buf[:j], buf[j + 1:]
                    if not line.startswith(b"data:"):
                        continue  # blank separators, SSE comments / pings, event names
                    payload = line[5:].strip()
                    if payload == DONE:
                        rec["done"] = True
                        continue
                    try:
                        obj = orjson.loads(payload)
                        choices = obj.get("choices")
                        usage = obj.get("usage")
                        if "error" in obj:
                            err = obj["error"]
                            rec["error"] = "stream: " + (err.get("message", str(err))
                                                         if isinstance(err, dict) else str(err))
                            continue
                        if choices:
                            choices[0]["index"]  # a choice must be an object
                            if continuous and usage:
                                n = usage["completion_tokens"] - seen_tokens
                                seen_tokens = usage["completion_tokens"]
                            else:
                                n = 1
                            if n > 0:
                                chunk_s.append(t)
                                chunk_tokens.append(n)
                        elif usage is not None:
                            rec["usage"] = {k: usage.get(k) for k in
                                            ("prompt_tokens", "completion_tokens", "total_tokens")}
                        elif choices is None:
                            raise ValueError("neither choices nor usage")
                    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError,
                            IndexError, ValueError):
                        rec["malformed"] += 1
            if buf.strip():
                rec["malformed"] += 1  # a truncated last line


def finish(rec: dict) -> dict:
    """Derived per-request figures (vLLM's definitions), from the raw fields of `rec`."""
    cs = rec.get("chunk_s") or []
    usage = rec.get("usage") or {}
    out = usage.get("completion_tokens")
    if out is None:
        out = sum(rec.get("chunk_tokens") or []) or None
    rec["output_tokens"] = out
    rec["prompt_tokens"] = usage.get("prompt_tokens")
    rec["ttft_s"] = cs[0] if cs else None
    rec["e2e_s"] = cs[-1] if cs else None
    # The user's view: from when the request was due (open loop: its arrival; closed loop: the
    # end of the worker's previous response), so time spent waiting in the client counts: its
    # lateness and, under an open loop's max_concurrency, its wait for a slot.
    wait = (max(rec.get("lag_ms") or 0.0, 0.0) + (rec.get("queue_ms") or 0.0)) / 1e3
    rec["ttft_sched_s"] = cs[0] + wait if cs else None
    rec["e2e_sched_s"] = cs[-1] + wait if cs else None
    rec["tpot_s"] = ((cs[-1] - cs[0]) / (out - 1)) if cs and out and out > 1 else None
    if rec.get("error") is None and rec.get("status") == 200:
        if not cs:
            rec["error"] = "no output tokens streamed"
        elif not rec.get("done"):
            rec["error"] = "stream ended without [DONE]"
    rec["ok"] = rec.get("error") is None and rec.get("status") == 200
    return rec


class LoopLag:
    """How late the event loop wakes a sleeper: the client's own saturation, sampled."""

    def __init__(self, interval_s: float = 0.01):
        self.interval_s = interval_s
        self.samples_ms: list[float] = []
        self._task: Optional[asyncio.Task] = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            self.samples_ms.append((time.perf_counter() - t - self.interval_s) * 1e3)

    def start(self) -> None:
        self.samples_ms = []
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> list[float]:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        return self.samples_ms


async def run_level(client: CompletionClient, prompt: Callable[[int], str], *, phase: str,
                    level: int, concurrency: int, max_tokens: int, t0: float,
                    n_requests: Optional[int] = None, duration_s: Optional[float] = None,
                    input_tokens: Optional[int] = None,
                    on_record: Optional[Callable[[dict], None]] = None,
                    should_stop: Optional[Callable[[], bool]] = None,
                    ramp_s: float = 0.0) -> dict:
    """Closed loop: `concurrency` workers, each sending its next request when the last ends.

    Request i uses prompt(i), so the same prompts are sent at every level. Stops after
    `n_requests`, or when `duration_s` has passed (requests in flight finish), or when
    `should_stop()` says so. ramp_s staggers the start: worker w sends its first request at
    w × ramp_s / concurrency, so rounds do not move in lockstep (0: all at once).
    Returns {"records", "wall_s", "cpu_s", "loop_lag_ms"}.
    """
    if (n_requests is None) == (duration_s is None):
        raise ValueError("give exactly one of n_requests and duration_s")
    records: list[dict] = []
    nxt = 0
    start = time.perf_counter()
    cpu0 = time.process_time()
    lag = LoopLag()
    lag.start()

    async def worker(w: int) -> None:
        nonlocal nxt
        scheduled = start + w * ramp_s / concurrency
        if scheduled > time.perf_counter():
            await asyncio.sleep(scheduled - time.perf_counter())
        while True:
            if should_stop and should_stop():
                return
            if duration_s is not None:
                if time.perf_counter() - start >= duration_s:
                    return
            elif nxt >= n_requests:
                return
            i = nxt
            nxt += 1
            rec = {"phase": phase, "level": level, "i": i, "worker": w,
                   "prompt_tokens_target": input_tokens, "max_tokens": max_tokens,
                   "scheduled_s": scheduled - t0}
            await client.complete(prompt(i), max_tokens, rec, t0)
            records.append(rec)
            if on_record:
                on_record(rec)
            # The next request is due the moment this response ended: what the client spends
            # after that (parsing, records, progress) before sending is its lag.
            scheduled = t0 + rec["sent_s"] + rec["end_s"]

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    wall = time.perf_counter() - start
    return {"records": records, "wall_s": wall, "cpu_s": time.process_time() - cpu0,
            "loop_lag_ms": await lag.stop()}


async def run_open_level(client: CompletionClient, prompt: Callable[[int], str], *, phase: str,
                         level: int, due_s: Sequence[float], max_tokens: int, t0: float,
                         max_concurrency: Optional[int] = None,
                         input_tokens: Optional[int] = None,
                         on_record: Optional[Callable[[dict], None]] = None,
                         should_stop: Optional[Callable[[], bool]] = None) -> dict:
    """Open loop: request i is due at due_s[i] seconds after the level starts, whatever the
    responses do (k25exp.serving.arrivals draws the schedule). With max_concurrency (the macro
    runner always gives one: experiment.max_concurrency, else its own cap of 256), a due
    request waits in the client for a free slot: that wait is its queue_ms, and counts in its
    latency from the scheduled send (ttft_sched, e2e_sched) but not in its lag_ms (the client's
    own lateness, which flags a level). Returns as run_level, plus "due_s"."""
    records: list[dict] = []
    start = time.perf_counter()
    cpu0 = time.process_time()
    lag = LoopLag()
    lag.start()
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def one(i: int, due: float) -> None:
        delay = start + due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if should_stop and should_stop():
            return
        rec = {"phase": phase, "level": level, "i": i, "worker": None,
               "prompt_tokens_target": input_tokens, "max_tokens": max_tokens,
               "scheduled_s": start + due - t0}
        if slots is None:
            await client.complete(prompt(i), max_tokens, rec, t0)
        else:
            asked = time.perf_counter()
            async with slots:
                # The wait for a slot is the cap's doing: queue_ms. Lateness in waking up for
                # the due time (before asking) stays the client's: lag_ms counts from ready_s.
                rec["queue_ms"] = (time.perf_counter() - asked) * 1e3
                rec["ready_s"] = rec["scheduled_s"] + rec["queue_ms"] / 1e3
                if should_stop and should_stop():  # the server died while this one queued
                    return
                await client.complete(prompt(i), max_tokens, rec, t0)
        records.append(rec)
        if on_record:
            on_record(rec)

    await asyncio.gather(*(one(i, float(d)) for i, d in enumerate(due_s)))
    wall = time.perf_counter() - start
    return {"records": records, "wall_s": wall, "cpu_s": time.process_time() - cpu0,
            "loop_lag_ms": await lag.stop(), "due_s": list(map(float, due_s))}
