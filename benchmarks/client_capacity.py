"""How many streamed chunks per second k25exp's client keeps up with, per process count.

    python -m benchmarks.client_capacity --streams 64 128 256 --steps-ms 20 10 5 \
        --processes 1 2 4 [--loop auto] [--runs 2] [--output-tokens 64]

Against the stub server (tests.serving.stub_server) in its own process, in step mode: like
vLLM's engine, every step it writes the next chunk of every stream in flight (vLLM's
completion chunk with continuous usage), so the load offered is streams / step chunks a
second, TPOT is the step while the stub keeps up, and chunks of concurrent streams arrive
together. For each (streams C, step, processes P): a warm-up round, then a closed loop of C
streams, 4 × C requests of --output-tokens tokens, sent exactly as the macro runner sends a
level (one process: client.run_level; several: shards.ShardPool), judged by the macro runner's
absolute rule (experiment.validity.rule=absolute, max_client_lag_ms 20; k25exp.load.validity),
its default before the relative one, so the capacities stay comparable with earlier runs: the
busiest process's CPU, the laggiest process's event-loop lag, the send lag. Columns: chunks/s received over the level's
wall time, CPU µs per chunk (all client processes' CPU / chunks: the cost, less sensitive to
other load on the machine than the rates), TTFT p50 (a backlogged client shows it here first:
its chunks are stamped late by a steady delay that TPOT does not see), the stub's own CPU
(near 1.0 = the server, not the client, was the limit).

What one process "sustains" is the highest chunk rate of a row that was not flagged.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from statistics import mean, median

import psutil

from k25exp.load import loops
from k25exp.load.client import CompletionClient, run_level
from k25exp.load.level_figures import level_figures
from k25exp.serving.ports import free_port
from k25exp.load.shards import ShardPool, Prompts

MAX_LAG_MS = 20.0  # experiment.max_client_lag_ms, the absolute rule's limit (level_figures' default rule)


def start_stub(step_ms: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "tests.serving.stub_server", "--port", str(port),
                          "--step-ms", str(step_ms)], stdout=subprocess.PIPE, text=True)
    p.stdout.readline()  # "stub completions server on ..."
    return p, f"http://127.0.0.1:{port}"


async def one_process(url: str, c: int, n: int, out: int) -> dict:
    async with CompletionClient(url, "stub", max_connections=c + 4) as cl:
        cl.prepare(c)
        kw = dict(phase="sweep", level=c, concurrency=c, max_tokens=out, t0=time.perf_counter())
        await run_level(cl, lambda i: "fine", n_requests=c, **kw)  # warm-up: connections open
        return await run_level(cl, lambda i: "fine", n_requests=n, **kw)


async def processes(pool: ShardPool, P: int, c: int, n: int, out: int) -> dict:
    kw = dict(phase="sweep", level=c, concurrency=c, max_tokens=out, t0=time.perf_counter(),
              duration_s=None)
    await pool.run_closed(Prompts({i: "fine" for i in range(c)}), n_requests=c, processes=P, **kw)
    return await pool.run_closed(Prompts({i: "fine" for i in range(n)}), n_requests=n,
                                 processes=P, **kw)


def row(res: dict, c: int, step_ms: float, P: int, stub_cpu: float) -> dict:
    recs = res["records"]
    f = level_figures(recs, res["wall_s"], res["cpu_s"], res["loop_lag_ms"], MAX_LAG_MS,
                      loop_lag_by_process=res.get("loop_lag_ms_by_process"))
    chunks = sum(len(r["chunk_s"]) for r in recs if r["ok"])
    cpu_all = res.get("cpu_s_total", res["cpu_s"])
    return {"c": c, "step_ms": step_ms, "P": P, "offered": c / step_ms * 1e3,
            "chunks_s": chunks / res["wall_s"], "us_chunk": cpu_all / max(chunks, 1) * 1e6,
            "cpu": f.get("client_cpu_util", 0.0), "loop_mean": f.get("client_loop_lag_ms_mean", 0.0),
            "loop_p99": f.get("client_loop_lag_ms_p99", 0.0), "lag_p99": f.get("client_lag_ms_p99", 0.0),
            "tpot": f.get("tpot_ms_p50", float("nan")), "ttft": f.get("ttft_ms_p50", float("nan")),
            "errors": f["errors"], "stub_cpu": stub_cpu, "lagged": f["client_lagged"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--steps-ms", type=float, nargs="+", default=[20.0, 10.0, 5.0])
    ap.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--loop", default="auto", choices=loops.CHOICES)
    ap.add_argument("--runs", type=int, default=1, help="runs of each point (noise)")
    ap.add_argument("--output-tokens", type=int, default=64)
    a = ap.parse_args()
    print(f"# client event loop {loops.version(a.loop)}; {psutil.cpu_count()} CPUs; "
          f"{a.output_tokens} tokens a request, 4 x C requests a point; flagged = the macro "
          f"runner's client-lag rule at {MAX_LAG_MS:g} ms", flush=True)
    print(f"{'C':>4} {'step':>5} {'P':>2} {'offered':>8} {'chunks/s':>9} {'us/chunk':>8} "
          f"{'cpu':>5} {'loop':>6} {'loop99':>7} {'lag99':>6} {'tpot':>6} {'ttft':>7} "
          f"{'stub':>5} {'err':>4} flagged", flush=True)
    rows = []
    pools = {P: ShardPool(dict(base_url="http://127.0.0.1:1", model="stub"), a.loop)
             for P in a.processes if P > 1}
    try:
        for step in a.steps_ms:
            stub, url = start_stub(step)
            try:
                for P, pool in pools.items():  # the stub's URL changed: fresh processes
                    pool.close()
                    pool.client_kw = dict(base_url=url, model="stub",
                                          max_connections=max(a.streams) + 4)
                for _ in range(a.runs):
                    for c in a.streams:
                        for P in a.processes:
                            sp = psutil.Process(stub.pid)
                            t, s0 = time.perf_counter(), sum(sp.cpu_times()[:2])
                            if P == 1:
                                res = loops.run(one_process(url, c, 4 * c, a.output_tokens), a.loop)
                            else:
                                res = loops.run(processes(pools[P], P, c, 4 * c, a.output_tokens),
                                                a.loop)
                            stub_cpu = (sum(sp.cpu_times()[:2]) - s0) / (time.perf_counter() - t)
                            r = row(res, c, step, P, stub_cpu)
                            rows.append(r)
                            print(f"{c:4d} {step:5g} {P:2d} {r['offered']:8.0f} {r['chunks_s']:9.0f} "
                                  f"{r['us_chunk']:8.1f} {r['cpu']:5.2f} {r['loop_mean']:6.1f} "
                                  f"{r['loop_p99']:7.1f} {r['lag_p99']:6.1f} {r['tpot']:6.2f} "
                                  f"{r['ttft']:7.1f} {r['stub_cpu']:5.2f} {r['errors']:4.0f} "
                                  f"{'LAGGED' if r['lagged'] else ''}", flush=True)
            finally:
                stub.terminate()
                stub.wait(10)
    finally:
        for pool in pools.values():
            pool.close()
    print("# per process count: the highest chunk rate of a point not flagged; median CPU us "
          "per chunk over all points")
    for P in a.processes:
        mine = [r for r in rows if r["P"] == P]
        good = [r["chunks_s"] for r in mine if not r["lagged"] and not r["errors"]]
        print(f"P={P}: sustained {max(good) if good else 0:.0f} chunks/s unflagged; "
              f"{median(r['us_chunk'] for r in mine):.1f} us/chunk (mean of runs "
              f"{mean(r['us_chunk'] for r in mine):.1f})", flush=True)


if __name__ == "__main__":
    main()
