"""The load generator: streaming OpenAI completions over httpx.

One event loop, one keep-alive connection per request in flight (a *lane*, reused by the next
request; plain HTTP read through k25exp.load.sockets), one request per worker at a time
(closed loop): a level of concurrency C runs C workers, each sending its next request as soon
as its previous one finished. That moment is the request's *scheduled* send time; the moment
the client actually sends it is its *sent* time, and the difference is the client's send lag.
Several processes can run one level together (k25exp.load.shards): run_level and
run_open_level then take their share of it and the shared start. The other sign of a saturated client is its event loop waking late
(LoopLag): chunk arrival times are then stamped late, inflating TTFT, ITL and TPOT.

Every request becomes one record (a dict, one JSONL line): phase, level, index, the prompt
length it was built with and the max_tokens it asked for (prompt_tokens_target, max_tokens:
a prompt source may give each request its own, as (text, prompt tokens, max_tokens);
k25exp.load.workload), scheduled and
sent time (seconds from the run's start), HTTP status, error, each streamed chunk's arrival
time (seconds after sending) and token count, the server's `usage`, malformed chunks seen.
Chunks are parsed cheaply: lines split on bytes, `orjson` on the `data:` payload only.
HTTP errors, timeouts and malformed chunks are recorded, never raised.

Long because the closed and open loops share one request path, one lane pool and the
same record fields, which a split would pull apart.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Optional, Sequence

import httpx
import orjson

from k25exp.serving.launch import auth_headers
from k25exp.load.sockets import use_asyncio_sockets

DONE = b"[DONE]"


class CompletionClient:
    """Streaming completions over httpx, one *lane* per request in flight.

    A lane is an httpx.AsyncClient holding one keep-alive connection; a request takes a free
    lane (the most recently used: its socket is the likeliest still open) and gives it back.
    One shared pool of C connections would cost O(C²) per request at C in the hundreds:
    httpcore 1.0's pool rescans every connection, for each idle one, whenever a request
    starts or ends (measured here at c = 128 against a stub stepping every 10 ms: 57 % of
    the client's CPU, and requests in lockstep all ending at once blocked the event loop
    for up to a second). `http` is a separate small client for everything else (/metrics,
    /health, dev endpoints)."""

    def __init__(self, base_url: str, model: str, api_key: Optional[str] = None,
                 timeout_s: float = 300.0, max_connections: int = 256,
                 continuous_usage: bool = True, temperature: float = 0.0, seed: Optional[int] = 0):
        self.model = model
        self.timeout_s = timeout_s
        self.continuous_usage = continuous_usage
        self.temperature = temperature
        self.seed = seed
        self.max_idle_lanes = max_connections  # lanes kept for reuse; more in flight are made
        # One TLS context for every lane (httpx builds one per client otherwise: ~10 ms each).
        self._lane_kw = dict(base_url=base_url, headers=auth_headers(api_key),
                             timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
                             verify=httpx.create_ssl_context())
        self._free: list[httpx.AsyncClient] = []
        self._lanes: set[httpx.AsyncClient] = set()
        # plain HTTP over k25exp.load.sockets (half the CPU per chunk); TLS stays httpx's
        self._asyncio_sockets = base_url.startswith("http://")
        self.http = self._new_client(4)

    @property
    def socket_layer(self) -> str:
        """What moves the bytes, for the run's tag."""
        return ("asyncio protocol (k25exp.load.sockets)" if self._asyncio_sockets
                else "httpx's default (anyio)")

    def _new_client(self, connections: int) -> httpx.AsyncClient:
        # Idle connections are dropped after 1 s, well before the server's keep-alive timeout
        # (uvicorn's 5 s): reusing one the server is closing at that moment fails the request.
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections,
                              keepalive_expiry=1.0)
        client = httpx.AsyncClient(limits=limits, **self._lane_kw)
        if self._asyncio_sockets and not use_asyncio_sockets(client):
            self._asyncio_sockets = False  # httpx moved its pool: its own backend, said so
        return client

    def prepare(self, lanes: int) -> None:
        """Makes `lanes` lanes ahead of a phase, so none is built while it is timed."""
        while len(self._lanes) < lanes:
            lane = self._new_client(1)
            self._lanes.add(lane)
            self._free.append(lane)

    def _take(self) -> httpx.AsyncClient:
        if not self._free:
            self.prepare(len(self._lanes) + 1)
        return self._free.pop()

    async def _give(self, lane: httpx.AsyncClient) -> None:
        if len(self._free) < self.max_idle_lanes:
            self._free.append(lane)
        else:
            self._lanes.discard(lane)
            await lane.aclose()

    async def warm(self) -> None:
        """One GET /health through a lane, before anything is timed: httpx imports its
        transport's modules (httpcore's connection, h11, anyio's backend) on a process's first
        request, ~50 ms that a new client process would otherwise spend in its first level.
        Not a completion: the server's /metrics, scraped around a level, count only its own."""
        lane = self._take()
        try:
            await lane.get("/health", timeout=5.0)
        except Exception:  # an endpoint without /health: the imports are done all the same
            pass
        finally:
            await self._give(lane)

    async def aclose(self) -> None:
        for lane in list(self._lanes) + [self.http]:
            await lane.aclose()
        self._lanes.clear()
        self._free.clear()

    async def __aenter__(self) -> "CompletionClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    def payload(self, prompt, max_tokens: int, token_ids: bool = False) -> bytes:
        """The request's body; `prompt` a text or token ids (the completions API takes
        either); token_ids: ask for the answer's token ids (vLLM's return_token_ids)."""
        stream_options = {"include_usage": True}
        if self.continuous_usage:
            stream_options["continuous_usage_stats"] = True
        body = {
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": self.temperature,
            "seed": self.seed, "stream": True, "stream_options": stream_options,
        }
        if token_ids:
            body["return_token_ids"] = True
        return orjson.dumps(body)

    async def complete(self, prompt, max_tokens: int, rec: dict, t0: float,
                       answer: Optional[list] = None) -> dict:
        """Sends one streaming completion and fills `rec`. Never raises for request failures.
        `answer`, a list: the answer's token ids are appended to it as they stream (a
        multi-turn session's history: k25exp.load.sessions), not kept in the record."""
        body = self.payload(prompt, max_tokens, token_ids=answer is not None)
        sent = time.perf_counter()
        rec["sent_s"] = sent - t0
        if "scheduled_s" in rec:
            # the client's own lateness: from when the request could go (it was due and, in an
            # open loop under a cap, it had waited its queue_ms for a slot: ready_s)
            rec["lag_ms"] = (rec["sent_s"] - rec.get("ready_s", rec["scheduled_s"])) * 1e3
        rec.update(status=None, error=None, chunk_s=[], chunk_tokens=[], usage=None,
                   malformed=0, done=False)
        lane = self._take()
        try:
            await asyncio.wait_for(self._stream(lane, body, sent, rec, answer), self.timeout_s)
        except asyncio.TimeoutError:
            rec["error"] = f"timeout: no complete response after {self.timeout_s:g} s"
        except httpx.TimeoutException as e:
            rec["error"] = f"timeout: {type(e).__name__}: {e}"
        except httpx.HTTPError as e:
            rec["error"] = f"transport: {type(e).__name__}: {e}"
        except Exception as e:  # anything else is still the request's failure, not the run's
            rec["error"] = f"client: {type(e).__name__}: {e}"
        rec["end_s"] = time.perf_counter() - sent
        await self._give(lane)
        finish(rec)
        return rec

    async def _stream(self, lane: httpx.AsyncClient, body: bytes, sent: float, rec: dict,
                      answer: Optional[list] = None) -> None:
        headers = {"content-type": "application/json", "accept": "text/event-stream"}
        async with lane.stream("POST", "/v1/completions", content=body,
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
            # vLLM streams identity-encoded: the raw body, without httpx's decoder layer
            chunks = resp.aiter_bytes() if resp.headers.get("content-encoding") else resp.aiter_raw()
            async for data in chunks:
                t = time.perf_counter() - sent
                lines = (buf + data if buf else data).split(b"\n")
                buf = lines.pop()  # an unfinished last line (usually none: b"")
                for line in lines:
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
                            if answer is not None:
                                answer.extend(choices[0].get("token_ids") or ())
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


class Counter:
    """The next request index of a closed loop: in-process, or shared between processes
    (k25exp.load.shards passes one backed by shared memory)."""

    def __init__(self) -> None:
        self.value = 0

    def claim(self, limit: Optional[int]) -> Optional[int]:
        if limit is not None and self.value >= limit:
            return None
        i, self.value = self.value, self.value + 1
        return i


async def _start(start_at: Optional[float]) -> float:
    """The phase's start: now, or `start_at` (perf_counter, one clock for every process on
    the machine) for a phase that several processes run as one."""
    if start_at is None:
        return time.perf_counter()
    delay = start_at - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    return start_at


def shaped(p, input_tokens: Optional[int], max_tokens: int) -> tuple[str, Optional[int], int]:
    """(text, prompt tokens, max_tokens) of what a prompt source gave: a text alone is sent
    with the phase's own lengths."""
    return (p, input_tokens, max_tokens) if isinstance(p, str) else p


def _result(records: list, start: float, cpu0: float, lag: list) -> dict:
    end = time.perf_counter()
    return {"records": records, "wall_s": end - start, "cpu_s": time.process_time() - cpu0,
            "loop_lag_ms": lag, "start": start, "end": end}


async def run_level(client: CompletionClient, prompt: Callable[[int], str], *, phase: str,
                    level: int, concurrency: int, max_tokens: int, t0: float,
                    n_requests: Optional[int] = None, duration_s: Optional[float] = None,
                    input_tokens: Optional[int] = None,
                    on_record: Optional[Callable[[dict], None]] = None,
                    should_stop: Optional[Callable[[], bool]] = None,
                    ramp_s: float = 0.0, workers: Optional[Sequence[int]] = None,
                    counter=None, start_at: Optional[float] = None, shard: int = 0) -> dict:
    """Closed loop: `concurrency` workers, each sending its next request when the last ends.

    Request i uses prompt(i), so the same prompts are sent at every level. Stops after
    `n_requests`, or after the requests due within `duration_s` of the start (each sent
    however late the client is, its lateness in lag_ms; requests in flight finish), or when
    `should_stop()` says so. ramp_s staggers the start: worker w sends its first request at
    w × ramp_s / concurrency, so rounds do not move in lockstep (0: all at once).
    A shard of a loop that several processes run (k25exp.load.shards) runs only
    `workers` (of 0 … concurrency − 1), takes request indices from the shared `counter`
    and starts at the shared `start_at`: together the shards run this one loop (`shard`
    names the process in each record).
    Returns {"records", "wall_s", "cpu_s", "loop_lag_ms", "start", "end"}.
    """
    if (n_requests is None) == (duration_s is None):
        raise ValueError("give exactly one of n_requests and duration_s")
    records: list[dict] = []
    counter = counter or Counter()
    start = await _start(start_at)
    cpu0 = time.process_time()
    lag = LoopLag()
    lag.start()

    async def worker(w: int) -> None:
        scheduled = start + w * ramp_s / concurrency
        if scheduled > time.perf_counter():
            await asyncio.sleep(scheduled - time.perf_counter())
        while True:
            if should_stop and should_stop():
                return
            # The window holds the requests *due* in it: one due inside is sent however late
            # the client wakes (its lateness is its lag_ms), one due after is not. Deciding on
            # the clock at wake-up instead would drop a due request on a busy machine.
            if duration_s is not None and scheduled - start >= duration_s:
                return
            i = counter.claim(n_requests)
            if i is None:
                return
            text, n_in, n_out = shaped(prompt(i), input_tokens, max_tokens)
            rec = {"phase": phase, "level": level, "i": i, "worker": w, "shard": shard,
                   "prompt_tokens_target": n_in, "max_tokens": n_out,
                   "scheduled_s": scheduled - t0}
            await client.complete(text, n_out, rec, t0)
            records.append(rec)
            if on_record:
                on_record(rec)
            # The next request is due the moment this response ended: what the client spends
            # after that (parsing, records, progress) before sending is its lag.
            scheduled = t0 + rec["sent_s"] + rec["end_s"]

    ws = range(concurrency) if workers is None else workers
    await asyncio.gather(*(worker(w) for w in ws))
    return _result(records, start, cpu0, await lag.stop())


async def run_open_level(client: CompletionClient, prompt: Callable[[int], str], *, phase: str,
                         level: int, due_s: Sequence[float], max_tokens: int, t0: float,
                         max_concurrency: Optional[int] = None,
                         input_tokens: Optional[int] = None,
                         on_record: Optional[Callable[[dict], None]] = None,
                         should_stop: Optional[Callable[[], bool]] = None,
                         indices: Optional[Sequence[int]] = None,
                         start_at: Optional[float] = None, shard: int = 0) -> dict:
    """Open loop: request i is due at due_s[i] seconds after the level starts, whatever the
    responses do (k25exp.load.arrivals draws the schedule). With max_concurrency (the macro
    runner always gives one: experiment.max_concurrency, else its own cap of 256), a due
    request waits in the client for a free slot: that wait is its queue_ms, and counts in its
    latency from the scheduled send (ttft_sched, e2e_sched) but not in its lag_ms (the client's
    own lateness, which flags a level). A shard (k25exp.load.shards) sends only the
    requests `indices` of the one schedule, from the shared `start_at`, under its own share
    of the cap. Returns as run_level, plus "due_s" (the whole schedule)."""
    records: list[dict] = []
    start = await _start(start_at)
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
        text, n_in, n_out = shaped(prompt(i), input_tokens, max_tokens)
        rec = {"phase": phase, "level": level, "i": i, "worker": None, "shard": shard,
               "prompt_tokens_target": n_in, "max_tokens": n_out,
               "scheduled_s": start + due - t0}
        if slots is None:
            await client.complete(text, n_out, rec, t0)
        else:
            asked = time.perf_counter()
            async with slots:
                # The wait for a slot is the cap's doing: queue_ms. Lateness in waking up for
                # the due time (before asking) stays the client's: lag_ms counts from ready_s.
                rec["queue_ms"] = (time.perf_counter() - asked) * 1e3
                rec["ready_s"] = rec["scheduled_s"] + rec["queue_ms"] / 1e3
                if should_stop and should_stop():  # the server died while this one queued
                    return
                await client.complete(text, n_out, rec, t0)
        records.append(rec)
        if on_record:
            on_record(rec)

    ids = range(len(due_s)) if indices is None else indices
    await asyncio.gather(*(one(i, float(due_s[i])) for i in ids))
    res = _result(records, start, cpu0, await lag.stop())
    res["due_s"] = list(map(float, due_s))
    return res
