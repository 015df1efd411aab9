"""Hand-built Chrome/Kineto traces whose breakdown is known exactly.

Times are given in µs relative to BASE (a realistic absolute Kineto timestamp, so the
reader's precision handling is exercised). `write_trace` writes either torch's own layout
(one key per line, events separated by `},` lines) or compact single-line JSON.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

# µs; the magnitude of Kineto's "ts" (µs since the trace's baseTimeNanoseconds, the
# system clock floored to a ~3-month interval: real ones read ~5e12). Not since the epoch.
BASE = 1_790_857_026_000.0

DECODE = "execute_context_0(0)_generation_1(1)"
PREFILL = "execute_context_1(8)_generation_0(0)"


def ev(name: str, ts: float, dur: float, cat: str = "kernel", pid: Any = 0, tid: Any = 7,
       args: dict | None = None, ph: str = "X") -> dict:
    e = {"ph": ph, "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": BASE + ts, "dur": dur}
    if args is not None:
        e["args"] = args
    return e


def op(name: str, ts: float, dur: float, tid: Any = 100, **kw) -> dict:
    """A CPU operator (cat cpu_op) on host thread `tid`."""
    return ev(name, ts, dur, cat="cpu_op", pid=100, tid=tid, **kw)


def step(name: str, ts: float, dur: float, device: bool = False, tid: Any = None,
         ext: int | None = None) -> dict:
    """A vLLM step annotation: host-side (user_annotation) or device-side."""
    cat = "gpu_user_annotation" if device else "user_annotation"
    args = {"External id": ext} if ext is not None else {}
    return ev(name, ts, dur, cat=cat, pid=0 if device else 100,
              tid=tid if tid is not None else (7 if device else 100), args=args)


def _kineto_event(e: dict) -> str:
    lines = ["  {"]
    keys = [k for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur") if k in e]
    body = [f'    "{k}": {json.dumps(e[k])}' for k in keys]
    if "args" in e:
        inner = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in e["args"].items())
        body.append('    "args": {\n      ' + inner + "\n    }")
    extra = [k for k in e if k not in keys and k != "args"]
    body += [f'    "{k}": {json.dumps(e[k])}' for k in extra]
    lines.append(",\n".join(body))
    lines.append("  }")
    return "\n".join(lines)


def render(events: list[dict], meta: dict | None = None, style: str = "kineto",
           after: dict | None = None) -> str:
    """`meta`: top-level keys before traceEvents; `after`: keys between traceEvents and
    traceName (where Kineto writes its log arrays, "INFO": [...], "ERROR": [...])."""
    meta, after = dict(meta or {}), dict(after or {})
    if style == "compact":
        return json.dumps({**meta, "traceEvents": events, **after, "traceName": "test"})
    if style == "array":
        return json.dumps(events)
    head = "{\n" + "".join(f'  {json.dumps(k)}: {json.dumps(v)},\n' for k, v in meta.items())
    body = ",\n".join(_kineto_event(e) for e in events)
    tail = "".join(f'  {json.dumps(k)}: {json.dumps(v, indent=2)},\n' for k, v in after.items())
    return (head + '  "traceEvents": [\n' + body + '\n  ],\n' + tail
            + '  "traceName": "test"\n}\n')


def write_trace(path: Path, events: list[dict], meta: dict | None = None,
                style: str = "kineto", after: dict | None = None) -> Path:
    text = render(events, meta, style, after).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text))
    else:
        path.write_bytes(text)
    return path


def rank_meta(rank: int, world: int = 2) -> dict:
    return {"schemaVersion": 1,
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world}}
