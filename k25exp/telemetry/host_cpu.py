"""Whether a level had the host's CPUs to itself: the CPU time the host's other processes used
while it ran.

On a CPU server every core the engine does not get slows its step, and nothing in the
client's figures shows it: a 2-core machine's speculative server ran 1.5-2.3× slower in one
round while a test suite shared its cores, and every level stayed valid (the validity rules
judge the client and the delivery, not the server's neighbours). So each level takes two
snapshots, before and after its requests, of
  - the host's busy CPU time: user + nice + system + irq + softirq over every CPU
    (psutil.cpu_times, /proc/stat on Linux), and steal (time a hypervisor gave to another
    guest while this one wanted to run),
  - the CPU time of this job's process tree (the job: its client processes, the server it
    launched and its workers) and of the served engine's tree (server=endpoint on this
    host): user + system + children's user + system (psutil.Process.cpu_times).
Other = host busy − own, over the level's wall time, in cores. Summing children's times makes
a child that ended inside the level count in full once its parent reaped it: Σ own after −
Σ own before then holds its time since the first snapshot.

Verdict: the level shared its host when the others used more than
experiment.validity.host_other_cores_max cores on average (0.25: a quiet 2-core machine's
daemons use ~0.003; one busy neighbour process, up to a whole core). It is its own verdict, not
part of `valid`: the client's figures stand, the server's speed is what is in doubt, so
spec_decode leaves such rounds out of its medians (runners.spec_decode_results) and the
report such runs out of its points (report.spec_sweep).

What it cannot see: a neighbour the server starves. On a 2-core CPU, vLLM's CPU workers left
a spinning Python process, two of them, or a two-thread torch loop 0.00-0.12 cores while the
levels ran (their own /proc stat, read every second), so the levels read 0.003-0.06 cores of
others: whether such a neighbour slows the server is for repeats to tell, not this figure.
Nor a neighbour in another VM: that is steal (host_steal_cores, 0.19-0.58 cores on an H100
VM whose server starts took twice as long), reported, not judged. A process of the own trees
that ended unreaped by them counts as another's (errs toward "shared").
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Iterable, TypeVar

import psutil

T = TypeVar("T")


@dataclass(frozen=True)
class Snapshot:
    at_s: float        # time.monotonic() when taken
    busy_s: float      # every CPU's busy seconds since boot (user+nice+system+irq+softirq)
    steal_s: float     # every CPU's steal seconds since boot
    own_s: float       # the own trees' CPU seconds (each process's user+system+children's)
    processes: int     # processes in the own trees


def busy_seconds(t) -> float:
    """A psutil.cpu_times() tuple's busy seconds (Linux puts guest time inside user)."""
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


def tree_cpu_seconds(roots: Iterable[int]) -> tuple[float, int]:
    """CPU seconds of every process in the roots' trees (each once), and how many there were.
    A process that ends while it is read counts 0 (its parent's children's times hold it once
    reaped)."""
    seen: set[int] = set()
    total = 0.0
    for pid in roots:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in procs:
            if p.pid in seen:
                continue
            seen.add(p.pid)
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system + t.children_user + t.children_system
    return total, len(seen)


def snapshot(roots: Iterable[int]) -> Snapshot:
    """The host's and the own trees' CPU time now."""
    own, n = tree_cpu_seconds(roots)
    t = psutil.cpu_times()
    return Snapshot(time.monotonic(), busy_seconds(t), getattr(t, "steal", 0.0), own, n)


def figures(before: Snapshot, after: Snapshot, cpus: int, max_other_cores: float) -> dict[str, float]:
    """The level's host figures in cores (1.0 = one CPU busy all the time), and the verdict:
      host_cpus           CPUs this job may run on
      host_busy_cores     every process on the host
      host_own_cores      this job's tree and the served engine's
      host_other_cores    the rest (never below 0: the counters are read apart in time)
      host_steal_cores    time the hypervisor gave to another guest
      host_shared         1 when host_other_cores > max_other_cores"""
    wall = after.at_s - before.at_s
    if wall <= 0:
        return {}
    busy = (after.busy_s - before.busy_s) / wall
    own = max(0.0, (after.own_s - before.own_s) / wall)
    other = max(0.0, busy - own)
    return {"host_cpus": float(cpus), "host_busy_cores": busy, "host_own_cores": own,
            "host_other_cores": other,
            "host_steal_cores": max(0.0, (after.steal_s - before.steal_s) / wall),
            "host_shared": float(other > max_other_cores)}


def prefer_alone(items: list[T], valid: Callable[[T], bool], shared: Callable[[T], bool]
                 ) -> tuple[list[T], str]:
    """What a point keeps of its measurements (a run's rounds, a campaign's runs): those valid
    and alone on their host; with none, the valid ones on a shared host (a loaded machine
    still gets its figures, marked); with none valid, all (marked invalid). The second value
    says which: "alone", "shared" or "invalid"."""
    ok = [x for x in items if valid(x)]
    if alone := [x for x in ok if not shared(x)]:
        return alone, "alone"
    return (ok, "shared") if ok else (list(items), "invalid")


def own_roots(engine: Iterable[int] = ()) -> list[int]:
    """The roots whose trees are this job's own: the job's process (its client processes, the
    server it launched) and the served engine's listeners (server=endpoint on this host)."""
    return [os.getpid(), *sorted(set(engine) - {os.getpid()})]


def describe(figs: dict[str, float], limit: float) -> str:
    """One line for a level that shared its host."""
    return (f"the host was shared: processes outside this job and its server used "
            f"{figs['host_other_cores']:.2f} cores on average (limit {limit:g}; "
            f"{figs['host_cpus']:.0f} CPUs, {figs['host_busy_cores']:.2f} busy, "
            f"{figs['host_own_cores']:.2f} of them this job's)")
