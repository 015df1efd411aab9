"""nccl_burst: a decode step's collectives, timed as one burst and op by op.

By default the burst is the step's collectives as vLLM runs them at TP = world size
(k25exp.collectives.step: the embedding all-reduce, 2 all-reduces per layer, the logits
all-gather), through `experiment.communicator` (vLLM's own by default: the path the server
runs). `experiment.ops_per_step=N` times N all-reduces of the per-layer message instead
(the seed campaign's burst). Artifacts: step_collectives.txt/.csv (the ops in step order,
with each op's blocking latency), results.txt/.csv.
"""

from __future__ import annotations

import re

from pathlib import Path

from k25exp import plots, tables
from k25exp.collectives.spec import Point
from k25exp.collectives.step import decode_step_ops, uniform_ops
from k25exp.config.experiments import NcclBurstConfig
from k25exp.config.schema import K25Config
from k25exp.dtypes import dtype_bytes
from k25exp.runners.collective import finish, make_spec, measure
from k25exp.tracking.recorder import Recorder
from k25exp.stats import suppressed

COLUMNS = [
    tables.Column("tokens", "{}", 8), tables.Column("bytes/step", "{}", 12),
    tables.Column("ops", "{}", 6), tables.Column("burst(ms)", "{:.3f}"),
    tables.Column("wait(ms)", "{:.3f}"), tables.Column("transport(ms)", "{:.3f}", 14),
    tables.Column("queued(us)", "{:.2f}"), tables.Column("blk_mean(us)", "{:.2f}", 13),
    tables.Column("blk_p50(us)", "{:.2f}"), tables.Column("blk_p99(us)", "{:.2f}"),
    tables.Column("ar_ms/step", "{:.3f}"), tables.Column("ag_ms/step", "{:.3f}"),
    tables.Column("graph(ms)", "{:.3f}"), tables.Column("algbw(GB/s)", "{:.3f}"),
    tables.Column("busbw(GB/s)", "{:.3f}"), tables.Column("#wrong", "{}", 8),
    tables.Column("decode_share%", "{:.1f}", 14),
]
STEP_COLUMNS = [tables.Column("#", "{}", 5), tables.Column("name", "{}", 14),
                tables.Column("op", "{}", 12), tables.Column("elems/rank", "{}", 12),
                tables.Column("bytes(S)", "{}", 12), tables.Column("blk_p50(us)", "{:.2f}")]


