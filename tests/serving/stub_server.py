"""An OpenAI-style streaming completions server with no model behind it, for two jobs:

* measuring the client's own capacity (how many chunks per second one process can take in
  before it, not the server, sets the pace): it streams as fast as asked;
* exercising the client's failure handling, which a healthy vLLM never shows: the prompt
  picks the behaviour — "http500", "malformed" (one bad chunk mid-stream), "cut" (closes
  before [DONE]), "stream_error" (an error object mid-stream), "slow" (answers after 30 s),
  "hold" (a delivery stall: from the middle of the stream on, tokens keep being made every
  gap but are held back for `hold_s` after the last chunk sent, then released in one write).

With `step_s` it plays vLLM's batch: one "engine" task writes, every step, the next chunk of
every stream in flight (a request joins at the next step), so chunks of concurrent streams
arrive together, step after step, as from a decode step: the offered load is streams / step
chunks/s, TPOT is the step while the stub keeps up. Its chunks are vLLM's completion chunks
(id, object, created, model, choices, usage) prerendered, so the stub spends little per chunk
and the client parses what it would parse from vLLM. Without `step_s` each stream paces
itself (`gap_s`), or writes as fast as it can (0).

For process-lifecycle tests it also plays a vLLM server's other routes (tests/serving/
fake_vllm_server.py runs it as one): `model` names the served model, `api_key` protects /v1/*
as vLLM does, /metrics gives vLLM's latency histograms (sum and count) over what it served,
/reset_prefix_cache answers only in dev mode, /version; `misbehave=False` ignores the prompt;
a prompt of token ids (a multi-turn session's history, k25exp.load.sessions) counts its ids and
picks no behaviour, and `return_token_ids` streams each answer token's id (TOKEN_ID0 + i);
`stagger` streams every other completion at half speed (requests sent together end apart).

It records when it wrote each token chunk (`writes`, perf_counter seconds, one list per
completion request in arrival order), so a test knows the timing the client should measure.

    python -m tests.serving.stub_server --port 8090 [--gap-ms 0 | --step-ms 10]

Plain asyncio and HTTP/1.1 keep-alive, no dependencies. Loopback only by default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from typing import Optional


TOKEN_ID0 = 100  # the id of an answer's first token (return_token_ids), then 101, 102, ...


def _chunk(obj) -> bytes:
    data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _vllm_token(model: str, pt: int, i: int, ids: bool = False) -> bytes:
    """Token i's chunk as vLLM 0.32 streams it with continuous_usage_stats (HTTP-chunked);
    `ids`: with its token id too (return_token_ids), token i's id being TOKEN_ID0 + i."""
    choice = {"index": 0, "text": f" t{i}", "logprobs": None, "finish_reason": None,
              "stop_reason": None, **({"token_ids": [TOKEN_ID0 + i]} if ids else {})}
    return _chunk({"id": "cmpl-5f0c1d2e3a4b4c6d8e9f0a1b2c3d4e5f", "object": "text_completion",
                   "created": 1764662400, "model": model,
                   "choices": [choice],
                   "usage": {"prompt_tokens": pt, "total_tokens": pt + i + 1,
                             "completion_tokens": i + 1}})


class _Stream:
    """A completion in the step engine's batch."""
    __slots__ = ("writer", "pt", "n", "i", "writes", "done", "ids")

    def __init__(self, writer, pt: int, n: int, writes: list, done: asyncio.Future, ids: bool = False):
        self.writer, self.pt, self.n, self.i, self.writes, self.done = writer, pt, n, 0, writes, done
        self.ids = ids  # return_token_ids


def _answer(writer: asyncio.StreamWriter, status: str, body, ctype: str = "application/json") -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    writer.write(f"HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {len(data)}"
                 f"\r\n\r\n".encode() + data)


class StubServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, gap_s: float = 0.0,
                 hold_s: float = 0.5, ttft_s: float = 0.0, model: str = "stub",
                 api_key: Optional[str] = None, dev_mode: bool = True, misbehave: bool = True,
                 metrics_html: bool = False, stagger: bool = False, step_s: float = 0.0):
        self.host, self.port, self.gap_s, self.hold_s = host, port, gap_s, hold_s
        self.ttft_s = ttft_s  # a "prefill": pause between the response headers and token 1
        self.model, self.api_key, self.dev_mode = model, api_key, dev_mode
        self.misbehave, self.metrics_html = misbehave, metrics_html
        self.stagger = stagger  # every other completion at half speed: concurrent ones end apart
        self.step_s = step_s  # the batch engine's decode step (0: streams pace themselves)
        self._batch: list[_Stream] = []
        self._wake: Optional[asyncio.Event] = None
        self._tokens: dict[tuple[int, int, bool], bytes] = {}  # (prompt tokens, i, ids) -> chunk
        self.served = {"ttft": [0.0, 0], "tpot": [0.0, 0], "e2e": [0.0, 0]}  # [sum s, count]
        self.requests = 0
        self.writes: list[list[float]] = []
        self._server: Optional[asyncio.base_events.Server] = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> "StubServer":
        # uvicorn's (vLLM's) listen backlog: asyncio's default 100 dropped SYNs when 128 clients
        # connected at once, and those requests waited out TCP's 1 s retransmit in their TTFT
        self._server = await asyncio.start_server(self._handle, self.host, self.port, backlog=2048)
        self.port = self._server.sockets[0].getsockname()[1]
        if self.step_s:
            self._wake = asyncio.Event()
            engine = asyncio.get_running_loop().create_task(self._engine())
            self._tasks.add(engine)
        return self

    def _token(self, pt: int, i: int, ids: bool = False) -> bytes:
        b = self._tokens.get((pt, i, ids))
        if b is None:
            b = self._tokens[(pt, i, ids)] = _vllm_token(self.model, pt, i, ids)
        return b

    async def _engine(self) -> None:
        """Every step, the next chunk of every stream in the batch (one write each, as vLLM's
        API server sends them), on a schedule: a late step shortens the next instead of adding
        up; a stub that cannot keep up steps as fast as it can."""
        due = time.perf_counter()
        while True:
            if not self._batch:
                self._wake.clear()
                await self._wake.wait()
                due = time.perf_counter()
            now = time.perf_counter()
            keep = []
            for s in self._batch:
                if s.writer.transport.is_closing():  # its client went away
                    s.done.set_exception(ConnectionResetError("client gone"))
                    continue
                try:
                    s.writer.write(self._token(s.pt, s.i, s.ids))
                except (ConnectionError, RuntimeError) as e:
                    s.done.set_exception(e)
                    continue
                s.writes.append(now)
                s.i += 1
                if s.i < s.n:
                    keep.append(s)
                else:
                    s.done.set_result(None)
            self._batch = keep
            due += self.step_s
            due = max(due, time.perf_counter())  # behind by more than a step: no catch-up burst
            await asyncio.sleep(max(0.0, due - time.perf_counter()))

    async def close(self) -> None:
        if self._server:
            self._server.close()
            for t in list(self._tasks):  # keep-alive connections waiting for a request
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._server.wait_closed()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.lower(): v.strip() for k, v in
                           (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                self.requests += 1
                if not await self._respond(method, path, body, headers, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    def _metrics(self) -> str:
        names = {"ttft": "vllm:time_to_first_token_seconds",
                 "tpot": "vllm:request_time_per_output_token_seconds",
                 "e2e": "vllm:e2e_request_latency_seconds"}
        labels = f'{{engine="0",model_name="{self.model}"}}'
        return "".join(f"{names[k]}_sum{labels} {s!r}\n{names[k]}_count{labels} {float(n)!r}\n"
                       for k, (s, n) in self.served.items())

    def _count(self, arrived: float, writes: list[float]) -> None:
        for key, v in (("ttft", writes[0] - arrived), ("e2e", writes[-1] - arrived),
                       ("tpot", (writes[-1] - writes[0]) / (len(writes) - 1) if len(writes) > 1
                        else None)):
            if v is not None:
                self.served[key][0] += v
                self.served[key][1] += 1

    async def _respond(self, method: str, path: str, body: bytes, headers: dict,
                       writer: asyncio.StreamWriter) -> bool:
        """Answers one request; False closes the connection."""
        if path == "/health":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            return True
        if path.startswith("/v1/") and self.api_key and \
                headers.get("authorization") != f"Bearer {self.api_key}":
            _answer(writer, "401 Unauthorized", {"error": "Unauthorized"})
            return True
        if path == "/v1/models":
            _answer(writer, "200 OK", {"data": [{"id": self.model}]})
            return True
        if path == "/version":
            _answer(writer, "200 OK", {"version": "stub"})
            return True
        if path == "/metrics":
            if self.metrics_html:
                _answer(writer, "200 OK", b"<html><body>Sign in to continue</body></html>",
                        "text/html")
            else:
                _answer(writer, "200 OK", self._metrics().encode(), "text/plain; version=0.0.4")
            return True
        if path == "/reset_prefix_cache" and method == "POST" and self.dev_mode:
            _answer(writer, "200 OK", {"success": True})
            return True
        if path != "/v1/completions":
            writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            return True
        arrived = time.perf_counter()
        req = json.loads(body)
        prompt, n = req.get("prompt", ""), int(req.get("max_tokens", 16))
        ids = bool(req.get("return_token_ids"))
        # a prompt of token ids (a multi-turn session's history): that many tokens, no words
        words = len(prompt) if isinstance(prompt, list) else len(prompt.split())
        if not self.misbehave or isinstance(prompt, list):
            prompt = "fine " * words
        if "http500" in prompt:
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\nboom")
            return True
        if "slow" in prompt:
            await asyncio.sleep(30)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        pt = words
        writes: list[float] = []
        gap_s = self.gap_s * (2 if self.stagger and len(self.writes) % 2 else 1)
        self.writes.append(writes)

        def token(i: int) -> bytes:
            return self._token(pt, i, ids)

        if self.ttft_s:
            await writer.drain()
            await asyncio.sleep(self.ttft_s)
        if self.step_s and not any(k in prompt for k in ("malformed", "stream_error", "cut", "hold")):
            done = asyncio.get_running_loop().create_future()
            self._batch.append(_Stream(writer, pt, n, writes, done, ids))
            self._wake.set()
            try:
                await done
            except (ConnectionError, RuntimeError):
                return False
            i = n
        else:
            i = 0
        due = None
        while i < n:
            if "malformed" in prompt and i == n // 2:
                writer.write(_chunk(b'{"choices": [{"text": "oops"'))
            if "stream_error" in prompt and i == n // 2:
                writer.write(_chunk({"error": {"message": "engine hiccup", "code": 500}}))
                break
            if "cut" in prompt and i == n // 2:
                await writer.drain()
                return False
            if "hold" in prompt and i == n // 2 and writes:
                # the tokens made while held (one per gap), released hold_s after the last write
                k = min(n - i, int(self.hold_s / self.gap_s) if self.gap_s else n - i)
                await asyncio.sleep(max(0.0, writes[-1] + self.hold_s - time.perf_counter()))
                data = b"".join(token(j) for j in range(i, i + k))
                writes.extend([time.perf_counter()] * k)  # stamped before the bytes can arrive
                writer.write(data)
                i += k
                due = None  # the pace starts again from the release
            else:
                data = token(i)
                writes.append(time.perf_counter())
                writer.write(data)
                i += 1
            await writer.drain()  # raises once the client has gone
            if gap_s and i < n:
                # Paced on a schedule, not sleep after sleep: a late wake-up (a loaded machine)
                # shortens the next gap instead of adding up, so TPOT is the gap.
                due = (writes[-1] if due is None else due) + gap_s
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
        writer.write(_chunk({"choices": [], "usage": {"prompt_tokens": pt, "completion_tokens": n,
                                                      "total_tokens": pt + n}}))
        writer.write(_chunk(b"[DONE]") + b"0\r\n\r\n")
        await writer.drain()
        if writes:
            self._count(arrived, writes)
        return True


def burst_possible(writes: list[float], arrivals: list[float], burst_s: float) -> str:
    """Why a delivery burst (3 chunks, each within `burst_s` of the one before) could have
    reached the client from a stream the stub wrote at its pace, or "" when none could.
    An arrival gap is its write gap plus the change in delivery delay, so it is at least the
    smallest write gap minus the spread of delays: while that stays ≥ burst_s, no two
    arrivals come closer than burst_s. A loaded machine breaks it two ways, both named: the
    stub woke late and caught up with back-to-back writes, or the client took chunks late
    (then they were held back, which is a real delivery stall, not a false one)."""
    delays = [a - w for a, w in zip(arrivals, writes)]
    gaps = [b - a for a, b in zip(writes, writes[1:])]
    spread = max(delays) - min(delays) if delays else 0.0
    if not gaps or min(gaps) - spread >= burst_s:
        return ""
    return (f"the stub wrote two chunks {min(gaps) * 1e3:.1f} ms apart and delivery delays "
            f"spread {spread * 1e3:.1f} ms (a burst needs arrivals within {burst_s * 1e3:.1f} ms)")


class StubThread:
    """The stub on its own event loop in a thread, for tests and the capacity probe."""

    def __init__(self, gap_s: float = 0.0, hold_s: float = 0.5, ttft_s: float = 0.0,
                 step_s: float = 0.0):
        self.loop = asyncio.new_event_loop()
        self.stub = StubServer(gap_s=gap_s, hold_s=hold_s, ttft_s=ttft_s, step_s=step_s)
        self._t = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> StubServer:
        self._t.start()
        asyncio.run_coroutine_threadsafe(self.stub.start(), self.loop).result(10)
        return self.stub

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.stub.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._t.join(5)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8090)
    p.add_argument("--gap-ms", type=float, default=0.0, help="pause between chunks")
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="a batch engine's step: one chunk to every stream in flight per step")
    a = p.parse_args()

    async def serve():
        s = await StubServer(a.host, a.port, a.gap_ms / 1e3, step_s=a.step_ms / 1e3).start()
        print(f"stub completions server on {s.base_url}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
