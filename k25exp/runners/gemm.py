"""gemm: every weight GEMM of a decode step at the model's shapes, per kernel candidate.

Each (shape, kernel, M) is first checked against an fp32 reference (the original weight for
unquantized kernels, the dequantized one for W4A16 kernels); only kernels that pass are
timed. Figures per (shape, kernel) are MLflow metrics `<shape>.tp<N>/<kernel>/<figure>` with
step = M:
  latency_us (median), latency_us_p90, tflops = 2·M·N·K / t, gbps = bytes the kernel must
  move (weights as the kernel stores them + activations + output) / t, roofline_pct =
  the time the hardware config's memory bandwidth or peak rate allows (whichever bounds)
  / t × 100, speedup_vs_bf16 = baseline latency / latency, max_rel_err vs the reference.
roofline_pct divides by constants the run does not measure (hardware.mem_bandwidth_gbps,
peak_bf16_tflops: nominal unless their *_source says measured); the tags
roofline.mem_bandwidth_gbps / roofline.peak_bf16_tflops and the results caption name them
with their source (k25exp.nominal).

Long because the dense GEMMs and the MoE layer share the correctness gate, the timing
method tags and the samples file of one run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import orjson

import torch

from k25exp import nominal, plots, tables, vllm_kernels
from k25exp.config.experiments import GemmConfig
from k25exp.config.schema import K25Config
from k25exp.gemm import moe
from k25exp.gemm.kernels import KernelUnavailable, check_correct
from k25exp.gemm.quant import dequantize, packed_bytes, quantize_w4a16, random_weight
from k25exp.gemm.shapes import (GemmShape, expert_m, expert_tokens, model_gemm_shapes,
                                 routed_expert_dims)
from k25exp.gemm.timing import Timing, l2_bytes, rotation, time_cuda_instream, time_fn
from k25exp.model import routing
from k25exp.tracking.recorder import Recorder
from k25exp.stats import min_samples


class GemmFailed(RuntimeError):
    """Some kernel produced a wrong result; everything else was measured and logged."""


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


def shapes_to_run(cfg: K25Config) -> list[tuple[str, GemmShape]]:
    """(label, shape) for every requested shape and shard; label = `<name>.tp<N>` (MLflow keys allow no @)."""
    exp: GemmConfig = cfg.experiment
    out: list[tuple[str, GemmShape]] = []
    tps = sorted({exp.tp if s == "tp" else 1 for s in exp.shards}, reverse=True)
    for tp in tps:
        model_shapes = {s.name: s for s in model_gemm_shapes(cfg.model, tp, exp.include_lm_head)}
        names = list(model_shapes) if exp.shapes == ["all"] else exp.shapes
        out += [(f"{n}.tp{tp}", model_shapes[n]) for n in names]
    for name, spec in exp.extra_shapes.items():
        out.append((name, GemmShape(name, spec["n"], spec["k"], "replicated", note="from extra_shapes")))
    return out


def m_sweep(cfg: K25Config) -> tuple[list[int], list[list[Any]]]:
    """M values to time, and the MoE-regime table (concurrency → M per expert)."""
    exp, m = cfg.experiment, cfg.model
    regime = [[b, expert_tokens(b, m.num_experts_per_tok, m.n_routed_experts),
               expert_m(b, m.num_experts_per_tok, m.n_routed_experts),
               min(m.n_routed_experts, b * m.num_experts_per_tok)] for b in exp.moe_concurrency]
    ms = sorted(set(exp.m_values) | {r[2] for r in regime})
    return (ms[: exp.limit_points] if exp.limit_points else ms), regime


def _bound_us(nbytes: float, flops: float, cfg: K25Config) -> float:
    hw = cfg.hardware
    return max(nbytes / (hw.mem_bandwidth_gbps * 1e9), flops / (hw.peak_bf16_tflops * 1e12)) * 1e6


ROOFLINE = ("mem_bandwidth_gbps", "peak_bf16_tflops")  # what roofline_pct divides by


def roofline_tags(hw) -> dict[str, str]:
    """What roofline_pct divides by, each constant with where it comes from."""
    return {f"roofline.{x}": nominal.describe(x, getattr(hw, x), getattr(hw, f"{x}_source"))
            for x in ROOFLINE}


def run(cfg: K25Config, out: Path, rec: Recorder) -> dict[str, float]:
    exp: GemmConfig = cfg.experiment
    device = torch.device("cuda", 0) if exp.device == "cuda" else torch.device("cpu")
    threads_before = torch.get_num_threads()
    if exp.threads and device.type == "cpu":
        torch.set_num_threads(exp.threads)
    isa = cfg.hardware.vllm_cpu_isa if device.type == "cpu" else None
    uncap = vllm_kernels.cap(isa) if isa else (lambda: None)  # before vLLM loads its kernels
    ms, regime = m_sweep(cfg)
    rec.set_tags(roofline_tags(cfg.hardware))
    tables.write(out / "moe_regime", [tables.Column("concurrency", "{}"),
                                       tables.Column("tokens/expert", "{:.3f}", 14),
                                       tables.Column("M", "{}", 6), tables.Column("experts", "{}", 9)],
                 regime, f"{cfg.model.name}: top-{cfg.model.num_experts_per_tok} of "
                         f"{cfg.model.n_routed_experts} experts, uniform routing")
    names = [exp.baseline] + [k for k in exp.kernels if k != exp.baseline]
    kernels = {n: _kernel(exp.registry[n], f"experiment.registry.{n}") for n in names}
    rows: list[Row] = []
    failures: list[str] = []
    method: Optional[dict] = None  # how the first figure was timed (the run's timing.* tags)
    instream_tagged = False  # the in-stream figures' method is tagged once (timing.instream.*)
    gen = torch.Generator().manual_seed(exp.seed)
    # every call's time, per figure: what `k25exp compare` tests two runs' medians with
    samples = open(out / "samples.jsonl", "ab")

    def keep(prefix: str, step: int, t, figure: str = "latency_us") -> None:
        """A figure's samples into samples.jsonl; how it was timed into the run's tags: the
        first figure's method as timing.*, any figure timed otherwise (the MoE reference is
        never graphed: its loop depends on the routing) as timing.<figure>.*; the in-stream
        figures' method as timing.instream.* (the first one's)."""
        nonlocal method, instream_tagged
        samples.write(orjson.dumps({"figure": f"{prefix}/{figure}", "step": step,
                                    "samples_us": t.samples_us}) + b"\n")
        m = {k: str(v) for k, v in t.method.items() if k != "device"}
        if figure == "latency_us_instream":
            if not instream_tagged:
                instream_tagged = True
                rec.set_tags({f"timing.instream.{k}": v for k, v in m.items() if k != "calls_per_graph"})
            return
        if method is None:
            method = m
            rec.set_tags({f"timing.{k}": v for k, v in m.items()})
        elif m != method:
            rec.set_tags({f"timing.{prefix}.{k}": v for k, v in m.items() if method.get(k) != v})
    try:
        for si, (label, shape) in enumerate(shapes_to_run(cfg)):
            w = random_weight(shape.n, shape.k, seed=exp.seed + si, device=device)
            qw = quantize_w4a16(w, exp.group_size) if exp.group_size > 0 and shape.k % exp.group_size == 0 else None
            refs = {False: w.float(), True: dequantize(qw).float() if qw is not None else None}
            xs = {m: torch.randn(m, shape.k, generator=gen).to(device, torch.bfloat16) for m in ms}
            base: dict[int, float] = {}
            for name, kernel in kernels.items():
                try:
                    if kernel.quantized and qw is None:
                        raise KernelUnavailable(
                            f"model {cfg.model.name} has no int4 weights (experiment.group_size="
                            f"{exp.group_size}); set experiment.group_size=32 to time W4A16 "
                            "kernels anyway" if exp.group_size <= 0 else
                            f"{label} K={shape.k} is not a multiple of experiment.group_size="
                            f"{exp.group_size}")
                    fn = kernel.prepare(w, qw)
                except KernelUnavailable as e:
                    rows += [Row(label, shape.n, shape.k, name, m, "skipped", note=str(e)) for m in ms]
                    rec.set_tags({f"skipped.{name}": str(e)})
                    continue
                ran = ""  # a dispatching candidate says what it runs, per M (its ok rows' note)
                if hasattr(kernel, "path"):
                    ran = paths(lambda m_: kernel.path(shape.n, shape.k, m_, device), ms)
                    rec.set_tags({f"path.{label}.{name}": ran})
                for m in ms:
                    x = xs[m]
                    ok, err = check_correct(fn(x), (x.float() @ refs[kernel.quantized].T), exp.rtol)
                    if not ok:
                        msg = f"{name} on {label} at M={m}: max_rel_err {err:.3g} > rtol {exp.rtol:g}"
                        failures.append(msg)
                        rows.append(Row(label, shape.n, shape.k, name, m, "failed", max_rel_err=err, note=msg))
                        rec.log_metrics({f"{label}/{name}/max_rel_err": err}, step=m)
                        continue
                    t = time_fn(fn, x, device, warmup=exp.warmup, calls=exp.calls,
                                flush_l2=exp.flush_l2, graph=exp.graph, warmup_ms=exp.warmup_ms)
                    keep(f"{label}/{name}", m, t)
                    lat = t.median_us
                    nbytes = kernel.weight_bytes(shape.n, shape.k) + 2 * m * (shape.k + shape.n)
                    flops = 2 * m * shape.n * shape.k
                    if name == exp.baseline:
                        base[m] = lat
                    r = Row(label, shape.n, shape.k, name, m, "ok", lat, _p90(t), flops / lat / 1e6,
                            nbytes / lat / 1e3, _bound_us(nbytes, flops, cfg) / lat * 100,
                            base[m] / lat if m in base else None, err, note=ran)
                    if device.type == "cuda" and exp.instream:
                        ti = _dense_instream(kernel, w, qw, x, exp, device)
                        keep(f"{label}/{name}", m, ti, "latency_us_instream")
                        r.latency_us_instream = ti.median_us
                    rows.append(r)
                    rec.log_metrics({f"{label}/{name}/{k}": v for k, v in _figures(r).items()}, step=m)
            _plot(out, label, shape, rows)
        rows += _moe_layer(cfg, device, rec, failures, keep)
    finally:
        samples.close()
        torch.set_num_threads(threads_before)
        uncap()
        _write_tables(out, rows, cfg)
        if device.type == "cpu" and (found := vllm_kernels.builds()):
            rec.set_tags({"vllm.cpu_isa": vllm_kernels.describe(found)})
    summary = {"kernels_failed": float(len({f.split(' ')[0] for f in failures}))}
    rec.log_metrics(summary)
    if failures:
        raise GemmFailed("correctness gate: " + "; ".join(failures[:5])
                         + (f" (+{len(failures) - 5} more)" if len(failures) > 5 else ""))
    return summary


def _moe_layer(cfg: K25Config, device: torch.device, rec: Recorder, failures: list[str],
               keep: Callable) -> list[Row]:
    """One MoE layer's routed experts at c tokens, as one call per candidate (Row.m = c
    tokens, N/K = the layer's 2I × H); metrics `moe.tp<N>/<candidate>/<figure>`, step = c.
    `gbps` counts the weights of the distinct experts the routing touches + activations."""
    exp: GemmConfig = cfg.experiment
    m = cfg.model
    if not exp.moe_kernels or not exp.moe_batches or m.n_routed_experts <= 0:
        return []
    _, _, inter = routed_expert_dims(m, exp.tp)  # a rank model's own experts at tp=1
    label = f"moe.tp{exp.tp}"
    gib = m.n_routed_experts * 3 * inter * m.hidden_size * 2 / 2**30
    if gib > exp.moe_max_weight_gib:
        why = (f"{m.n_routed_experts} experts x [{2 * inter} x {m.hidden_size}] + [{m.hidden_size} "
               f"x {inter}] bf16 = {gib:.1f} GiB > experiment.moe_max_weight_gib="
               f"{exp.moe_max_weight_gib:g}")
        rec.set_tags({f"skipped.{label}": why})
        return [Row(label, 2 * inter, m.hidden_size, k, c, "skipped", note=why)
                for k in exp.moe_kernels for c in exp.moe_batches]
    w13, w2 = moe.make_weights(m.n_routed_experts, m.hidden_size, inter, torch.bfloat16, device, exp.seed)
    gen = torch.Generator().manual_seed(exp.seed + 1)
    rows: list[Row] = []
    how = routing.of_config(cfg)  # the server's routing, drawn here for the same tokens
    rec.set_tags({f"{label}.routing": f"{how}: top-{m.num_experts_per_tok} of "
                  f"{m.n_routed_experts} experts, {routing.DESCRIBE[how]}, seeded"})
    prepared: dict[str, moe.Prepared] = {}
    group = exp.group_size if exp.group_size > 0 else 32  # a W4A16 candidate's scale groups
    for name in exp.moe_kernels:  # weights prepared (prepacked, quantized, repacked) once
        try:
            prepared[name] = moe.CANDIDATES[name](w13, w2, group)
        except moe.Unavailable as e:
            rows += [Row(label, 2 * inter, m.hidden_size, name, c, "skipped", note=str(e))
                     for c in exp.moe_batches]
            rec.set_tags({f"skipped.{label}.{name}": str(e)})
    # fp32 oracles: the bf16 weights, or the dequantized ones a W4A16 kernel holds (one copy
    # of each, and the bf16 one only when a candidate needs it: the Kimi rank's bf16 experts
    # alone are 8.4 GB in fp32)
    bf16_oracle = ((w13.float(), w2.float()) if any(p.reference is None for p in prepared.values())
                   else None)
    oracle = {name: (p.reference[0].float(), p.reference[1].float()) if p.reference else bf16_oracle
              for name, p in prepared.items()}
    for c in exp.moe_batches:
        tw, ti = moe.route(c, m.n_routed_experts, m.num_experts_per_tok, exp.seed + c, device, how)
        x = torch.randn(c, m.hidden_size, generator=gen).to(device, torch.bfloat16)
        wants: dict[int, torch.Tensor] = {}  # by oracle: computed once per batch
        touched = int(ti.unique().numel())
        for name, p in prepared.items():
            def fn(x_: torch.Tensor, run=p.run, tw=tw, ti=ti) -> torch.Tensor:
                return run(x_, tw, ti)
            o = oracle[name]
            if id(o) not in wants:
                wants[id(o)] = moe.reference_moe(x.float(), o[0], o[1], tw, ti)
            ok, err = check_correct(fn(x), wants[id(o)], exp.rtol)
            if not ok:
                msg = f"{name} on {label} at c={c}: max_rel_err {err:.3g} > rtol {exp.rtol:g}"
                failures.append(msg)
                rows.append(Row(label, 2 * inter, m.hidden_size, name, c, "failed", max_rel_err=err, note=msg))
                continue
            t = time_fn(fn, x, device, warmup=exp.warmup, calls=exp.calls, flush_l2=exp.flush_l2,
                        graph=exp.graph and name != "reference_grouped_moe",  # data-dependent loop
                        warmup_ms=exp.warmup_ms)
            keep(f"{label}/{name}", c, t)
            lat = t.median_us
            # weights of the distinct experts the routing touches, as this kernel stores them
            per_expert = (moe_expert_bytes_w4a16(inter, m.hidden_size, group)
                          if p.quantized else 3 * inter * m.hidden_size * 2)
            nbytes = touched * per_expert + 2 * 2 * c * m.hidden_size
            flops = 2 * c * m.num_experts_per_tok * 3 * inter * m.hidden_size
            r = Row(label, 2 * inter, m.hidden_size, name, c, "ok", lat, _p90(t), flops / lat / 1e6,
                    nbytes / lat / 1e3, _bound_us(nbytes, flops, cfg) / lat * 100, None, err,
                    note=p.note)
            if device.type == "cuda" and exp.instream and name != "reference_grouped_moe":
                ti_ = _moe_instream(p.run, x, c, m, exp, device, how)
                keep(f"{label}/{name}", c, ti_, "latency_us_instream")
                r.latency_us_instream = ti_.median_us
            rows.append(r)
            rec.log_metrics({f"{label}/{name}/{k}": v for k, v in _figures(r).items()}
                            | {f"{label}/{name}/experts_touched": touched}, step=c)
    return rows


def paths(path_of: Callable[[int], str], ms: list[int]) -> str:
    """'A at M 1–16; B at M 32–256': the kernel a dispatching candidate ran, over runs of M."""
    runs: list[list] = []
    for m in sorted(ms):
        p = path_of(m)
        if runs and runs[-1][0] == p:
            runs[-1][2] = m
        else:
            runs.append([p, m, m])
    return "; ".join(f"{p} at M {a}" + (f"–{b}" if b != a else "") for p, a, b in runs)


def _dense_instream(kernel, w: torch.Tensor, qw, x: torch.Tensor, exp: GemmConfig,
                    device: torch.device) -> Timing:
    """The kernel at x's M as the server's graph runs it: calls back to back in one CUDA graph,
    each on the next of enough weight copies (prepared like the first) that together they
    exceed twice the L2."""
    copies, k = rotation(kernel.weight_bytes(w.shape[0], w.shape[1]), l2_bytes(device),
                         exp.instream_calls)
    fns = []
    for _ in range(copies):
        qw_i = None if qw is None else type(qw)(qw.q.clone(), qw.scales.clone(), qw.group_size)
        fns.append(kernel.prepare(w.clone(), qw_i))
    t = time_cuda_instream([lambda f=fns[i % copies]: f(x) for i in range(k)], exp.calls, exp.warmup)
    t.method["weight_copies"] = copies
    del fns
    torch.cuda.empty_cache()
    return t


def _moe_instream(run_fn, x: torch.Tensor, c: int, m, exp: GemmConfig, device: torch.device,
                  how: str) -> Timing:
    """One MoE layer call at c tokens as the server's graph runs it: calls back to back in one
    CUDA graph, each with its own routing draw (as each layer routes its tokens afresh), over
    the one weight set (a layer's experts; the server's other layers hold other experts: when
    the experts a draw touches fit in the L2 the figure is optimistic; nothing flags it yet)."""
    draws = [moe.route(c, m.n_routed_experts, m.num_experts_per_tok, exp.seed + 7919 * (j + 1) + c,
                       device, how) for j in range(exp.instream_calls)]
    t = time_cuda_instream([lambda tw=tw, ti=ti: run_fn(x, tw, ti) for tw, ti in draws],
                           exp.calls, exp.warmup)
    t.method["routing_draws"] = len(draws)
    return t


def moe_expert_bytes_w4a16(inter: int, hidden: int, group_size: int) -> int:
    """One expert's gate_up [2I x H] + down [H x I] as INT4 codes + bf16 group scales."""
    return packed_bytes(2 * inter, hidden, group_size) + packed_bytes(hidden, inter, group_size)


