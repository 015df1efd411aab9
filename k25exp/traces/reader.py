"""Streaming reader for Kineto / Chrome trace JSON (`.json` or `.json.gz`, one file per rank).

Strategy, chosen by measurement (benchmarks/trace_analyzer_bench.py; on a 51 MB .json.gz of
2.7 M events, per 16 MiB of JSON: orjson 0.31 s, msgspec typed 0.075 s, ijson far slower):

* A background thread reads and gunzips the file (zlib releases the GIL, so inflating
  overlaps parsing on a second core) and hands over blocks of text.
* The text is parsed `chunk_bytes` at a time: cut at the last `},` (Kineto writes that only
  between events: nested objects close on their own line) and parsed as one JSON array by
  msgspec into typed structs of just ph/cat/name/pid/tid/ts/dur (args kept raw, decoded
  only for step annotations), skipping every other field without building it. A slice
  that ends inside a nested object or a string never parses as an array, so a successful
  parse proves the cut; other writers fall back to a bracket-and-string scanner. Values of
  unexpected types (a string ts) make that chunk go through orjson's generic parse; without
  msgspec, orjson does it all (about 3x slower).
* Only what the analysis needs is kept, in numpy arrays (name, category and lane codes,
  start and duration in integer ns, correlation id: ~33 bytes an event); python_function
  frames, runtime calls other than launches, flows and args are dropped chunk by chunk.
  Args are decoded only where the analysis reads them: step annotations' External id, and
  in one call per chunk the links of collective kernels, launches and record_param_comms.
* The events array's end is found by reading the text backwards (`_member_ends`): Kineto
  writes log arrays after it whose lines end in "...cpp:NNN]". Peak memory is a chunk of text, its
  parsed structs and the kept arrays, whatever the file's size.

Errors (missing, truncated or corrupt file, JSON without a `traceEvents` array, a trace with
no usable events) raise TraceError, whose message starts with the file's path.

Long because the chunked, validated streaming parse is one performance-critical path (see
the measurements below); splitting its parts would scatter one algorithm.
"""

from __future__ import annotations

import queue
import re
import threading
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter, eq, is_not
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import orjson

# Trace-event categories (Kineto's ActivityType names) the analysis reads. Device work:
# CUDA/ROCm kernels, memcpys and memsets (per stream), MTIA's device-side events, the
# memcpys/memsets of Kineto's Cambricon MLU fork (its kernels are "kernel" too). Host work:
# operators (counted by self time). Step markers: user annotations. Launches: the host's
# runtime/driver calls, whose `correlation` id a device event shares (what launched it).
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "mtia_ccp_events", "mlu_memcpy", "mlu_memset")
CPU_CATS = ("cpu_op",)
ANNOTATION_CATS = ("user_annotation", "gpu_user_annotation")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver", "mtia_runtime", "xpu_runtime", "xpu_driver",
               "privateuse1_runtime", "privateuse1_driver", "mlu_runtime")
# Of those calls, the launches (cudaLaunchKernel, cuLaunchKernelEx, cudaGraphLaunch,
# hipExtLaunchKernel, ...): only their correlation ids lead to kernels, and reading the
# args of every runtime call (stream queries, event records) would cost a tenth of a read.
LAUNCH_NAME = "aunch"
# and the copies and fills a step queues (cudaMemcpyAsync, cudaMemsetAsync, hipMemcpy...):
# the device-side step begins with its inputs' copy (k25exp.traces.device_copies)
LAUNCH_NAMES = (LAUNCH_NAME, "Memcpy", "Memset")


def _is_launch(name) -> bool:
    return any(k in name for k in LAUNCH_NAMES) if type(name) is str else False

# Known, and not work: Python frames, profiler overhead and markers, other host-side
# records, and device-side synchronisation records (waits, not work). A complete event of
# any category in none of these lists is counted as unrecognised and named in a warning.
OTHER_KNOWN_CATS = ("python_function", "overhead", "cpu_instant_event", "external_correlation",
                    "glow_runtime", "cuda_profiler_range", "hpu_op", "cuda_sync", "cuda_event",
                    "xpu_sync", "mlu_user_annotation", "mlu_profiler_range", "mlu_notifier",
                    "Trace")
# The host operator torch records a collective's parameters in; its args name the collective.
COMMS_OP = "record_param_comms"
# Annotations worth keeping: vLLM's step markers (execute_...), torch's ProfilerStep#N,
# gloo's worker-thread spans of the collectives they run (k25exp.traces.gloo) and vLLM's
# model-runner scopes (sample, draft, ...: k25exp.traces.step_phases).
ANNOTATION_PREFIXES = ("execute_", "ProfilerStep#", "gloo:", "gpu_model_runner: ")

DEFAULT_CHUNK_BYTES = 8 << 20

_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
# Tokens that matter for depth: whole strings (escapes included) and brackets.
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.S)


