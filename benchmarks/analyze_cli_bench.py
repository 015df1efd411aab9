"""Benchmark: `k25exp analyze` as a user runs it: its start-up, and its cost per MB of trace.

On traces of a few MB, a whole `k25exp analyze` run is mostly the start of its process
(interpreter, numpy, the package). This measures both parts apart:

  start-up   the CLI on a minimal trace (one kernel in one vLLM decode step, 0.3 kB):
             interpreter start, imports, rules, one tiny read, the summary
  per MB     the slope of a least-squares line through the median run time of each trace
             size (MB of JSON, and MB on disk), from traces made by repeating a real
             one: default tests/traces/data/h200_decode_6steps.rank0.pt.trace.json.gz (a
             torch.profiler capture on an H200: kernels, runtime calls, CPU operators,
             flows, vLLM step annotations), cut or repeated to each size, each repeat
             shifted in time so it is a new stretch of the same run

Each file is analysed `--runs` times by `python -m k25exp analyze FILE` in a child process
(output discarded), the files taken in turn so load on a shared machine spreads over all of
them. Per run: wall clock (perf_counter around the child) and the child's CPU time (user +
system, from getrusage(RUSAGE_CHILDREN); counts the inflating thread too, and moves less
than wall clock on a loaded machine). Reported: median and min per file, then start-up and
per-MB figures from the medians.

    .venv/bin/python -m benchmarks.analyze_cli_bench [--runs 7] [--sizes 0.25,1,4,16,48]
        [--template TRACE] [--checkout DIR] [--json OUT]

`--checkout DIR` runs the CLI of another checkout (e.g. a `git worktree` of an older
commit) with this interpreter, to compare versions on the same traces.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout (benchmarks/ → ..)
TEMPLATE = ROOT / "tests" / "traces" / "data" / "h200_decode_6steps.rank0.pt.trace.json.gz"

MINIMAL = {
    "schemaVersion": 1,
    "traceEvents": [
        {"ph": "X", "cat": "gpu_user_annotation", "name": "execute_context_0(0)_generation_1(1)",
         "pid": 0, "tid": 7, "ts": 1000.0, "dur": 20.0},
        {"ph": "X", "cat": "kernel", "name": "nvjet_tst_128x64_64x8_1x2_h_bz_TNT", "pid": 0,
         "tid": 7, "ts": 1002.0, "dur": 10.0},
    ],
}


def _shifted(e: dict, k: int, span: float) -> dict:
    """Event e of copy k: `k * span` µs later; correlation and flow ids moved past every
    other copy's, so each copy links only within itself."""
    e = dict(e)
    if isinstance(e.get("ts"), (int, float)):
        e["ts"] = e["ts"] + k * span
    if e.get("ph") in ("s", "f") and isinstance(e.get("id"), int):
        e["id"] += k * 10**7
    args = e.get("args")
    if isinstance(args, dict) and isinstance(args.get("correlation"), int):
        e["args"] = {**args, "correlation": args["correlation"] + k * 10**7}
    return e


