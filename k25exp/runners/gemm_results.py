"""What a gemm job leaves: each timed (shape, kernel, M)'s figures and their definitions (Row),
every call's time in samples.jsonl with how it was timed as the run's tags, the MoE-regime and
result tables, notes and plots, and a killed job's figures recovered from its samples.

Figures, logged as `<shape>.tp<N>/<kernel>/<figure>` at step = M: latency_us (median),
latency_us_p90, tflops = 2·M·N·K / t, gbps = bytes the kernel must move (weights as the
kernel stores them + activations + output) / t, roofline_pct =
the time the hardware config's memory bandwidth or peak rate allows (whichever bounds) / t ×
100, speedup_vs_bf16 = the baseline's latency / t, max_rel_err vs the reference (fp32: the
original weight, or the dequantized one for W4A16 kernels), latency_us_instream (CUDA: calls
back to back in one graph). roofline_pct divides by constants the run does not measure
(hardware.mem_bandwidth_gbps, peak_bf16_tflops: nominal unless their *_source says
measured); the tags roofline.mem_bandwidth_gbps / roofline.peak_bf16_tflops and the results
caption name them with their source (k25exp.nominal).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import orjson

from k25exp import nominal, plots, tables
from k25exp.config.schema import K25Config
from k25exp.gemm.quant import packed_bytes
from k25exp.gemm.shapes import GemmShape
from k25exp.gemm.timing import Timing
from k25exp.stats import min_samples
from k25exp.tracking.recorder import Recorder


@dataclass
class Row:
    shape: str
    n: int
    k: int
    kernel: str
    m: int
    status: str  # ok | failed | skipped
    latency_us: Optional[float] = None
    latency_us_p90: Optional[float] = None
    tflops: Optional[float] = None
    gbps: Optional[float] = None
    roofline_pct: Optional[float] = None
    speedup_vs_bf16: Optional[float] = None
    max_rel_err: Optional[float] = None
    note: str = ""
    latency_us_instream: Optional[float] = None  # in one graph over rotating copies (CUDA)


ROOFLINE = ("mem_bandwidth_gbps", "peak_bf16_tflops")  # what roofline_pct divides by


def roofline_tags(hw) -> dict[str, str]:
    """What roofline_pct divides by, each constant with where it comes from."""
    return {f"roofline.{x}": nominal.describe(x, getattr(hw, x), getattr(hw, f"{x}_source"))
            for x in ROOFLINE}


def _bound_us(nbytes: float, flops: float, cfg: K25Config) -> float:
    hw = cfg.hardware
    return max(nbytes / (hw.mem_bandwidth_gbps * 1e9), flops / (hw.peak_bf16_tflops * 1e12)) * 1e6


def p90(t) -> Optional[float]:
    """p90 of the timed calls, when there are enough of them to mean one (stats.min_samples)."""
    return t.p90_us if len(t.samples_us) >= min_samples(90) else None


def timed_row(cfg: K25Config, label: str, n: int, k: int, kernel: str, m: int, t: Timing,
              nbytes: float, flops: float, base_us: Optional[float], err: float,
              note: str = "") -> Row:
    """A kernel's passed (shape, M) from its timing: `nbytes` it must move, `flops` it does,
    `base_us` the baseline's latency at this point (None: no speedup)."""
    lat = t.median_us
    return Row(label, n, k, kernel, m, "ok", lat, p90(t), flops / lat / 1e6, nbytes / lat / 1e3,
               _bound_us(nbytes, flops, cfg) / lat * 100,
               base_us / lat if base_us is not None else None, err, note=note)


def moe_expert_bytes_w4a16(inter: int, hidden: int, group_size: int) -> int:
    """One expert's gate_up [2I x H] + down [H x I] as INT4 codes + bf16 group scales."""
    return packed_bytes(2 * inter, hidden, group_size) + packed_bytes(hidden, inter, group_size)


def figures(r: Row) -> dict[str, float]:
    """A row's figures, as logged (those it has)."""
    keys = ("latency_us", "latency_us_p90", "tflops", "gbps", "roofline_pct", "speedup_vs_bf16",
            "max_rel_err", "latency_us_instream")
    return {k: getattr(r, k) for k in keys if getattr(r, k) is not None}


class Samples:
    """samples.jsonl (every call's time, per figure: what `k25exp compare` tests two runs'
    medians with) and how each figure was timed, as the run's tags."""

    def __init__(self, out: Path, rec: Recorder) -> None:
        self.file = open(out / "samples.jsonl", "ab")
        self.rec = rec
        self.method: Optional[dict] = None  # how the first figure was timed (timing.* tags)
        self.instream_tagged = False  # the in-stream figures' method is tagged once

    def keep(self, prefix: str, step: int, t: Timing, figure: str = "latency_us") -> None:
        """A figure's samples into samples.jsonl; how it was timed into the run's tags: the
        first figure's method as timing.*, any figure timed otherwise (the MoE reference is
        never graphed: its loop depends on the routing) as timing.<figure>.*; the in-stream
        figures' method as timing.instream.* (the first one's)."""
        self.file.write(orjson.dumps({"figure": f"{prefix}/{figure}", "step": step,
                                      "samples_us": t.samples_us}) + b"\n")
        m = {k: str(v) for k, v in t.method.items() if k != "device"}
        if figure == "latency_us_instream":
            if not self.instream_tagged:
                self.instream_tagged = True
                self.rec.set_tags({f"timing.instream.{k}": v for k, v in m.items()
                                   if k != "calls_per_graph"})
            return
        if self.method is None:
            self.method = m
            self.rec.set_tags({f"timing.{k}": v for k, v in m.items()})
        elif m != self.method:
            self.rec.set_tags({f"timing.{prefix}.{k}": v for k, v in m.items()
                               if self.method.get(k) != v})

    def close(self) -> None:
        self.file.close()


