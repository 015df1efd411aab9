"""How much two starts of the same vLLM server differ, and where each start's processes ran.

    python -m benchmarks.server_start_spread [--starts 5] [--concurrency 1] [--requests 16] \
        [--levels 1] [--gap-s 0] [--sample-ms 20] [--out DIR] [OVERRIDE ...]
                                        # Hydra overrides, e.g. hardware.vllm_cpu_isa=avx2

Each start: the server launched as a k25exp job launches it (k25exp.serving, the macro's
launch key), --levels closed-loop levels of the macro runner --gap-s apart
(k25exp.runners.macro.run, tracking left out: 128 in / 64 out, greedy, warm-up first), then
the server is stopped. Several levels per start tell the spread between starts from the
machine's own drift over the same minutes. While the level
runs (from the moment the server is ready), every thread of the server's process tree
is sampled every --sample-ms (20 ms; 0 = not sampled: the sampler runs in the client's
process, on the cores it measures) from /proc
(/proc/<pid>/task/<tid>/stat: the CPU it last ran on, its user + system time), so each
process's CPU seconds during the level are split by the CPU they ran on.

Prints one row per start (client TPOT p50, the server's mean TPOT, CPU seconds of each process
kind by CPU) and the spread of the TPOTs (min, median, max, (max - min) / median): the part of
a cross-start comparison (the report's macro vs profile) that no part of the step explains.
Writes results.json to --out. Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import psutil
from hydra import compose, initialize_config_dir

from k25exp.config import register_configs
from k25exp.config.store import project_root
from k25exp.config.validate import to_typed
from k25exp.runners import macro
from k25exp.serving import registry, server
from k25exp.tracking import MemoryRecorder

TICK = os.sysconf("SC_CLK_TCK")


def kind(p: psutil.Process) -> str:
    """A process's role in vLLM's tree, from its title (vLLM sets VLLM::EngineCore etc.)."""
    try:
        name = " ".join(p.cmdline()[:3]) or p.name()
    except psutil.Error:
        return "?"
    for key, label in (("EngineCore", "engine_core"), ("Worker_TP", "worker"),
                       ("VllmWorker", "worker"), ("api_server", "api_server"),
                       ("resource_tracker", "helper")):
        if key in name:
            if label == "worker":
                tp = name.split("Worker_TP")[-1][:1] if "Worker_TP" in name else "?"
                return f"worker_tp{tp}"
            return label
    return p.name()


def thread_stats(pid: int) -> dict[int, tuple[int, float]]:
    """{tid: (cpu last run on, user + system seconds)} of one process's threads."""
    out = {}
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[int(tid)] = (int(fields[36]), (int(fields[11]) + int(fields[12])) / TICK)
            except (OSError, IndexError, ValueError):
                continue
    except OSError:
        pass
    return out


