"""Whose CPU time a level's host figures count (k25exp.telemetry.host_cpu), with real
processes: a burner reports its own CPU seconds (time.process_time, read by itself, not by
psutil), and the snapshots must find at least that much in the tree that holds it, or, when
no tree holds it, in the others'. CPU seconds, not wall time: a loaded machine gives the
burner less CPU, and it reports less."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from k25exp.telemetry import host_cpu

# spins until it has used `cpu` CPU seconds, then prints them (no wall-clock bound: a loaded
# machine only makes it take longer)
BURN = ("import time,sys\ncpu=float(sys.argv[1])\n"
        "while time.process_time()<cpu: pass\n"
        "print(time.process_time(), flush=True)\n")
# a child that runs the burner as its own child (a grandchild of the test), reaps it and
# reports what it used
PARENT = ("import subprocess,sys\np=subprocess.Popen([sys.executable,'-c',sys.argv[1],sys.argv[2]],"
          "stdout=subprocess.PIPE,text=True)\nprint(p.communicate()[0].strip(), flush=True)\n")
TICK = 0.02  # /proc's clock ticks (10 ms) read twice


def burn_in_tree(cpu: float) -> float:
    """A grandchild burns `cpu` CPU seconds and is reaped by its parent, which is reaped
    here: the CPU seconds it says it used."""
    out = subprocess.run([sys.executable, "-c", PARENT, BURN, str(cpu)], capture_output=True,
                         text=True, check=True).stdout
    return float(out.strip())


def test_a_grandchild_reaped_inside_the_window_counts_as_the_trees_own():
    before = host_cpu.snapshot([os.getpid()])
    used = burn_in_tree(0.3)
    after = host_cpu.snapshot([os.getpid()])
    assert used >= 0.3
    # the burner ended and was reaped twice: its time reaches us as children's time
    assert after.own_s - before.own_s >= used - TICK
    # the host's busy time holds it as well
    assert after.busy_s - before.busy_s >= used - TICK


def cpu_by_hand(pid: int) -> float:
    """utime + stime of a process from its /proc stat line (fields 14 and 15, in ticks)."""
    stat = open(f"/proc/{pid}/stat").read()
    fields = stat[stat.rindex(")") + 2:].split()  # from field 3 (state) on
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_live_descendant_counts_while_it_runs():
    p = subprocess.Popen([sys.executable, "-c", PARENT, BURN, "30"], stdout=subprocess.PIPE,
                         text=True)
    burner = None
    try:
        while burner is None and p.poll() is None:  # the grandchild, as the kernel lists
            kids = open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()  # its parent's
            burner = int(kids[0]) if kids else None
            time.sleep(0.05)
        assert burner is not None
        before, b0 = host_cpu.snapshot([os.getpid()]), cpu_by_hand(burner)
        assert before.processes >= 3  # this process, the child, the burner
        while cpu_by_hand(burner) - b0 < 0.1:  # however long a loaded machine takes
            time.sleep(0.1)
        after, b1 = host_cpu.snapshot([os.getpid()]), cpu_by_hand(burner)
        # the own tree's CPU over the window holds the burner's (read apart by a tick or two)
        assert after.own_s - before.own_s >= (b1 - b0) - TICK
    finally:
        for pid in (burner, p.pid):
            if pid is not None:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
        p.communicate()


def test_cpu_outside_every_own_tree_is_the_others():
    before = host_cpu.snapshot([])  # no own tree: everything the host did is another's
    used = burn_in_tree(0.3)
    after = host_cpu.snapshot([])
    figs = host_cpu.figures(before, after, cpus=2, max_other_cores=0.25)
    wall = after.at_s - before.at_s
    assert figs["host_own_cores"] == 0.0
    assert figs["host_other_cores"] * wall >= used - TICK


def test_figures_and_verdict_by_hand():
    # 10 s; the host 18 busy s (1.8 cores), this job 15 s (1.5), the rest 0.3 cores; steal 0.5 s
    a = host_cpu.Snapshot(at_s=100.0, busy_s=1000.0, steal_s=5.0, own_s=40.0, processes=3)
    b = host_cpu.Snapshot(at_s=110.0, busy_s=1018.0, steal_s=5.5, own_s=55.0, processes=4)
    figs = host_cpu.figures(a, b, cpus=2, max_other_cores=0.25)
    assert figs == pytest.approx({"host_cpus": 2.0, "host_busy_cores": 1.8, "host_own_cores": 1.5,
                                  "host_other_cores": 0.3, "host_steal_cores": 0.05,
                                  "host_shared": 1.0})
    assert host_cpu.figures(a, b, cpus=2, max_other_cores=0.5)["host_shared"] == 0.0
    # the own tree read later than the host's counter: never below 0 others
    c = host_cpu.Snapshot(at_s=110.0, busy_s=1014.0, steal_s=5.0, own_s=55.0, processes=4)
    assert host_cpu.figures(a, c, cpus=2, max_other_cores=0.25)["host_other_cores"] == 0.0
    assert "0.30 cores on average (limit 0.25; 2 CPUs, 1.80 busy, 1.50 of them this job's)" in (
        host_cpu.describe(figs, 0.25))


def test_prefer_alone_keeps_the_clean_then_the_valid_then_all():
    # (name, valid, shared)
    a, b, c = ("a", True, False), ("b", True, True), ("c", False, False)
    pick = lambda xs: host_cpu.prefer_alone(xs, lambda x: x[1], lambda x: x[2])  # noqa: E731
    assert pick([a, b, c]) == ([a], "alone")
    assert pick([b, c]) == ([b], "shared")
    assert pick([c]) == ([c], "invalid")
