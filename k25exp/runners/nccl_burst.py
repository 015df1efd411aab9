"""nccl_burst: the AllReduce burst of one decode step (2 × layers ops of the decode message)."""

from __future__ import annotations

from pathlib import Path

from k25exp import plots, tables
from k25exp.collectives.results import bandwidths
from k25exp.collectives.spec import Point
from k25exp.config.schema import K25Config, NcclBurstConfig
from k25exp.dtypes import dtype_bytes
from k25exp.runners.collective import finish, make_spec, measure
from k25exp.tracking.recorder import Recorder

COLUMNS = [
    tables.Column("tokens", "{}", 8), tables.Column("size(B)", "{}", 10),
    tables.Column("ops", "{}", 6), tables.Column("burst(ms)", "{:.3f}"),
    tables.Column("queued(us)", "{:.2f}"), tables.Column("blk_mean(us)", "{:.2f}", 13),
    tables.Column("blk_p50(us)", "{:.2f}"), tables.Column("blk_p99(us)", "{:.2f}"),
    tables.Column("graph(ms)", "{:.3f}"), tables.Column("algbw(GB/s)", "{:.3f}"),
    tables.Column("busbw(GB/s)", "{:.3f}"), tables.Column("#wrong", "{}", 8),
    tables.Column("decode_share", "{:.3f}", 13),
]


def run(cfg: K25Config, out: Path, rec: Recorder) -> dict[str, float]:
    exp: NcclBurstConfig = cfg.experiment
    world = cfg.hardware.world_size
    point = Point(label=exp.tokens, numel=exp.message_bytes // dtype_bytes(exp.dtype),
                  burst=exp.ops_per_step, reps=exp.iters,
                  blocking_iters=exp.iters * exp.ops_per_step)
    spec = make_spec(cfg, "all_reduce", [point])
    files, outcome = measure(cfg, spec, out, rec)

    summary: dict[str, float] = {}
    rows = []
    for p in files.points:
        algbw, busbw = bandwidths(p.nbytes, p.queued_op_us * 1e-6, "all_reduce", world)
        m = {"burst_ms": p.burst_ms, "queued_op_us": p.queued_op_us,
             "algbw_gbps": algbw, "busbw_gbps": busbw, "wrong": p.wrong}
        if p.blocking_s:
            m.update(op_us_mean=p.blocking_us_mean, op_us_p50=p.blocking_us(50),
                     op_us_p99=p.blocking_us(99))
        if p.graph_burst_ms is not None:
            m["graph_burst_ms"] = p.graph_burst_ms
        if exp.reference_tpot_ms:
            m["decode_share"] = p.burst_ms / exp.reference_tpot_ms
        rec.log_metrics(m)
        summary.update(m)
        rows.append([p.label, p.nbytes, p.burst, p.burst_ms, p.queued_op_us, m.get("op_us_mean"),
                     m.get("op_us_p50"), m.get("op_us_p99"), m.get("graph_burst_ms"), algbw, busbw,
                     p.wrong, m.get("decode_share")])
        if p.blocking_s:
            plots.histogram(out / "plots" / "op_latency_hist.png", [s * 1e6 for s in p.blocking_s],
                            f"AllReduce {p.nbytes} B, {world} ranks, blocking",
                            {"p50": m["op_us_p50"], "p99": m["op_us_p99"]})
    finish(out, COLUMNS, rows,
           f"nccl_burst: {exp.ops_per_step} x AllReduce, {exp.dtype}, "
           f"{world} ranks, {cfg.hardware.backend}",
           spec, files, outcome)
    return summary