def _figures(r: Row) -> dict[str, float]:
    keys = ("latency_us", "latency_us_p90", "tflops", "gbps", "roofline_pct", "speedup_vs_bf16",
            "max_rel_err", "latency_us_instream")
    return {k: getattr(r, k) for k in keys if getattr(r, k) is not None}


COLUMNS = [
    tables.Column("shape", "{}", 24), tables.Column("N", "{}", 7), tables.Column("K", "{}", 7),
    tables.Column("kernel", "{}", 17), tables.Column("M", "{}", 5), tables.Column("status", "{}", 8),
    tables.Column("lat(us)", "{:.2f}", 11), tables.Column("p90(us)", "{:.2f}", 11),
    tables.Column("instream(us)", "{:.2f}", 13),
    tables.Column("TFLOP/s", "{:.3f}", 10), tables.Column("GB/s", "{:.1f}", 9),
    tables.Column("roofline%", "{:.1f}", 10), tables.Column("vs_bf16", "{:.2f}", 8),
    tables.Column("max_rel_err", "{:.2e}", 12),
]


def _write_tables(out: Path, rows: list[Row], cfg: K25Config) -> None:
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


def _plot(out: Path, label: str, shape: GemmShape, rows: list[Row]) -> None:
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


def _kernel(spec: dict, key: str):
    """A kernel candidate from its registry entry (`_target_` + arguments), via Hydra."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(spec)
    except InstantiationException as e:
        raise ValueError(f"{key}: cannot build kernel from {dict(spec)}: {e}") from None


def _p90(t) -> Optional[float]:
    """p90 of the timed calls, when there are enough of them to mean one (stats.min_samples)."""
    return t.p90_us if len(t.samples_us) >= min_samples(90) else None


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
        if (p90 := _p90(t)) is not None:
            m[r["figure"] + "_p90"] = p90
        rec.log_metrics(m, step=r["step"])
        n += 1
    return (f"gemm: {n} timed figure(s) from samples.jsonl (median, p90 of the kept calls); no "
            "tflops, gbps, roofline or speedup")