def make_traces(template: Path, sizes_mb: list[float], workdir: Path) -> list[Path]:
    """The minimal trace, then the template's events repeated (or cut) to about each size
    in MB of JSON, written as torch does (indented) and gzipped."""
    workdir.mkdir(parents=True, exist_ok=True)
    minimal = workdir / "minimal.pt.trace.json"
    minimal.write_text(json.dumps(MINIMAL))
    doc = json.loads(gzip.decompress(template.read_bytes()) if template.name.endswith(".gz")
                     else template.read_bytes())
    events = doc.pop("traceEvents")
    mb_per_event = len(json.dumps(events, indent=1)) / 1e6 / len(events)
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 100.0
    out = [minimal]
    for mb in sizes_mb:
        n = max(1, round(mb / mb_per_event))
        path = workdir / f"{template.name.split('.')[0][:12]}_{n}ev.pt.trace.json.gz"
        if not path.exists():
            cut = [_shifted(events[i % len(events)], i // len(events), span) for i in range(n)]
            text = json.dumps({**doc, "traceEvents": cut}, indent=1).encode()
            path.write_bytes(gzip.compress(text, 6))
        out.append(path)
    return out


def json_mb(path: Path) -> float:
    data = path.read_bytes()
    return len(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data) / 1e6


def run_once(checkout: Path, trace: Path) -> tuple[float, float]:
    """(wall s, CPU s) of one `python -m k25exp analyze TRACE`, run in `checkout`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "k25exp", "analyze", str(trace)], cwd=checkout,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"k25exp analyze {trace} failed (exit {p.returncode}): {p.stderr[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys on xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--sizes", default="0.25,1,4,16,48", help="MB of JSON of the sized traces")
    ap.add_argument("--template", type=Path, default=TEMPLATE)
    ap.add_argument("--checkout", type=Path, default=ROOT)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/k25exp-analyze-bench"))
    ap.add_argument("--json", type=Path, help="also write the results here")
    a = ap.parse_args()

    traces = make_traces(a.template, [float(x) for x in a.sizes.split(",")], a.workdir)
    runs: dict[Path, list[tuple[float, float]]] = {t: [] for t in traces}
    run_once(a.checkout.resolve(), traces[0])  # warm the page cache and .pyc files
    for _ in range(a.runs):
        for t in traces:
            runs[t].append(run_once(a.checkout.resolve(), t))

    rows = []
    for t in traces:
        wall, cpu = [r[0] for r in runs[t]], [r[1] for r in runs[t]]
        rows.append({"trace": t.name, "json_mb": json_mb(t), "disk_mb": t.stat().st_size / 1e6,
                     "wall_median_s": statistics.median(wall), "wall_min_s": min(wall),
                     "cpu_median_s": statistics.median(cpu), "cpu_min_s": min(cpu),
                     "wall_s": wall, "cpu_s": cpu})
    start, sized = rows[0], rows[1:]
    fit = {f"{what}_per_{mb}": slope([r[mb] for r in rows], [r[f"{what}_median_s"] for r in rows])
           for what in ("wall", "cpu") for mb in ("json_mb", "disk_mb")}
    print(f"# k25exp analyze ({a.checkout}), {a.runs} runs per file, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"#{'trace':>34}{'JSON MB':>9}{'disk MB':>9}{'wall med':>10}{'wall min':>10}"
          f"{'CPU med':>9}{'CPU min':>9}")
    for r in rows:
        print(f" {r['trace']:>34}{r['json_mb']:9.2f}{r['disk_mb']:9.2f}{r['wall_median_s']:10.3f}"
              f"{r['wall_min_s']:10.3f}{r['cpu_median_s']:9.3f}{r['cpu_min_s']:9.3f}")
    print(f"start-up (minimal trace): wall {start['wall_median_s']:.3f} s, CPU "
          f"{start['cpu_median_s']:.3f} s (medians)")
    print(f"per MB of JSON: wall {1e3 * fit['wall_per_json_mb']:.1f} ms, CPU "
          f"{1e3 * fit['cpu_per_json_mb']:.1f} ms; per MB on disk (gzip): wall "
          f"{1e3 * fit['wall_per_disk_mb']:.1f} ms, CPU {1e3 * fit['cpu_per_disk_mb']:.1f} ms "
          f"(least-squares slope of the medians over {len(rows)} files)")
    if sized:
        big = sized[-1]
        print(f"largest ({big['json_mb']:.1f} MB JSON): start-up is "
              f"{100 * start['wall_median_s'] / big['wall_median_s']:.0f} % of its wall time")
    if a.json:
        a.json.write_text(json.dumps({"checkout": str(a.checkout), "runs": a.runs, "files": rows,
                                      "fit": fit, "loadavg": os.getloadavg()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
