"""all_to_all: expert-parallel dispatch cost as tokens per GPU grow, and where it jumps."""

from __future__ import annotations

from pathlib import Path

from k25exp import plots, tables
from k25exp.collectives.results import bandwidths, find_knee
from k25exp.collectives.spec import Point
from k25exp.config.experiments import AllToAllConfig
from k25exp.config.schema import K25Config
from k25exp.runners.collective import finish, make_spec, measure
from k25exp.tracking.recorder import Recorder

COLUMNS = [
    tables.Column("tokens/GPU", "{}", 11), tables.Column("size(B)", "{}", 12),
    tables.Column("count", "{}", 10), tables.Column("type", "{}", 10),
    tables.Column("time(us)", "{:.2f}"), tables.Column("us/token", "{:.3f}"),
    tables.Column("algbw(GB/s)", "{:.3f}"), tables.Column("busbw(GB/s)", "{:.3f}"),
    tables.Column("#wrong", "{}", 8), tables.Column("blk_p50(us)", "{:.2f}"),
    tables.Column("graph(us)", "{:.2f}"),
]


def send_numel(tokens: int, top_k: int, hidden: int) -> int:
    """Per-rank send buffer: every token goes to top_k experts, hidden values each."""
    return tokens * top_k * hidden


def run(cfg: K25Config, out: Path, rec: Recorder) -> dict[str, float]:
    exp: AllToAllConfig = cfg.experiment
    world = cfg.hardware.world_size
    points = [Point(label=t, numel=send_numel(t, exp.top_k, exp.hidden_size), burst=exp.ops_per_burst,
                    reps=exp.bursts, blocking_iters=exp.ops_per_burst)
              for t in exp.tokens_per_gpu]
    spec = make_spec(cfg, "all_to_all", points)
    files, outcome = measure(cfg, spec, out, rec)

    rows, xs, lat = [], [], []
    for p in files.points:
        t = p.queued_op_us
        algbw, busbw = bandwidths(p.nbytes, t * 1e-6, "all_to_all", world)
        m = {"a2a_us": t, "a2a_us_per_token": t / p.label, "algbw_gbps": algbw,
             "busbw_gbps": busbw, "wrong": p.wrong}
        if p.blocking_s:
            m.update(p.blocking_figures("a2a_blocking_us", (50,)))
        if p.graph_op_us is not None:
            m["a2a_us_graph"] = p.graph_op_us
        rec.log_metrics(m, step=p.label)
        rows.append([p.label, p.nbytes, p.numel, exp.dtype, t, t / p.label, algbw, busbw,
                     p.wrong, m.get("a2a_blocking_us_p50"), m.get("a2a_us_graph")])
        xs.append(p.label), lat.append(t)

    summary: dict[str, float] = {}
    knee = find_knee(xs, lat, exp.knee_factor, exp.knee_baseline_points)
    if knee is not None:
        summary["knee_tokens_per_gpu"] = knee
        rec.log_metrics(summary)
    rec.set_tags({"knee": str(knee) if knee is not None else
                  f"none within the sweep (factor {exp.knee_factor} over the first "
                  f"{exp.knee_baseline_points} points)"})
    if rows:
        plots.sweep(out / "plots" / "a2a_latency_vs_tokens.png", xs, {"a2a (queued)": lat},
                    "tokens per GPU", "time per All-to-All (µs)",
                    f"All-to-All {exp.dtype}, top-{exp.top_k} × {exp.hidden_size}, {world} ranks",
                    logy=True, vline=knee, vline_label=f"knee ({exp.knee_factor}× baseline)")
    finish(out, COLUMNS, rows,
           f"all_to_all: {world} ranks, {cfg.hardware.backend}; knee at "
           f"{knee if knee is not None else 'none'} tokens/GPU",
           spec, files, outcome)
    return summary