def step_ops(cfg: K25Config):
    exp: NcclBurstConfig = cfg.experiment
    b = dtype_bytes(exp.dtype)
    if exp.ops_per_step is not None:
        return uniform_ops(exp.ops_per_step, exp.message_bytes // b, b)
    m = cfg.model
    return decode_step_ops(m.hidden_size, m.num_hidden_layers, m.vocab_size,
                           cfg.hardware.world_size, exp.tokens, b, exp.logits_op)


def run(cfg: K25Config, out: Path, rec: Recorder) -> dict[str, float]:
    exp: NcclBurstConfig = cfg.experiment
    world = cfg.hardware.world_size
    ops = step_ops(cfg)
    point = Point(label=exp.tokens, numel=exp.message_bytes // dtype_bytes(exp.dtype),
                  burst=len(ops), reps=exp.bursts, blocking_iters=exp.bursts * len(ops),
                  sequence=[[o.op, o.numel] for o in ops])
    spec = make_spec(cfg, "step", [point])
    step = {"ops_per_step": len(ops), "bytes_per_step": sum(o.nbytes for o in ops)}
    rec.log_metrics(step)
    rec.set_tags({"nccl_burst.sequence": "the decode step's collectives (2 x layers + 2)"
                  if exp.ops_per_step is None else f"{exp.ops_per_step} all-reduces of "
                  f"{exp.message_bytes} B (experiment.ops_per_step)"})
    files, outcome = measure(cfg, spec, out, rec)

    summary: dict[str, float] = dict(step)
    rows = []
    for p in files.points:
        # bandwidth of the step's bytes over the burst; bus bytes per op kind (nccl-tests'
        # factors: an all-reduce's 2(n − 1)/n, the logits all-gather's (n − 1)/n)
        algbw = p.nbytes / (p.burst_ms * 1e-3) / 1e9
        busbw = p.bus_bytes(world) / (p.burst_ms * 1e-3) / 1e9
        m = {"burst_ms": p.burst_ms, "queued_op_us": p.queued_op_us,
             "algbw_gbps": algbw, "busbw_gbps": busbw, "wrong": p.wrong}
        if p.blocking_s:
            m.update(op_us_mean=p.blocking_us_mean, **p.blocking_figures("op_us"))
            m["blocking_ms_per_step"] = sum(p.step_ms_by_op().values())
        # each kind's ops of the step as a burst of their own: all-reduce vs all-gather ms
        m.update({f"{op.replace('_', '')}_ms_per_step": v for op, v in p.step_ms_by_kind().items()})
        if p.graph_burst_ms is not None:
            m["graph_burst_ms"] = p.graph_burst_ms
        if p.burst_transport_ms is not None:  # the burst split as the analyser splits the server's
            m.update(burst_wait_ms=p.burst_wait_ms, burst_transport_ms=p.burst_transport_ms)
        for name, (cpu, runq) in p.sched_us_per_op.items():  # where a CPU rank's time went
            if cpu + runq >= 1.0:  # threads that did something per op (≥ 1 µs)
                key = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
                m[f"sched.{key}.cpu_us_per_op"] = cpu
                m[f"sched.{key}.runq_us_per_op"] = runq
        if exp.reference_tpot_ms:
            m["decode_share"] = 100 * p.burst_ms / exp.reference_tpot_ms  # a share: percent
        rec.log_metrics(m)
        summary.update(m)
        rows.append([p.label, p.nbytes, p.burst, p.burst_ms, p.burst_wait_ms, p.burst_transport_ms,
                     p.queued_op_us, m.get("op_us_mean"),
                     m.get("op_us_p50"), m.get("op_us_p99", suppressed(m, "op_us_p99")),
                     m.get("allreduce_ms_per_step"),
                     m.get("allgather_ms_per_step"), m.get("graph_burst_ms"), algbw, busbw,
                     p.wrong, m.get("decode_share")])
        per_op = p.op_blocking_us()
        tables.write(out / "step_collectives", STEP_COLUMNS,
                     [[o.index, o.name, o.op, o.numel, o.nbytes, per_op[o.index] if per_op else None]
                      for o in ops],
                     f"the collectives of one decode step, in order ({len(ops)} ops, "
                     f"{step['bytes_per_step']} B); blk_p50 = median blocking latency of that op")
        if p.blocking_s:
            plots.histogram(out / "plots" / "op_latency_hist.png", [s * 1e6 for s in p.blocking_s],
                            f"step collectives, {world} ranks, blocking, each op",
                            {k: m[f"op_us_{k}"] for k in ("p50", "p99") if f"op_us_{k}" in m})
    sched = [f"{n} {c:.0f}/{w:.0f}" for p in files.points[:1]
             for n, (c, w) in sorted(p.sched_us_per_op.items(), key=lambda kv: -kv[1][0])
             if c + w >= 1.0]
    if sched:  # why a CPU burst takes what it takes: the threads sharing each rank's cores
        line = ("per op of the queued bursts, each thread's CPU / run-queue wait (µs, mean over "
                "ranks): " + ", ".join(sched))
        rec.set_tags({"sched.per_op": line[:5000]})
        print(f"# {line}")
    finish(out, COLUMNS, rows,
           f"nccl_burst: {len(ops)} ops per step ({'step collectives' if exp.ops_per_step is None else 'all-reduces'}), "
           f"{exp.dtype}, {world} ranks, {cfg.hardware.backend}, communicator {exp.communicator}; "
           "wait/transport = the burst split at each op's last arrival over the ranks (mean over "
           "ranks; ops that return when done only, else -); ar/ag_ms/step = the step's "
           "all-reduces / all-gathers alone as a queued burst (median)",
           spec, files, outcome)
    return summary
