"""A timestamped request trace in Mooncake's JSONL form, read and checked line by line, and
the open-loop schedule it gives (experiment.load=trace).

One request a line, a JSON object:
    timestamp      when it arrives, ms since the trace began (a number >= 0; equal ones
                   arrive together; lines need not be in order)
    input_length   its prompt, tokens (a positive integer)
    output_length  the tokens it generates (a positive integer: max_tokens, ignore_eos)
    hash_ids       optional: the ids of its prompt's blocks of block_tokens tokens, in order
                   (at most ceil(input_length / block_tokens) of them); requests naming the
                   same ids share those blocks' tokens (k25exp.load.prompts), so a prefix
                   cache sees what the traced service's would have
Other keys (Mooncake's and AIPerf's extras) are ignored. Every bad line is named with its
number and what was expected, and nothing is sent while any is: the whole file is read
before the server starts.

Request k of a replay is the trace's line k (in file order); it is due at
(timestamp_k - the earliest timestamp) / 1000 / speedup seconds after the level starts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

MAX_LISTED = 20  # bad lines named in one error; the rest counted


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names each bad line."""


@dataclass(frozen=True)
class TraceRequest:
    line: int  # 1-based, in the file
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()


@dataclass
class Trace:
    path: str
    requests: list[TraceRequest]
    block_tokens: int = 512

    def __len__(self) -> int:
        return len(self.requests)

    def due_s(self, speedup: float = 1.0, n: Optional[int] = None) -> np.ndarray:
        """When each of the first n requests (all: None) is due, s from the level's start."""
        ts = np.asarray([r.timestamp_ms for r in self.requests[:n]], dtype=float)
        return (ts - ts.min()) / 1e3 / speedup if len(ts) else ts


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _line_problem(obj, block_tokens: int, line: int) -> tuple[Optional[str], Optional[TraceRequest]]:
    """(what is wrong with line `line`, parsed, or None; the request it gives)."""
    if not isinstance(obj, dict):
        return f"{json.dumps(obj)[:40]}: expected a JSON object", None
    for key in ("timestamp", "input_length", "output_length"):
        if key not in obj:
            return (f"no {key}: expected timestamp (ms), input_length and output_length "
                    "(tokens), and optionally hash_ids"), None
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        return f"timestamp={json.dumps(ts)}: expected a time in ms >= 0", None
    for key in ("input_length", "output_length"):
        if not _positive_int(obj[key]):
            return f"{key}={json.dumps(obj[key])}: expected a positive integer", None
    ids = obj.get("hash_ids", [])
    if ids is None:
        ids = []
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool)
                                            and h >= 0 for h in ids):
        return f"hash_ids={json.dumps(ids)[:60]}: expected a list of integers >= 0", None
    holds = math.ceil(obj["input_length"] / block_tokens)
    if len(ids) > holds:
        return (f"hash_ids has {len(ids)} blocks of {block_tokens} tokens: expected at most "
                f"{holds}, what input_length={obj['input_length']} holds"), None
    return None, TraceRequest(line, float(ts), obj["input_length"], obj["output_length"], tuple(ids))


def read_trace(path: str, block_tokens: int = 512, key: str = "experiment.trace.path") -> Trace:
    """The trace at `path`, every line checked: TraceError naming each bad one
    (`path:line: what: expected ...`), at most MAX_LISTED of them, the rest counted."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"{key}={path!r}: no such file")
    requests, bad = [], []
    with open(p, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue  # a blank line (a trailing newline) is no request
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                why, req = f"not JSON ({e}): expected one JSON object a line", None
            else:
                why, req = _line_problem(obj, block_tokens, n)
            if why:
                bad.append(f"{path}:{n}: {why}")
            else:
                requests.append(req)
    if bad:
        more = f"\n    (and {len(bad) - MAX_LISTED} more bad lines)" if len(bad) > MAX_LISTED else ""
        raise TraceError(f"{key}={path!r}: {len(bad)} bad line(s), nothing sent:\n    "
                         + "\n    ".join(bad[:MAX_LISTED]) + more)
    if not requests:
        raise TraceError(f"{key}={path!r}: no requests in the file (expected one JSON object a line)")
    return Trace(str(path), requests, block_tokens)


def too_long(trace: Trace, max_model_len: int) -> list[str]:
    """The lines whose prompt and output do not fit a server of max_model_len tokens."""
    return [f"{trace.path}:{r.line}: input_length + output_length = "
            f"{r.input_length + r.output_length}: expected at most server.max_model_len="
            f"{max_model_len}" for r in trace.requests
            if r.input_length + r.output_length > max_model_len]
