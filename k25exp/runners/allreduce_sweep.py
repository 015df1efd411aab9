"""allreduce_sweep: AllReduce time and bandwidth over message sizes (nccl-tests table)."""

from __future__ import annotations

from pathlib import Path

from k25exp import plots, tables
from k25exp.collectives.results import bandwidths
from k25exp.collectives.spec import Point
from k25exp.config.experiments import AllReduceSweepConfig
from k25exp.config.schema import K25Config
from k25exp.dtypes import dtype_bytes
from k25exp.runners.collective import finish, make_spec, measure
from k25exp.tracking.recorder import Recorder
from k25exp.stats import suppressed

COLUMNS = [
    tables.Column("size(B)", "{}", 12), tables.Column("count", "{}", 12),
    tables.Column("type", "{}", 10), tables.Column("redop", "{}", 7),
    tables.Column("time(us)", "{:.2f}"), tables.Column("algbw(GB/s)", "{:.3f}"),
    tables.Column("busbw(GB/s)", "{:.3f}"), tables.Column("#wrong", "{}", 8),
    tables.Column("blk_p50(us)", "{:.2f}"), tables.Column("blk_p99(us)", "{:.2f}"),
    tables.Column("graph(us)", "{:.2f}"), tables.Column("g_busbw", "{:.3f}"),
]


def sizes(min_bytes: int, max_bytes: int, factor: int, elem: int) -> list[int]:
    """min, min·f, … up to max, rounded down to whole elements (as nccl-tests does)."""
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(max(elem, s // elem * elem))
        s *= factor
    return out


def run(cfg: K25Config, out: Path, rec: Recorder) -> dict[str, float]:
    exp: AllReduceSweepConfig = cfg.experiment
    world, elem = cfg.hardware.world_size, dtype_bytes(exp.dtype)
    points = [Point(label=b, numel=b // elem, burst=exp.ops_per_burst, reps=exp.bursts,
                    blocking_iters=exp.ops_per_burst)
              for b in sizes(exp.min_bytes, exp.max_bytes, exp.factor, elem)]
    spec = make_spec(cfg, "all_reduce", points)
    files, outcome = measure(cfg, spec, out, rec)

    rows, xs, bus, t_us = [], [], [], []
    for p in files.points:
        algbw, busbw = bandwidths(p.nbytes, p.queued_op_us * 1e-6, "all_reduce", world)
        m = {"time_us": p.queued_op_us, "algbw_gbps": algbw, "busbw_gbps": busbw,
             "wrong": p.wrong}
        if p.blocking_s:
            m.update(p.blocking_figures("blocking_us"))
        if p.graph_op_us is not None:
            m["time_us_graph"] = p.graph_op_us
            m["busbw_gbps_graph"] = bandwidths(p.nbytes, m["time_us_graph"] * 1e-6, "all_reduce", world)[1]
        rec.log_metrics(m, step=p.nbytes)
        rows.append([p.nbytes, p.numel, exp.dtype, "sum", p.queued_op_us, algbw, busbw, p.wrong,
                     m.get("blocking_us_p50"), m.get("blocking_us_p99", suppressed(m, "blocking_us_p99")),
                     m.get("time_us_graph"),
                     m.get("busbw_gbps_graph")])
        xs.append(p.nbytes), bus.append(busbw), t_us.append(p.queued_op_us)
    summary: dict[str, float] = {}
    if rows:
        summary = {"peak_busbw_gbps": max(bus), "avg_busbw_gbps": sum(bus) / len(bus)}
        rec.log_metrics(summary)
        title = f"AllReduce {exp.dtype}, {world} ranks, {cfg.hardware.backend}"
        plots.sweep(out / "plots" / "busbw_vs_size.png", xs, {"busbw": bus}, "message size (B)",
                    "busbw (GB/s)", title)
        plots.sweep(out / "plots" / "time_vs_size.png", xs, {"time (queued)": t_us},
                    "message size (B)", "time per op (µs)", title, logy=True)
    finish(out, COLUMNS, rows,
           f"allreduce_sweep: {exp.dtype}, {world} ranks, {cfg.hardware.backend}; "
           f"time = {exp.ops_per_burst} queued ops / {exp.ops_per_burst}, median of {exp.bursts} bursts",
           spec, files, outcome)
    return summary