class TraceError(Exception):
    """A trace file could not be read; the message names the file."""

    def __init__(self, path: Path | str, reason: str):
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{path}: {reason}")


@dataclass
class Annotation:
    name: str
    cat: str
    start_ns: int
    end_ns: int
    lane: int
    ext_id: int | None = None   # args["External id"]: links a device annotation to its host one


@dataclass
class Trace:
    """What one rank's trace file holds that the analysis needs.

    Times are integer nanoseconds relative to `base_us` (the first kept event's start,
    truncated to a whole microsecond): exact arithmetic for unions and self time.
    `clock_offset_ns` leads back to the clock the ranks of one host share.
    """

    path: Path
    names: list[str]
    cats: list[str]
    lanes: list[tuple[Any, Any]]      # (pid, tid); for device events tid is the stream
    name_id: np.ndarray               # int32, per kept work event
    cat_id: np.ndarray                # int8
    lane_id: np.ndarray               # int32
    start_ns: np.ndarray              # int64
    dur_ns: np.ndarray                # int64
    annotations: list[Annotation]
    base_us: float
    metadata: dict[str, Any] = field(default_factory=dict)
    corr: np.ndarray | None = None    # int64 per kept work event: args.correlation, -1 if none
    coll: dict[int, str] = field(default_factory=dict)  # work event -> args["Collective name"]
    launches: Launches | None = None   # what launched each device event (by correlation)
    unrecognised: dict[str, int] = field(default_factory=dict)  # complete events, by category
    events_total: int = 0
    bytes_read: int = 0
    read_s: float = 0.0

    @property
    def n_events(self) -> int:
        return int(self.name_id.size)

    @property
    def clock_offset_ns(self) -> int:
        """Add to start_ns for the host's system clock (ns since the epoch), which every
        rank's trace is written on: Kineto writes `ts` relative to `baseTimeNanoseconds`
        (that clock floored to a ~3-month interval); writers without the key, absolute."""
        base = self.metadata.get("baseTimeNanoseconds")
        base = base if type(base) is int else 0
        return base + int(self.base_us) * 1000

    def has_device_work(self) -> bool:
        dev = [i for i, c in enumerate(self.cats) if c in DEVICE_CATS]
        return bool(dev) and bool(np.isin(self.cat_id, dev).any())


@dataclass
class Launches:
    """The host's runtime/driver calls that carry a correlation id (the id of the device
    event they launched), sorted by it: where (lane) and when each launch happened."""

    corr: np.ndarray       # int64, sorted
    lane: np.ndarray       # int32, into Trace.lanes
    start_ns: np.ndarray   # int64, on the trace's zero

    def find(self, corr: np.ndarray) -> np.ndarray:
        """Index of the launch of each correlation id, -1 where none was recorded."""
        i = np.searchsorted(self.corr, corr)
        ok = i < self.corr.size
        ok[ok] = self.corr[i[ok]] == corr[ok]
        return np.where(ok & (corr >= 0), i, -1)


class _Inflater:
    """Reads the file (gunzipping it if it starts with the gzip magic) in a background
    thread and hands over blocks of text: zlib releases the GIL while inflating, so
    decompression overlaps parsing on a second core. Errors are re-raised in the reader."""

    _END = object()

    def __init__(self, path: Path, block_bytes: int):
        self.path = path
        self.block_bytes = block_bytes
        self.q: queue.Queue = queue.Queue(maxsize=2)
        self.stop = threading.Event()
        self.bytes_out = 0
        try:
            self.f = open(path, "rb")
        except OSError as e:
            raise TraceError(path, f"cannot open: {e.strerror or e}") from e
        self.thread = threading.Thread(target=self._run, name="trace-inflate", daemon=True)
        self.thread.start()

    def _put(self, item) -> bool:
        while not self.stop.is_set():
            try:
                self.q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            f = self.f
            gz = f.read(2) == b"\x1f\x8b"
            f.seek(0)
            if not gz:
                while not self.stop.is_set():
                    data = f.read(self.block_bytes)
                    if not data:
                        break
                    if not self._put(data):
                        return
                self._put(self._END)
                return
            d = zlib.decompressobj(31)
            while not self.stop.is_set():
                raw = f.read(1 << 20)
                if not raw:
                    break
                out = d.decompress(raw)
                while d.eof and d.unused_data:  # a multi-member gzip file
                    rest = d.unused_data
                    if not rest.strip(b"\0"):
                        break
                    d = zlib.decompressobj(31)
                    out += d.decompress(rest)
                if out and not self._put(out):
                    return
            if self.stop.is_set():
                return
            if not d.eof:
                raise TraceError(self.path, "truncated gzip file (compressed stream ended early)")
            self._put(self._END)
        except zlib.error as e:
            self._put(TraceError(self.path, f"corrupt gzip data: {e}"))
        except TraceError as e:
            self._put(e)
        except OSError as e:
            self._put(TraceError(self.path, f"read failed: {e}"))
        except BaseException as e:  # pragma: no cover - unexpected; surface it in the reader
            self._put(e)

    def blocks(self) -> Iterator[bytes]:
        while True:
            item = self.q.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            self.bytes_out += len(item)
            yield item

    def close(self) -> None:
        self.stop.set()
        while True:
            try:
                self.q.get_nowait()
            except queue.Empty:
                break
        self.thread.join(timeout=5)
        self.f.close()


