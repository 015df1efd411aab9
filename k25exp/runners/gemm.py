"""gemm: every weight GEMM of a decode step at the model's shapes, per kernel candidate.

Each (shape, kernel, M) is first checked against an fp32 reference (the original weight for
unquantized kernels, the dequantized one for W4A16 kernels); only kernels that pass are
timed, their figures logged as MLflow metrics `<shape>.tp<N>/<kernel>/<figure>` with step = M;
then one MoE layer's routed experts per candidate, step = its tokens.

Here: the shapes and kernels, the correctness gate and the timing. The figures' definitions
(latency, tflops, gbps, roofline_pct ...), the samples file and timing tags, the tables,
plots and recovery: gemm_results.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from k25exp import vllm_kernels
from k25exp.config.experiments import GemmConfig
from k25exp.config.schema import K25Config
from k25exp.gemm import moe
from k25exp.gemm.kernels import KernelUnavailable, check_correct
from k25exp.gemm.quant import dequantize, quantize_w4a16, random_weight
from k25exp.gemm.shapes import (GemmShape, expert_m, expert_tokens, model_gemm_shapes,
                                 routed_expert_dims)
from k25exp.gemm.timing import Timing, l2_bytes, rotation, time_cuda_instream, time_fn
from k25exp.model import routing
from k25exp.runners.gemm_results import (Row, Samples, figures, moe_expert_bytes_w4a16, plot,
                                         roofline_tags, timed_row, write_regime, write_tables)
from k25exp.tracking.recorder import Recorder


class GemmFailed(RuntimeError):
    """Some kernel produced a wrong result; everything else was measured and logged."""


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
    write_regime(out, cfg, regime)
    names = [exp.baseline] + [k for k in exp.kernels if k != exp.baseline]
    kernels = {n: _kernel(exp.registry[n], f"experiment.registry.{n}") for n in names}
    rows: list[Row] = []
    failures: list[str] = []
    gen = torch.Generator().manual_seed(exp.seed)
    samples = Samples(out, rec)
    keep = samples.keep
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
                    nbytes = kernel.weight_bytes(shape.n, shape.k) + 2 * m * (shape.k + shape.n)
                    flops = 2 * m * shape.n * shape.k
                    if name == exp.baseline:
                        base[m] = t.median_us
                    r = timed_row(cfg, label, shape.n, shape.k, name, m, t, nbytes, flops,
                                  base.get(m), err, note=ran)
                    if device.type == "cuda" and exp.instream:
                        ti = _dense_instream(kernel, w, qw, x, exp, device)
                        keep(f"{label}/{name}", m, ti, "latency_us_instream")
                        r.latency_us_instream = ti.median_us
                    rows.append(r)
                    rec.log_metrics({f"{label}/{name}/{k}": v for k, v in figures(r).items()}, step=m)
            plot(out, label, shape, rows)
        rows += _moe_layer(cfg, device, rec, failures, keep)
    finally:
        samples.close()
        torch.set_num_threads(threads_before)
        uncap()
        write_tables(out, rows, cfg)
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
            # weights of the distinct experts the routing touches, as this kernel stores them
            per_expert = (moe_expert_bytes_w4a16(inter, m.hidden_size, group)
                          if p.quantized else 3 * inter * m.hidden_size * 2)
            nbytes = touched * per_expert + 2 * 2 * c * m.hidden_size
            flops = 2 * c * m.num_experts_per_tok * 3 * inter * m.hidden_size
            r = timed_row(cfg, label, 2 * inter, m.hidden_size, name, c, t, nbytes, flops, None,
                          err, note=p.note)
            if device.type == "cuda" and exp.instream and name != "reference_grouped_moe":
                ti_ = _moe_instream(p.run, x, c, m, exp, device, how)
                keep(f"{label}/{name}", c, ti_, "latency_us_instream")
                r.latency_us_instream = ti_.median_us
            rows.append(r)
            rec.log_metrics({f"{label}/{name}/{k}": v for k, v in figures(r).items()}
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


def _kernel(spec: dict, key: str):
    """A kernel candidate from its registry entry (`_target_` + arguments), via Hydra."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(spec)
    except InstantiationException as e:
        raise ValueError(f"{key}: cannot build kernel from {dict(spec)}: {e}") from None
