"""What NCCL says it chose: algorithm, protocol and channels per collective, from its own log.

NCCL prints its choice for every collective with NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=TUNING:

    NCCL 2.23+: ``AllReduce: 7168 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}``
    before:     ``7168 Bytes -> Algo 1 proto 0 time 12.400000`` (numbers; op on the COLL line)

and the communicator's channel count at init (``24 coll channels, ...``). That logging costs
host time on every op, so it is never on while k25exp times: a separate short probe job
(one burst of each point, nothing timed) runs with it and its choices become tags.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

# NCCL's enum order (src/include/device.h); the pre-2.23 log prints these indices
ALGOS = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
PROTOS = ("LL", "LL128", "SIMPLE")

_CHOICE = re.compile(r"(?:(\w+): )?(\d+) Bytes -> Algo (\w+) proto (\w+)"
                     r"(?: channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\})?")
_CHANNELS = re.compile(r"(\d+) coll channels")


@dataclass(frozen=True)
class Choice:
    op: str  # AllReduce, AllGather, ... ("?" where the log line does not name it)
    nbytes: int  # as NCCL counts them: the per-rank send buffer (all-gather: one rank's part)
    algo: str
    proto: str
    channels: Optional[int]  # None where the log does not say


def _name(v: str, names: tuple[str, ...]) -> str:
    return names[int(v)] if v.isdigit() and int(v) < len(names) else v.upper()


def parse(lines: Iterable[str]) -> tuple[list[Choice], Optional[int]]:
    """Every choice in log order, and the communicator's coll channel count (None if absent)."""
    choices, channels = [], None
    for line in lines:
        if m := _CHOICE.search(line):
            op, nbytes, algo, proto, lo, hi = m.groups()
            choices.append(Choice(op or "?", int(nbytes), _name(algo, ALGOS), _name(proto, PROTOS),
                                  int(hi) - int(lo) + 1 if lo is not None else None))
        elif channels is None and (m := _CHANNELS.search(line)):
            channels = int(m.group(1))
    return choices, channels


def read_logs(folder: Path) -> tuple[list[Choice], Optional[int], int]:
    """Rank 0's choices (every rank chooses alike: NCCL's tuning is collective) from the probe's
    NCCL_DEBUG_FILE logs, its channel count, and how many rank logs there were."""
    logs = sorted(folder.glob("nccl.*.log"))
    per_log = [parse(p.read_text(errors="replace").splitlines()) for p in logs]
    with_choices = [x for x in per_log if x[0]]
    if not with_choices:
        return [], next((c for _, c in per_log if c), None), len(logs)
    choices, channels = with_choices[0]
    return choices, channels, len(logs)


NCCL_NAMES = {"all_reduce": "AllReduce", "all_gather": "AllGather"}


def measured_ops(spec) -> set[tuple[str, int]]:
    """(NCCL op name, bytes) of the ops the spec times. Everything else in the log is the
    worker's bookkeeping (barriers, gather_object of results), not measured."""
    from k25exp.dtypes import dtype_bytes

    size = dtype_bytes(spec.dtype)
    ops = {(op, numel) for p in spec.points for op, numel in (p.sequence or [(spec.op, p.numel)])}
    return {(NCCL_NAMES[op], numel * size) for op, numel in ops if op in NCCL_NAMES}


def only_measured(choices: list[Choice], spec) -> list[Choice]:
    """The choices for measured ops (by size alone where NCCL < 2.23 logged no op name): none
    for all-to-all (NCCL runs it as send/recv pairs, which log no TUNING line)."""
    want = measured_ops(spec)
    sizes = {b for _, b in want}
    return [c for c in choices if (c.op, c.nbytes) in want or (c.op == "?" and c.nbytes in sizes)]


def table(choices: list[Choice]) -> list[tuple[str, int, str, str, str, int]]:
    """Distinct (op, bytes) in first-seen order with the choice made, and how often it was made."""
    seen = Counter(choices)
    return [(c.op, c.nbytes, c.algo, c.proto, "?" if c.channels is None else str(c.channels), n)
            for c, n in seen.items()]


def summary(choices: list[Choice]) -> str:
    """One line per op: each algorithm/protocol and the byte range NCCL used it for, e.g.
    ``AllReduce: RING/LL 7168-1048576 B (ch 1-24); RING/SIMPLE 16777216 B (ch 24)``."""
    by_op: dict[str, dict[tuple[str, str], list[Choice]]] = {}
    for c in choices:
        by_op.setdefault(c.op, {}).setdefault((c.algo, c.proto), []).append(c)
    parts = []
    for op, groups in by_op.items():
        items = []
        for (algo, proto), cs in groups.items():
            lo, hi = min(c.nbytes for c in cs), max(c.nbytes for c in cs)
            chs = sorted({c.channels for c in cs if c.channels is not None})
            span = f"{lo} B" if lo == hi else f"{lo}-{hi} B"
            ch = "" if not chs else f" (ch {chs[0]})" if len(chs) == 1 else f" (ch {chs[0]}-{chs[-1]})"
            items.append(f"{algo}/{proto} {span}{ch}")
        parts.append(f"{op}: " + "; ".join(items))
    return " | ".join(parts)


def probe_spec(spec):
    """The measured spec as a probe: every point's burst once, nothing else (no warm-up, no
    check, no blocking or graph timing). NCCL picks per (op, bytes, ranks), so one call each
    shows what the timed run gets."""
    from dataclasses import replace

    points = [replace(p, reps=1, blocking_iters=0) for p in spec.points]
    return replace(spec, points=points, warmup=0, check=False, blocking=False, graph=False,
                   fault_kill_rank=None, fault_corrupt_rank=None)


def probe_env(folder: Path) -> dict[str, str]:
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,TUNING",
            "NCCL_DEBUG_FILE": str(folder / "nccl.%h.%p.log")}