# Typed decoding: msgspec builds only these fields and skips the rest (args are kept raw,
# unparsed: only the events whose links the analysis reads have theirs decoded, a batch at
# a time, into _Args; decoding every event's args costs a third more). 4x faster than a
# generic parse on Kineto traces. Chunks that do not fit these types (a string ts, a
# non-object element) are parsed generically with orjson instead.
try:
    import msgspec

    class _Ev(msgspec.Struct, gc=False):
        ph: str = ""
        cat: str = ""
        name: str = ""
        pid: Any = None
        tid: Any = None
        ts: float = 0.0
        dur: float = 0.0
        args: msgspec.Raw = msgspec.Raw(b"null")

    class _Args(msgspec.Struct, gc=False):
        """The args the analysis reads; any other key is skipped unbuilt."""
        correlation: Any = None                                    # device event <-> launch
        ext: Any = msgspec.field(default=None, name="External id")  # device <-> host annotation
        coll: Any = msgspec.field(default=None, name="Collective name")  # NCCL kernels, ops

    _FAST = msgspec.json.Decoder(list[_Ev])
    _ARGS = msgspec.json.Decoder(list[Optional[_Args]])
    _ONE_ARGS = msgspec.json.Decoder(Optional[_Args])
    _FastError = msgspec.DecodeError
    _FastValidation = msgspec.ValidationError
except ImportError:  # pragma: no cover - msgspec comes with vLLM; orjson is the fallback
    _FAST = None

    class _FastError(Exception):  # type: ignore[no-redef]
        pass

    class _FastValidation(_FastError):  # type: ignore[no-redef]
        pass


def _decode(data: bytes, fast: bool) -> list | None:
    """Parses a JSON array; None on a syntax error (a cut in the wrong place)."""
    if fast and _FAST is not None:
        try:
            return _FAST.decode(data)
        except _FastValidation:
            pass
        except _FastError:
            return None
    try:
        v = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return v if isinstance(v, list) else None


def _scan_cut(buf: bytes) -> int:
    """Index just past the last '}' that closes a depth-one element of `buf` (which starts
    inside the events array, at depth one), or -1. Slow path for unusual writers."""
    depth = 0
    last = -1
    for m in _TOKENS.finditer(buf):
        c = m.group()[0]
        if c == 0x22:  # a string
            continue
        if c in (0x7B, 0x5B):  # { [
            depth += 1
        else:
            depth -= 1
            if depth == 0 and c == 0x7D:
                last = m.end()
            elif depth < 0:  # the array closed inside this buffer
                break
    return last


def _split(buf: bytes, fast: bool) -> tuple[list, bytes] | None:
    """Parses the longest prefix of `buf` that ends at an event boundary. Returns the
    events and the rest (starting after the separating comma), or None if no boundary."""
    end = len(buf)
    for _ in range(3):
        i = buf.rfind(b"},", 0, end)
        if i < 0:
            break
        events = _decode(b"[" + buf[: i + 1] + b"]", fast)
        if events is not None:
            return events, buf[i + 2:]
        end = i
    cut = _scan_cut(buf)
    if cut > 0:
        rest = buf[cut:].lstrip()
        if rest.startswith(b","):
            data = b"[" + buf[:cut] + b"]"
            events = _decode(data, fast)
            if events is not None:
                return events, rest[1:]
            try:  # a boundary at depth one that does not parse: the JSON itself is broken
                orjson.loads(data)
            except orjson.JSONDecodeError as e:
                raise _Invalid(str(e)) from None
    return None


class _Invalid(Exception):
    """The events array is not valid JSON (raised mid-file, before reading the rest)."""


def _split_last(buf: bytes, path: Path, bare: bool, fast: bool) -> tuple[list, dict]:
    """The last piece: remaining events, the array's ']' and (object form) the other
    top-level keys. The ']' is found by reading the JSON backwards (`_member_ends`), so the
    brackets inside strings after the events (Kineto's log lines, "...cpp:NNN]") are never
    taken for it; each candidate is checked by parsing what follows it and the events."""
    deferred: list[tuple[int, dict]] = []
    for i in (_bare_end(buf) if bare else _member_ends(buf)):
        meta = _rest_of_trace(buf[i + 1:], bare)
        if meta is None:
            continue
        if not _after_object(buf, i):
            # Kineto's events are objects and its log arrays hold strings: an array whose
            # last element is not an object is tried only if nothing else ends the events
            deferred.append((i, meta))
            continue
        events = _decode(b"[" + buf[:i] + b"]", fast)
        if events is not None:
            return events, meta
    for i, meta in deferred:
        events = _decode(b"[" + buf[:i] + b"]", fast)
        if events is not None:
            return events, meta
    raise _end_not_found(buf, path, bare)


