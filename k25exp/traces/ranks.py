"""Which ranks the given traces are, of how many, and what a partial set can show.

Kineto records `distributedInfo` in each rank's trace: its `rank` and the job's
`world_size`. Given fewer traces than the job had ranks (2 of 128, say), every per-rank
figure still holds for the ranks given, but

* the wait/transport split (comm_split) matches each collective across the ranks given
  only: its "last arrival" is the last of those ranks, so time spent waiting for a rank not
  given reads as transport, and wait is a lower bound;
* the spread across ranks (min / median / max) is the spread of the ranks given, not of the
  job.

With two or more of a job's ranks but not all, `rank_set` says so in a warning; the metrics
carry `ranks_analysed` and `world_size`, and `Analysis.to_dict()["rank_set"]` the ranks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from k25exp.traces.reader import Trace

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)", re.I)


def rank_of(trace: Trace) -> int | None:
    """The trace's rank: distributedInfo.rank, else `rank<N>` in the file name."""
    info = trace.metadata.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return int(info["rank"])
    found = _RANK_IN_NAME.findall(trace.path.name)
    return int(found[-1]) if found else None


def world_size_of(trace: Trace) -> int | None:
    """distributedInfo.world_size, if the trace records a positive one."""
    info = trace.metadata.get("distributedInfo")
    ws = info.get("world_size") if isinstance(info, dict) else None
    return ws if type(ws) is int and ws > 0 else None


@dataclass
class RankSet:
    world_size: int | None   # None: not recorded, or the traces disagree
    ranks: list[int]         # the ranks given, ascending

    @property
    def complete(self) -> bool | None:
        """Whether every rank of the job is given; None when world_size is unknown."""
        if self.world_size is None:
            return None
        return set(self.ranks) == set(range(self.world_size))

    def to_dict(self) -> dict:
        return {"world_size": self.world_size, "ranks": self.ranks, "complete": self.complete}

    def metrics(self) -> dict[str, float]:
        out = {"ranks_analysed": float(len(self.ranks))}
        if self.world_size is not None:
            out["world_size"] = float(self.world_size)
        return out


def rank_set(labels: list[str], ranks: list[int], world_sizes: list[int | None]
             ) -> tuple[RankSet, list[str]]:
    """The set of ranks given, and warnings: traces that disagree on world_size, and what
    a partial set of a job's ranks can and cannot show."""
    known = {ws for ws in world_sizes if ws is not None}
    if len(known) > 1:
        each = ", ".join(f"{lb}: {ws}" for lb, ws in zip(labels, world_sizes))
        return RankSet(None, sorted(ranks)), [
            f"traces disagree on distributedInfo.world_size ({each}): not one job?"]
    rs = RankSet(known.pop() if known else None, sorted(ranks))
    # one rank has no split and no spread (a note says so): the set's figures suffice
    return rs, ([_partial_caveat(rs)] if rs.complete is False and len(ranks) > 1 else [])


def _partial_caveat(rs: RankSet) -> str:
    n = len(rs.ranks)
    return (f"partial set of ranks: {n} of {rs.world_size} ranks ({_spans(rs.ranks)}). The "
            "wait/transport split is only against the ranks given: wait is the time until the "
            f"last of these {n} arrived, and time spent waiting for a rank not given counts as "
            "transport. Per-rank shares hold for the ranks given; the spread across ranks "
            "(min/median/max) is theirs, not the job's.")


def _spans(ranks: list[int]) -> str:
    """'0, 1, 4-7': runs of three or more consecutive ranks as ranges."""
    out: list[str] = []
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        if j - i >= 2:
            out.append(f"{ranks[i]}-{ranks[j]}")
        else:
            out += [str(r) for r in ranks[i:j + 1]]
        i = j + 1
    return ", ".join(out)
