"""A noisy neighbour: what a busy VM host does to the suite, on purpose.

Per core, a spinner pinned to it at raised priority takes the core away in random bursts
(exponential lengths, mean `--burst-ms`, capped at `--max-burst-ms`, about `--duty` of the
time). Plain busy loops at normal priority share the cores fairly and break little; bursts
that preempt the test's processes for tens of ms are what make a late wake-up, a held chunk or
a stub that catches up with back-to-back writes. Run the suite beside it:

    python benchmarks/noisy_neighbour.py 1500 & K25EXP_TEST_CPU_ISA=avx2 pytest

Raising priority needs root (or CAP_SYS_NICE); without it the spinners run at normal priority
and say so. Stops after `seconds`, or on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time


def spin(core: int, args: argparse.Namespace) -> None:
    os.sched_setaffinity(0, {core})
    try:
        os.nice(-args.nice)
    except PermissionError:
        print(f"core {core}: cannot raise priority (not root): spinning at normal priority",
              file=sys.stderr)
    rng, end = random.Random(args.seed + core), time.monotonic() + args.seconds
    while time.monotonic() < end:
        burst = min(rng.expovariate(1e3 / args.burst_ms), args.max_burst_ms / 1e3)
        t = time.perf_counter()
        while time.perf_counter() - t < burst:
            pass
        # idle for burst × (1 − duty) / duty on average: the core is taken ~duty of the time
        time.sleep(burst * (1 - args.duty) / args.duty * rng.uniform(0.5, 1.5))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("seconds", type=float)
    p.add_argument("--burst-ms", type=float, default=20.0, help="mean burst (ms)")
    p.add_argument("--max-burst-ms", type=float, default=150.0)
    p.add_argument("--duty", type=float, default=0.25, help="fraction of each core taken")
    p.add_argument("--nice", type=int, default=15, help="priority raise (needs root)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if not 0 < args.duty < 1:
        p.error(f"--duty={args.duty}: expected a fraction between 0 and 1")
    kids = []
    for core in sorted(os.sched_getaffinity(0)):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            spin(core, args)
            os._exit(0)
        kids.append(pid)

    def stop(*_):
        for pid in kids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for _ in kids:
        os.wait()


if __name__ == "__main__":
    main()