_WHITESPACE = b" \t\r\n"
# Tokens of JSON text read backwards (its bytes reversed): whole strings and brackets. A '"'
# is escaped when an odd run of backslashes precedes it: reversed, when one follows it.
_RTOKENS = re.compile(rb'"(?:[^"]|"(?=\\(?:\\\\)*(?!\\)))*"|[\[\]{}]', re.S)


def _last_byte(buf: bytes, end: int) -> int:
    """Index of the last non-whitespace byte of buf[:end], or -1."""
    i = end - 1
    while i >= 0 and buf[i] in _WHITESPACE:
        i -= 1
    return i


def _bare_end(buf: bytes) -> list[int]:
    """A bare array ends the file: its ']' is the last byte that is not whitespace."""
    i = _last_byte(buf, len(buf))
    return [i] if i >= 0 and buf[i] == 0x5D else []


def _member_ends(buf: bytes) -> Iterator[int]:
    """Offsets of each ']' that closes a value of the top-level object, last first: `buf`
    (which starts inside the traceEvents array) is read backwards from the object's closing
    '}', whole strings at a time, keeping count of the brackets. Stops where the object's
    members end (or the text does not close an object)."""
    n = len(buf)
    j = _last_byte(buf, n)
    if j < 0 or buf[j] != 0x7D:  # "}"
        return
    rev = buf[::-1]
    depth = 0
    for m in _RTOKENS.finditer(rev):
        c = rev[m.start()]
        if c == 0x22:  # a string
            continue
        if c in (0x7D, 0x5D):  # } ]: read backwards, they open
            if c == 0x5D and depth == 1:
                yield n - 1 - m.start()
            depth += 1
        else:
            depth -= 1
            if depth < 1:  # past the object's start: not the trace object's members
                return


def _after_object(buf: bytes, i: int) -> bool:
    """Whether the last element before the ']' at i is an object (ends with '}')."""
    j = _last_byte(buf, i)
    return j >= 0 and buf[j] == 0x7D


def _rest_of_trace(tail: bytes, bare: bool) -> dict | None:
    """The top-level keys after the events array's ']', or None if `tail` is not what
    follows it: nothing (bare array), else `, "key": value, ... }` or just `}`."""
    t = tail.strip()
    if bare:
        return {} if not t else None
    if t == b"}":
        return {}
    if not t.startswith(b","):
        return None
    try:
        meta = orjson.loads(b"{" + t[1:])
    except orjson.JSONDecodeError:
        return None
    return meta if isinstance(meta, dict) else None


def _end_not_found(buf: bytes, path: Path, bare: bool) -> TraceError:
    """No ']' ends the events array: say what was expected, and what the JSON parser makes
    of the text (the usual cause is a truncated or corrupt file)."""
    expected = ("a ']' with nothing after it" if bare
                else "a ']' followed by the trace object's other keys and its closing '}'")
    msg = f"cannot find the end of the traceEvents array (expected {expected})"
    try:
        orjson.loads((b"[" if bare else b'{"traceEvents":[') + buf)
    except orjson.JSONDecodeError as e:
        msg += f": not valid JSON (truncated or corrupt file?): {e}"
    return TraceError(path, msg)