def write_regime(out: Path, cfg: K25Config, regime: list[list[Any]]) -> None:
    """moe_regime.txt/.csv: the MoE-regime table (concurrency → M per expert)."""
    m = cfg.model
    tables.write(out / "moe_regime", [tables.Column("concurrency", "{}"),
                                       tables.Column("tokens/expert", "{:.3f}", 14),
                                       tables.Column("M", "{}", 6), tables.Column("experts", "{}", 9)],
                 regime, f"{m.name}: top-{m.num_experts_per_tok} of "
                         f"{m.n_routed_experts} experts, uniform routing")


COLUMNS = [
    tables.Column("shape", "{}", 24), tables.Column("N", "{}", 7), tables.Column("K", "{}", 7),
    tables.Column("kernel", "{}", 17), tables.Column("M", "{}", 5), tables.Column("status", "{}", 8),
    tables.Column("lat(us)", "{:.2f}", 11), tables.Column("p90(us)", "{:.2f}", 11),
    tables.Column("instream(us)", "{:.2f}", 13),
    tables.Column("TFLOP/s", "{:.3f}", 10), tables.Column("GB/s", "{:.1f}", 9),
    tables.Column("roofline%", "{:.1f}", 10), tables.Column("vs_bf16", "{:.2f}", 8),
    tables.Column("max_rel_err", "{:.2e}", 12),
]


def write_tables(out: Path, rows: list[Row], cfg: K25Config) -> None:
    """results.txt/.csv (one row per shape, kernel and M) and notes.txt, also printed."""
    exp, hw = cfg.experiment, cfg.hardware
    data = [[r.shape, r.n, r.k, r.kernel, r.m, r.status, r.latency_us, r.latency_us_p90,
             r.latency_us_instream, r.tflops,
             r.gbps, r.roofline_pct, r.speedup_vs_bf16, r.max_rel_err] for r in rows]
    text = tables.write(out / "results", COLUMNS, data,
                        f"gemm: {cfg.model.name} on {cfg.hardware.name} ({exp.device}); lat: median of "
                        f"{exp.calls} calls, each alone, after {exp.warmup} warm-up; instream (CUDA): "
                        f"median over {exp.calls} replays of >= {exp.instream_calls} calls back to back "
                        "in one CUDA graph over rotating weight copies > 2x L2, per call; roofline vs "
                        + " and ".join(f"{nominal.kind(getattr(hw, x + '_source'))} "
                                       f"{nominal.describe(x, getattr(hw, x), getattr(hw, x + '_source'))}"
                                       for x in ROOFLINE))
    notes = sorted({f"{r.kernel} on {r.shape}: {r.status}: {r.note}" for r in rows if r.note})
    if notes:
        (out / "notes.txt").write_text("\n".join(notes) + "\n")
    print(text + ("\n".join(notes) + "\n" if notes else ""), flush=True)


def plot(out: Path, label: str, shape: GemmShape, rows: list[Row]) -> None:
    """plots/latency_<shape>.png and speedup_<shape>.png: each kernel over M."""
    mine = [r for r in rows if r.shape == label and r.status == "ok"]
    if not mine:
        return
    ms = sorted({r.m for r in mine})
    by_kernel = {}
    for r in mine:
        by_kernel.setdefault(r.kernel, {})[r.m] = r
    safe = label.replace(".", "_")
    title = f"{label} [{shape.n} × {shape.k}]"
    plots.sweep(out / "plots" / f"latency_{safe}.png", ms,
                {k: [v[m].latency_us if m in v else None for m in ms] for k, v in by_kernel.items()},
                "M (tokens)", "latency (µs, median)", title, logy=True)
    plots.sweep(out / "plots" / f"speedup_{safe}.png", ms,
                {k: [v[m].speedup_vs_bf16 if m in v else None for m in ms] for k, v in by_kernel.items()},
                "M (tokens)", "speedup vs bf16 (×)", title)


def recover(out: Path, rec: Recorder) -> str:
    """A killed job's figures (`k25exp recover`): each (shape, kernel, M) timed before the job
    died, from samples.jsonl (written as each figure is timed): its median and p90, as the
    runner defines them. What needs the shape, the model or the baseline's point (tflops,
    gbps, roofline, speedup) is left out."""
    path = out / "samples.jsonl"
    if not path.exists():
        return "nothing: no samples.jsonl"
    from k25exp.collectives.results import read_jsonl  # up to the line torn by the kill

    n = 0
    for r in read_jsonl(path):
        t = Timing(r["samples_us"])
        m = {r["figure"]: t.median_us}
        if (q := p90(t)) is not None:
            m[r["figure"] + "_p90"] = q
        rec.log_metrics(m, step=r["step"])
        n += 1
    return (f"gemm: {n} timed figure(s) from samples.jsonl (median, p90 of the kept calls); no "
            "tflops, gbps, roofline or speedup")