class Sampler(threading.Thread):
    """CPU seconds per (process kind, CPU) of a process tree while it runs (module docstring)."""

    def __init__(self, root: int, every_s: float = 0.02):
        super().__init__(daemon=True)
        self.root, self.every_s = root, every_s
        self.stop_ev = threading.Event()
        self.secs: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        self.affinity: dict[str, list[int]] = {}

    def tree(self) -> list[psutil.Process]:
        try:
            r = psutil.Process(self.root)
            return [r, *r.children(recursive=True)]
        except psutil.Error:
            return []

    def run(self) -> None:
        last: dict[tuple[int, int], float] = {}
        kinds: dict[int, str] = {}
        while not self.stop_ev.is_set():
            for p in self.tree():
                k = kinds.setdefault(p.pid, kind(p))
                if k not in self.affinity:
                    try:
                        self.affinity[k] = sorted(p.cpu_affinity())
                    except psutil.Error:
                        pass
                for tid, (cpu, s) in thread_stats(p.pid).items():
                    prev = last.get((p.pid, tid))
                    if prev is not None and s > prev:
                        self.secs[k][cpu] += s - prev
                    last[(p.pid, tid)] = s
            time.sleep(self.every_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--levels", type=int, default=1,
                    help="levels per start, --gap-s apart: the spread within a start, to set "
                         "beside the spread between starts")
    ap.add_argument("--gap-s", type=float, default=0.0)
    ap.add_argument("--sample-ms", type=float, default=20.0,
                    help="/proc sampling period; 0 = none (the sampler shares the client's "
                         "process and so the cores it measures)")
    ap.add_argument("--out", type=Path, default=Path("outputs/server_start_spread"))
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    register_configs()
    with initialize_config_dir(config_dir=str(project_root() / "conf"), version_base="1.3"):
        cfg = to_typed(compose("config", overrides=["experiment=macro", *a.overrides]))
    exp = replace(cfg.experiment, concurrency=[a.concurrency], requests=a.requests)
    cfg = replace(cfg, experiment=exp)
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(a.starts):
        folder = a.out / f"start{i}"
        sampler: Sampler | None = None

        def watch(before: int = len(registry.starts)) -> None:
            """Starts the sampler once this start is ready (registry.starts records it then):
            the level and its warm-up begin, the start-up is over."""
            nonlocal sampler
            while len(registry.starts) == before:
                time.sleep(0.2)
            sampler = Sampler(registry.starts[-1][2], a.sample_ms / 1e3)
            sampler.start()

        if a.sample_ms > 0:
            threading.Thread(target=watch, daemon=True).start()
        step = exp.step_of(a.concurrency)
        levels: list[dict] = []
        try:
            for j in range(a.levels):  # one server start: the registry reuses it (same key)
                if j:
                    time.sleep(a.gap_s)
                rec = MemoryRecorder()
                macro.run(cfg, folder / f"level{j}", rec)
                levels.append({"tpot_ms_p50": rec.latest("tpot_ms_p50").get(step),
                               "server_tpot_ms_mean": rec.latest("server_tpot_ms_mean").get(step),
                               "requests": rec.latest("completed").get(step)})
        finally:
            if sampler is not None:
                sampler.stop_ev.set()
            server.stop_all()
        srv = [v["server_tpot_ms_mean"] for v in levels if v["server_tpot_ms_mean"]]
        row = {"start": i, "levels": levels,
               "tpot_ms_p50": statistics.fmean(v["tpot_ms_p50"] for v in levels),
               "server_tpot_ms_mean": statistics.fmean(srv) if srv else None,
               "within_start_range_pct": 100 * (max(srv) - min(srv)) / statistics.fmean(srv)
               if len(srv) > 1 else None,
               "cpu_s": {k: {str(c): round(s, 2) for c, s in sorted(v.items())}
                         for k, v in (sampler.secs.items() if sampler else [])},
               "affinity": sampler.affinity if sampler else {}}
        rows.append(row)
        print(f"start {i}: client TPOT p50 {row['tpot_ms_p50']:.2f} ms, server mean "
              f"{row['server_tpot_ms_mean']:.2f} ms"
              + (f" (levels: {', '.join(f'{x:.2f}' for x in srv)})" if len(srv) > 1 else "")
              + f"; CPU s by process and CPU: {row['cpu_s']}; affinity {row['affinity']}",
              flush=True)
    t = [r["server_tpot_ms_mean"] for r in rows if r["server_tpot_ms_mean"]]
    if t:
        med = statistics.median(t)
        print(f"server mean TPOT over {len(t)} starts: min {min(t):.2f}, median {med:.2f}, "
              f"max {max(t):.2f} ms; (max - min) / median {100 * (max(t) - min(t)) / med:.1f} %")
    w = [r["within_start_range_pct"] for r in rows if r["within_start_range_pct"] is not None]
    if w:
        print(f"within one start ({a.levels} levels, {a.gap_s:g} s apart): (max - min) / mean "
              f"median {statistics.median(w):.1f} %, max {max(w):.1f} % over {len(w)} starts")
    (a.out / "results.json").write_text(json.dumps(
        {"how": f"each start: the macro's launch key, {a.levels} closed-loop level(s) of the "
                f"macro runner {a.gap_s:g} s apart (c = {a.concurrency}, {a.requests} requests, "
                "128 in / 64 out), then stopped; "
                f"threads sampled every {a.sample_ms:g} ms from /proc once the server was ready "
                "(0: not sampled)", "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