class _Pending:
    """Decompressed text not parsed yet, as a list of blocks (joined only when parsed)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, b: bytes) -> None:
        self.parts.append(b)
        self.size += len(b)

    def set(self, parts: list[bytes]) -> None:
        self.parts = [p for p in parts if p]
        self.size = sum(len(p) for p in self.parts)

    def joined(self) -> bytes:
        if len(self.parts) != 1:
            self.parts = [b"".join(self.parts)]
        return self.parts[0] if self.parts else b""


def _take(pending: _Pending, fast: bool) -> list | None:
    """Parses the pending text up to its last event boundary, copying it once (the join
    that builds the parser's input). Falls back to `_split` on a single buffer."""
    parts = pending.parts
    pi = len(parts) - 1
    end = None
    for _ in range(3):
        i = -1
        while pi >= 0:
            i = parts[pi].rfind(b"},", 0, end) if end is not None else parts[pi].rfind(b"},")
            if i >= 0:
                break
            pi -= 1
            end = None
        if i < 0:
            break
        data = b"".join([b"[", *parts[:pi], memoryview(parts[pi])[: i + 1], b"]"])
        events = _decode(data, fast)
        if events is not None:
            pending.set([parts[pi][i + 2:], *parts[pi + 1:]])
            return events
        end = i
    got = _split(pending.joined(), fast)
    if got is None:
        return None
    events, rest = got
    pending.set([rest])
    return events


def iter_event_chunks(path: Path | str, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                      meta: dict | None = None, fast: bool = True) -> Iterator[list]:
    """Yields the trace's events a chunk at a time: msgspec structs (fields ph, cat, name,
    pid, tid, ts, dur, args-as-raw-JSON) where the typed decoder fits, else dicts. Top-level
    keys other than traceEvents go into `meta` (if given) once the file has been read."""
    path = Path(path)
    inf = _Inflater(path, block_bytes=max(1 << 16, min(chunk_bytes // 4, 8 << 20)))
    blocks = inf.blocks()
    pending = _Pending()
    eof = False

    def fill(need: int) -> None:
        nonlocal eof
        while pending.size < need and not eof:
            b = next(blocks, None)
            if b is None:
                eof = True
                break
            pending.add(b)

    try:
        # 1. Find the start of the events array (an object's traceEvents, or a bare array).
        header: bytes | None = None
        while True:
            fill(pending.size + 1)
            buf = pending.joined()
            head = buf.lstrip()
            if head[:1] == b"[":
                pending.set([head[1:]])
                break
            if head and head[:1] != b"{":
                raise TraceError(path, "not a JSON trace (expected '{' or '[' at the start)")
            m = _EVENTS_KEY.search(buf)
            if m:
                header = buf[: m.start()]
                pending.set([buf[m.end():]])
                break
            if eof:
                if not head:
                    raise TraceError(path, "empty file")
                try:
                    orjson.loads(buf)
                except orjson.JSONDecodeError as e:
                    raise TraceError(path, f"not valid JSON (truncated or corrupt?): {e}") from None
                raise TraceError(path, "JSON has no traceEvents array: not a Chrome/Kineto trace")
        if header is not None:
            try:
                h = orjson.loads(header + b'"traceEvents":[]}')
            except orjson.JSONDecodeError as e:
                raise TraceError(path, f"not valid JSON before traceEvents: {e}") from None
            if meta is not None and isinstance(h, dict):
                h.pop("traceEvents", None)
                meta.update(h)

        # 2. Events, one chunk at a time; the file's end closes the array (and the object).
        need = chunk_bytes
        while True:
            fill(need)
            if eof:
                break
            try:
                events = _take(pending, fast)
            except _Invalid as e:
                raise TraceError(path, f"not valid JSON (corrupt file?): {e}") from None
            if events is None:  # no boundary yet (an event larger than a chunk): read more
                need = pending.size + chunk_bytes
                continue
            need = chunk_bytes
            yield events
        last, tail = _split_last(pending.joined(), path, header is None, fast)
        if meta is not None:
            meta.update(tail)
            meta["_bytes"] = inf.bytes_out
        if last:
            yield last
    finally:
        inf.close()


_G_CAT, _G_PH, _G_NAME, _G_PID, _G_TID, _G_TS, _G_DUR, _G_ARGS = (
    attrgetter(f) for f in ("cat", "ph", "name", "pid", "tid", "ts", "dur", "args"))
_KNOWN, _UNKNOWN = -1, -2   # category codes of the events that are not read


def _int_ids(values: list) -> np.ndarray:
    """Integer ids (correlation), -1 where missing or not an integer."""
    try:
        return np.array(values, dtype=np.int64).reshape(len(values))
    except (TypeError, ValueError, OverflowError):  # a missing one (None), or not a number
        return np.fromiter((v if type(v) is int and -2**63 <= v < 2**63 else -1 for v in values),
                           dtype=np.int64, count=len(values))


def _args_of(events: list) -> list:
    """The _Args (None where args is missing or not an object) of msgspec-decoded events,
    decoded in one call: their raw args joined into one JSON array."""
    raws = list(map(_G_ARGS, events))
    try:
        return _ARGS.decode(b"[" + b",".join(raws) + b"]")
    except msgspec.ValidationError:  # an args that is not an object: one at a time
        return [_one_args(r) for r in raws]


def _one_args(raw) -> Any:
    try:
        return _ONE_ARGS.decode(raw)
    except msgspec.ValidationError:
        return None


def _field(args: list, name: str) -> list:
    return list(map(getattr, args, repeat(name), repeat(None)))


def unrecognised_text(counts: dict[str, int]) -> str:
    """'cat (n), ...', most frequent first."""
    return ", ".join(f"{c or '(none)'} ({n})"
                     for c, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


class _Columns:
    """Accumulates the kept events of successive chunks as compact arrays.

    Names and lanes are interned with dict.setdefault driven from C (map), so the ids are
    unique but not contiguous; `finish` renumbers them 0..n-1 in first-seen order."""

    def __init__(self, linked: Callable[[str], bool] | None = None) -> None:
        self.linked = linked                 # which device events' links to read, by name
        self.linked_ids: dict[int, bool] = {}  # its answer per interned name id
        cats = DEVICE_CATS + CPU_CATS
        self.n_dev = len(DEVICE_CATS)
        self.n_work = len(cats)
        self.launch_code = self.n_work + len(ANNOTATION_CATS)   # codes from here on: launches
        self.code = {c: i for i, c in enumerate(cats + ANNOTATION_CATS + LAUNCH_CATS)}
        self.code.update(dict.fromkeys(OTHER_KNOWN_CATS, _KNOWN))
        self.names: dict[str, int] = {}
        self.lanes: dict[tuple, int] = {}
        self.next_id = 0
        self.name_id: list[np.ndarray] = []
        self.cat_id: list[np.ndarray] = []
        self.lane_id: list[np.ndarray] = []
        self.ts: list[np.ndarray] = []
        self.dur: list[np.ndarray] = []
        self.corr: list[np.ndarray] = []
        self.coll: dict[int, str] = {}
        self.annotations: list[tuple[str, str, float, float, int, Any]] = []
        self.launch_corr: list[np.ndarray] = []
        self.launch_lane: list[np.ndarray] = []
        self.launch_ts: list[np.ndarray] = []
        self.unrecognised: Counter[str] = Counter()
        self.n_total = 0
        self.n_kept = 0

    def _ids(self, table: dict, make_keys, n: int) -> np.ndarray:
        """Interned ids of the n keys that make_keys() iterates over."""
        c0 = self.next_id
        self.next_id += n
        try:
            return np.fromiter(map(table.setdefault, make_keys(), range(c0, c0 + n)),
                               dtype=np.int64, count=n)
        except TypeError:  # unhashable ids (a malformed trace): intern their text
            keys = (tuple(map(repr, k)) if isinstance(k, tuple) else repr(k) for k in make_keys())
            return np.fromiter(map(table.setdefault, keys, range(c0, c0 + n)),
                               dtype=np.int64, count=n)

    def _lane(self, pid: Any, tid: Any) -> int:
        return int(self._ids(self.lanes, lambda: [(pid, tid)], 1)[0])

    def add(self, events: list) -> None:
        self.n_total += len(events)
        if events and type(events[0]) is _EvType:
            self._add_structs(events)
        else:
            self._add_generic(events)

    def _add_structs(self, events: list) -> None:
        n = len(events)
        code = np.fromiter(map(self.code.get, map(_G_CAT, events), repeat(_UNKNOWN)),
                           dtype=np.int8, count=n)
        is_x = np.fromiter(map(eq, map(_G_PH, events), repeat("X")), dtype=bool, count=n)
        work = (code >= 0) & (code < self.n_work) & is_x
        k = int(work.sum())
        if k:
            kept = list(compress(events, work.tolist())) if k < n else events
            codes = code[work]
            name_ids = self._ids(self.names, lambda: map(_G_NAME, kept), k)
            self.name_id.append(name_ids)
            self.cat_id.append(codes)
            self.lane_id.append(self._ids(
                self.lanes, lambda: zip(map(_G_PID, kept), map(_G_TID, kept)), k))
            self.ts.append(np.fromiter(map(_G_TS, kept), dtype=np.float64, count=k))
            self.dur.append(np.fromiter(map(_G_DUR, kept), dtype=np.float64, count=k))
            self._add_links(kept, codes, name_ids)
        for i in np.flatnonzero((code >= self.n_work) & (code < self.launch_code) & is_x).tolist():
            e = events[i]
            if e.name.startswith(ANNOTATION_PREFIXES):
                self.annotations.append((e.name, e.cat, e.ts, e.dur, self._lane(e.pid, e.tid),
                                         getattr(_one_args(e.args), "ext", None)))
        launch = (code >= self.launch_code) & is_x
        if launch.any():
            calls = list(compress(events, launch.tolist()))
            calls = list(compress(calls, map(_is_launch, map(_G_NAME, calls))))
            self._add_launches(_int_ids(_field(_args_of(calls), "correlation")), lambda: zip(
                map(_G_PID, calls), map(_G_TID, calls)), list(map(_G_TS, calls)))
        unknown = (code == _UNKNOWN) & is_x
        if unknown.any():
            self.unrecognised.update(map(_G_CAT, compress(events, unknown.tolist())))

    def _add_links(self, kept: list, codes: np.ndarray, name_ids: np.ndarray) -> None:
        """Correlation ids of the device events (those `linked` names, if given), and
        "Collective name" where one of them or a record_param_comms operator (the only
        operator torch gives one) has it: read from C, only the few events that have a name
        reach Python."""
        k = len(kept)
        corr = np.full(k, -1, dtype=np.int64)
        dev = codes < self.n_dev
        if self.linked is not None and dev.any():
            dev[dev] = self._linked(name_ids[dev], kept, np.flatnonzero(dev))
        if dev.any():
            pos = np.flatnonzero(dev)
            devs = list(compress(kept, dev.tolist())) if pos.size < k else kept
            args = _args_of(devs)
            corr[pos] = _int_ids(_field(args, "correlation"))
            self._add_colls(_field(args, "coll"), pos)
        rpc = self.names.get(COMMS_OP)
        if rpc is not None:
            pos = np.flatnonzero((name_ids == rpc) & ~dev)
            self._add_colls(_field(_args_of([kept[i] for i in pos.tolist()]), "coll"), pos)
        self.corr.append(corr)
        self.n_kept += k

    def _linked(self, ids: np.ndarray, kept: list, pos: np.ndarray) -> np.ndarray:
        """Whether `linked` wants each of these events (interned name ids `ids`, events
        kept[pos]): asked once per name."""
        u, first, inv = np.unique(ids, return_index=True, return_inverse=True)
        for i, f in zip(u.tolist(), first.tolist()):
            if i not in self.linked_ids:
                self.linked_ids[i] = bool(self.linked(kept[int(pos[f])].name))  # type: ignore[misc]
        return np.array([self.linked_ids[i] for i in u.tolist()], dtype=bool)[inv.reshape(-1)]

    def _add_colls(self, colls: list, pos: np.ndarray) -> None:
        named = np.fromiter(map(is_not, colls, repeat(None)), dtype=bool, count=len(colls))
        for i in np.flatnonzero(named).tolist():
            if type(colls[i]) is str:
                self.coll[self.n_kept + int(pos[i])] = colls[i]

    def _add_launches(self, corr: np.ndarray, make_lanes, ts: list) -> None:
        lanes = self._ids(self.lanes, make_lanes, corr.size)
        try:
            t = np.array(ts, dtype=np.float64).reshape(corr.size)
        except (TypeError, ValueError):  # a launch without a usable time: not a link
            t = np.array([v if type(v) in (int, float) else np.nan for v in ts], dtype=np.float64)
        ok = (corr >= 0) & np.isfinite(t)
        self.launch_corr.append(corr[ok])
        self.launch_lane.append(lanes[ok])
        self.launch_ts.append(t[ok])

    def _add_generic(self, events: list) -> None:
        nm_l, cid, keys, ts_l, dur_l, corr_l, coll_l = [], [], [], [], [], [], []
        l_corr, l_keys, l_ts = [], [], []
        n_work = self.n_work
        for e in events:
            if type(e) is not dict or e.get("ph") != "X":
                continue
            c = e.get("cat")
            k = self.code.get(c, _UNKNOWN) if type(c) is str else _UNKNOWN
            if k == _UNKNOWN:
                self.unrecognised[c if type(c) is str else ""] += 1
            if k < 0:
                continue
            args = e.get("args")
            args = args if type(args) is dict else {}
            if k >= self.launch_code:
                if not _is_launch(e.get("name")):
                    continue
                l_corr.append(args.get("correlation"))
                l_keys.append((e.get("pid"), e.get("tid")))
                l_ts.append(e.get("ts"))
                continue
            try:
                ts = float(e["ts"])
                dur = float(e.get("dur", 0.0))
            except (KeyError, TypeError, ValueError):
                continue
            nm = e.get("name")
            if type(nm) is not str:
                nm = str(nm)
            if k >= n_work:
                if nm.startswith(ANNOTATION_PREFIXES):
                    self.annotations.append((nm, c, ts, dur, self._lane(e.get("pid"), e.get("tid")),
                                             args.get("External id")))
                continue
            nm_l.append(nm)
            cid.append(k)
            keys.append((e.get("pid"), e.get("tid")))
            ts_l.append(ts)
            dur_l.append(dur)
            link = k < self.n_dev and (self.linked is None or self.linked(nm))
            corr_l.append(args.get("correlation") if link else None)
            coll_l.append(args.get("Collective name") if link or nm == COMMS_OP else None)
        if nm_l:
            self.name_id.append(self._ids(self.names, lambda: nm_l, len(nm_l)))
            self.cat_id.append(np.array(cid, dtype=np.int8))
            self.lane_id.append(self._ids(self.lanes, lambda: keys, len(keys)))
            self.ts.append(np.array(ts_l, dtype=np.float64))
            self.dur.append(np.array(dur_l, dtype=np.float64))
            self.corr.append(_int_ids(corr_l))
            for i, v in enumerate(coll_l):
                if type(v) is str:
                    self.coll[self.n_kept + i] = v
            self.n_kept += len(nm_l)
        if l_corr:
            self._add_launches(_int_ids(l_corr), lambda: l_keys, l_ts)

    @staticmethod
    def _renumber(table: dict, ids: np.ndarray) -> tuple[list, np.ndarray]:
        items = sorted(table.items(), key=lambda kv: kv[1])
        old = np.fromiter((v for _, v in items), dtype=np.int64, count=len(items))
        lookup = np.zeros(int(old.max()) + 1 if old.size else 1, dtype=np.int32)
        lookup[old] = np.arange(old.size, dtype=np.int32)
        return [k for k, _ in items], lookup[ids]

    def finish(self) -> tuple[list[str], list[tuple], np.ndarray, np.ndarray, np.ndarray]:
        """Names, lanes, and the renumbered name ids, lane ids and launch lane ids."""
        names, name_id = self._renumber(self.names, np.concatenate(self.name_id))
        parts = [np.concatenate(self.lane_id),
                 np.array([a[4] for a in self.annotations], dtype=np.int64),
                 np.concatenate(self.launch_lane or [np.zeros(0, dtype=np.int64)])]
        lanes, both = self._renumber(self.lanes, np.concatenate(parts))
        a, b = parts[0].size, parts[0].size + parts[1].size
        self.annotations = [(*x[:4], int(ln), x[5]) for x, ln in
                            zip(self.annotations, both[a:b].tolist())]
        return names, lanes, name_id, both[:a], both[b:]


_EvType = _Ev if _FAST is not None else None


def read_trace(path: Path | str, chunk_bytes: int = DEFAULT_CHUNK_BYTES, fast: bool = True,
               linked: Callable[[str], bool] | None = None) -> Trace:
    """Reads one trace file, keeping only work events (device kernels, memcpys, memsets,
    MTIA device events; CPU operators), vLLM/torch step annotations, the host launches that
    link device events to what launched them, and a count of unrecognised event kinds.
    `linked(name)`: the device events whose links (correlation id, "Collective name") are
    read (default every one; the analysis asks for its collectives only). `fast=False`
    forces the generic orjson path (the one used when msgspec is missing)."""
    path = Path(path)
    t0 = time.perf_counter()
    cols = _Columns(linked)
    meta: dict[str, Any] = {}
    for events in iter_event_chunks(path, chunk_bytes, meta, fast):
        cols.add(events)
    nbytes = int(meta.pop("_bytes", 0))
    if cols.n_total == 0:
        raise TraceError(path, "empty trace: traceEvents holds no events")
    if not cols.name_id:
        unknown = (f"; events of unrecognised kinds: {unrecognised_text(cols.unrecognised)}"
                   if cols.unrecognised else "")
        raise TraceError(path, f"no device work events ({', '.join(DEVICE_CATS)}) and no CPU "
                               f"operator events among {cols.n_total} events: nothing to "
                               f"analyse{unknown}")
    names, lanes, name_id, lane_id, launch_lane = cols.finish()
    ts = np.concatenate(cols.ts)
    dur = np.maximum(np.concatenate(cols.dur), 0.0)
    base = float(np.floor(ts.min()))
    start_ns = np.rint((ts - base) * 1000.0).astype(np.int64)
    dur_ns = np.rint(dur * 1000.0).astype(np.int64)
    annotations = []
    for nm, c, a_ts, a_dur, ln, ext in cols.annotations:
        s = int(round((a_ts - base) * 1000.0))
        annotations.append(Annotation(nm, c, s, s + max(0, int(round(a_dur * 1000.0))), ln,
                                      ext if type(ext) is int else None))
    launch_corr = np.concatenate(cols.launch_corr or [np.zeros(0, dtype=np.int64)])
    order = np.argsort(launch_corr, kind="stable")
    launch_ts = np.concatenate(cols.launch_ts or [np.zeros(0)])[order]
    launches = Launches(launch_corr[order], launch_lane[order].astype(np.int32),
                        np.rint((launch_ts - base) * 1000.0).astype(np.int64))
    trace = Trace(
        path=path,
        names=names,
        cats=list(DEVICE_CATS + CPU_CATS),
        lanes=lanes,
        name_id=name_id,
        cat_id=np.concatenate(cols.cat_id),
        lane_id=lane_id,
        start_ns=start_ns,
        dur_ns=dur_ns,
        annotations=annotations,
        base_us=base,
        metadata=meta,
        corr=np.concatenate(cols.corr),
        coll=cols.coll,
        launches=launches,
        unrecognised=dict(cols.unrecognised),
        events_total=cols.n_total,
        bytes_read=nbytes,
        read_s=time.perf_counter() - t0,
    )
    from k25exp.traces import device_copies  # it reads Trace: imported here, not at the top

    host = device_copies.uncovered(trace)
    if host:
        # steps or scopes that launched work, with no gpu_user_annotation copy (CUDA graphs):
        # rebuilt from what launched each kernel, which needs every kernel's correlation id,
        # not only the linked ones' (uncovered found launches inside them: a re-read is worth it)
        if linked is not None:
            return read_trace(path, chunk_bytes, fast, None)
        device_copies.add(trace, host)
    if not any(device_copies.family(a.name) == "step" for a in host):
        device_copies.widen_steps(trace)  # Kineto's step copies over the step's own kernels only
    trace.read_s = time.perf_counter() - t0
    return trace
