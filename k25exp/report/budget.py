"""The report's arithmetic: plain functions of RunViews, no MLflow, no plotting.

Every figure carries the runs it came from; a figure whose source is missing has value None
and says why (`missing`), and nothing downstream of it is computed from a default.

Decode budget at batch 1 (one decode step of one sequence):
    tpot_ms        macro's single_stream_tpot_ms (p50 of (e2e − ttft)/(tokens − 1))
    comm_ms        nccl_burst at tokens=1: the decode step's collectives (2 × layers + 2:
                   embedding all-reduce, 2 per layer, logits all-gather) through the run's
                   communicator (vLLM's own by default), queued back to back (burst_ms)
    gemm_ms        Σ over the model's GEMMs of latency(M=1) × count_per_layer × layers, from
                   the GEMM runs (k25exp.gemm.shapes; routed experts count top_k times)
    rest_ms        tpot − comm − gemm (attention, norms, routing, sampling, host overhead)
    comm share     over one denominator, the batch-1 TPOT: comm_ms / tpot_ms (burst) beside the
                   batch-1 profile's communication transport and wait per step / tpot_ms (the
                   calls' time split at the last rank's arrival, k25exp.traces.comm_split);
                   the difference burst − transport is in percentage points. The profile's
                   exposed share of its own (profiled) step is shown too
Expert parallelism, per concurrency c on `world` ranks:
    tokens/GPU     ceil(c / world): each rank dispatches its share of the batch
    ep_ms          2 (dispatch + combine) × MoE layers × a2a_us(tokens/GPU), all_to_all sweep
    tp_ms          MoE layers × allreduce_us(c × hidden × dtype bytes), allreduce_sweep:
                   the AllReduce after each MoE layer that EP replaces
    both interpolated log-log between measured points, never extrapolated
Speculative decoding (Leviathan et al. 2023), per-token acceptance α, draft length k:
    E(α, k)        expected tokens per verification step = (1 − α^(k+1)) / (1 − α); k+1 at α=1
    step_ms        T_verify(k+1) + k × T_draft: T_verify(k+1) = macro's TPOT p50 at
                   concurrency k+1 (a step that carries k+1 tokens); T_draft = 0 for n-gram
                   lookup, the batch-1 TPOT for a draft as large as the target (self-draft)
    tpot_proj      step_ms / E(α, k); speedup = tpot_ms / tpot_proj
    α_eff          of a measured run: the α whose E(α, k) equals its tokens per decode step
                   (single_stream_tokens_per_chunk: streamed tokens per chunk at batch 1), so
                   steps without a draft count; the projection at α_eff differs from the
                   measurement only through the step cost
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Optional, Sequence

from k25exp.gemm.shapes import model_gemm_shapes
from k25exp.report.sources import Campaign, RunView
from k25exp.serving.speculative import MODEL_FREE  # no model: drafting costs host time only

W4A16 = ("marlin", "torch_int4", "w4a16_reference")
QUANTIZED = ("expert_gate_up", "expert_down")  # what Kimi's INT4 checkpoints quantize
PROFILE_GROUPS = ("communication", "gemm")  # k25exp.traces: sums of comm_* / gemm_* categories


@dataclass
class Figure:
    label: str
    value: Optional[float]
    unit: str = ""
    runs: list[RunView] = field(default_factory=list)
    note: str = ""
    missing: str = ""  # why value is None


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]]
    note: str = ""


@dataclass
class Section:
    title: str
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    plot: Optional[dict] = None  # data for render.py

    def get(self, label: str) -> Optional[Figure]:
        return next((f for f in self.figures if f.label == label), None)


# ----------------------------------------------------------------------------------------
# helpers


def model_of(run: RunView) -> SimpleNamespace:
    """The model config a run measured, from its flattened `model.*` params."""
    vals: dict[str, Any] = {}
    for k, v in run.params.items():
        if k.startswith("model.") and k.count(".") == 1:
            for cast in (int, float):
                try:
                    v = cast(v)
                    break
                except ValueError:
                    continue
            vals[k[6:]] = v
    return SimpleNamespace(**vals)


def interp_loglog(points: dict[int, float], x: float) -> Optional[float]:
    """y at x between measured points (log-log linear); None outside their range."""
    xs = sorted(p for p in points if p > 0 and points[p] is not None and points[p] > 0)
    if not xs or x < xs[0] or x > xs[-1]:
        return None
    if x in points:
        return points[x]
    hi = next(i for i, p in enumerate(xs) if p > x)
    x0, x1 = xs[hi - 1], xs[hi]
    y0, y1 = points[x0], points[x1]
    f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(y0) + f * (math.log(y1) - math.log(y0)))


def expected_tokens(alpha: float, k: int) -> float:
    """E(α, k) = (1 − α^(k+1)) / (1 − α): tokens emitted per verification step."""
    if not 0.0 <= alpha <= 1.0 or k < 0:
        raise ValueError(f"need 0 <= alpha <= 1 and k >= 0, got alpha={alpha}, k={k}")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def effective_alpha(mean_accepted: float, k: int) -> float:
    """The i.i.d. per-token acceptance whose E(α, k) − 1 equals `mean_accepted` (bisection)."""
    if mean_accepted <= 0:
        return 0.0
    if mean_accepted >= k:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_tokens(mid, k) - 1.0 < mean_accepted:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def served_with_graphs(c: Campaign) -> bool:
    """Whether the campaign's server ran CUDA graphs (server.enforce_eager false)."""
    served = [r for r in c.runs if r.phase in ("macro", "profile")]
    return any(r.params.get("server.enforce_eager") in ("False", "false") for r in served)


def burst_key(c: Campaign, run: Optional[RunView]) -> str:
    """The burst figure that matches the served config: the CUDA-graph replay when the server
    ran graphs and the run has one, else the eager queued burst."""
    if run is not None and "graph_burst_ms" in run.metrics and served_with_graphs(c):
        return "graph_burst_ms"
    return "burst_ms"


def _share(part: Optional[float], whole: Optional[float]) -> Optional[float]:
    return part / whole if part is not None and whole else None


def _missing(label: str, why: str, unit: str = "") -> Figure:
    return Figure(label, None, unit, missing=why)


# ----------------------------------------------------------------------------------------
# decode budget


def gemm_step(gemm_runs: Sequence[RunView], kernel: Optional[str] = None) -> tuple[Optional[float], Table, list[str], list[RunView]]:
    """GEMM time of one batch-1 decode step (ms), its per-shape table, what's missing."""
    table = Table("GEMMs of one decode step at M = 1", ["GEMM", "n × k", "per step", "kernel",
                                                         "µs at M=1", "µs per step", "run"], [])
    if not gemm_runs:
        return None, table, ["no GEMM run"], []
    newest = gemm_runs[0]
    model = model_of(newest)
    tp = newest.param("experiment.tp", int, 1)
    lm_head = newest.param("experiment.include_lm_head", str, "True") == "True"
    try:
        shapes = model_gemm_shapes(model, tp, lm_head)
    except (AttributeError, ValueError) as e:
        return None, table, [f"the GEMM run's model params are incomplete: {e}"], []
    total, missing, used = 0.0, [], []
    for s in shapes:
        label = f"{s.name}.tp{tp}"
        found = None
        for r in gemm_runs:  # newest first: the latest run that timed this shape
            k = kernel or _auto_kernel(r, label)
            key = f"{label}/{k}/latency_us" if k else None
            if key and key in r.metrics and 1 in r.history(key):
                found = (r, k, r.history(key)[1])
                break
        per = s.count_per_layer * s.layers
        if found is None:
            missing.append(s.name)
            table.rows.append([s.name, f"{s.n} × {s.k}", per, kernel or "auto", None, None, "missing"])
            continue
        r, k, us = found
        total += us * per
        used.append(r)
        table.rows.append([s.name, f"{s.n} × {s.k}", per, k, us, us * per, r])
    return (total / 1e3 if not missing else None), table, missing, used


def _auto_kernel(run: RunView, label: str) -> Optional[str]:
    """The kernel the server would run: the fastest W4A16 one for the GEMMs an INT4 checkpoint
    quantizes (the routed experts: conf/model/kimi_k25_int4.yaml), the baseline otherwise."""
    baseline = run.param("experiment.baseline", str, "torch_bf16")
    method = run.params.get("model.quant.method", "none")
    if method in ("none", "") or label.split(".")[0] not in QUANTIZED:
        # vLLM's own dispatch of a bf16 linear (its CPU build packs weights) when timed
        return "vllm_linear" if 1 in run.history(f"{label}/vllm_linear/latency_us") else baseline
    best = None
    for k in W4A16:
        key = f"{label}/{k}/latency_us"
        if key in run.metrics and 1 in run.history(key):
            if best is None or run.history(key)[1] < best[1]:
                best = (k, run.history(key)[1])
    return best[0] if best else None


def decode_budget(c: Campaign, gemm_kernel: Optional[str] = None) -> Section:
    sec = Section("Decode-time budget at batch 1")
    macro = c.latest("macro", lambda r: "single_stream_tpot_ms" in r.metrics)
    burst = (c.latest("nccl_burst", lambda r: r.param("experiment.tokens", int) == 1
                      and r.param("experiment.ops_per_step") is None)
             or c.latest("nccl_burst", lambda r: r.param("experiment.tokens", int) == 1))
    profile = c.latest("profile", lambda r: r.param("experiment.concurrency", int) == 1) \
        or c.latest("profile")
    tpot = macro.metrics["single_stream_tpot_ms"] if macro else None
    sec.figures.append(Figure("TPOT at batch 1 (macro)", tpot, "ms", [macro],
                              "single-stream p50, client clock") if macro else
                       _missing("TPOT at batch 1 (macro)", c.why_missing("macro"), "ms"))
    if macro and macro.metrics.get("single_stream_valid") == 0:
        m = macro.metrics
        why = (["the client lagged"] if m.get("single_stream_client_lagged", 1) else []) + (
            [f"{m['single_stream_delivery_stalls']:.0f} delivery stall(s), longest "
             f"{m.get('single_stream_delivery_stall_ms_max', 0):.0f} ms"]
            if m.get("single_stream_delivery_stalls") else [])
        sec.notes.append(f"macro run {macro.short}: the single-stream phase is flagged invalid "
                         f"({'; '.join(why)}), so its TPOT includes delay outside the engine; "
                         "rerun on a quieter host")
    key = burst_key(c, burst)
    comm = burst.metrics.get(key) if burst else None
    if burst and comm is None:
        sec.figures.append(_missing("communication per step (NCCL burst)",
                                    f"run {burst.short} has no burst_ms", "ms"))
    elif burst:
        ops = burst.param("experiment.ops_per_step", int)
        what = (f"the step's {burst.metrics.get('ops_per_step', 0):.0f} collectives "
                f"({burst.metrics.get('bytes_per_step', 0):.0f} B)" if ops is None else
                f"{ops} AllReduces of {burst.param('experiment.message_bytes')} B (the seed's "
                "burst: no embedding all-reduce, no logits all-gather)")
        sec.figures.append(Figure(
            "communication per step (NCCL burst)", comm, "ms", [burst],
            f"{what}, {'CUDA-graph replay (the server runs graphs)' if key == 'graph_burst_ms' else 'queued, eager'}, "
            f"communicator {burst.param('experiment.communicator', str, 'torch')}"
            f" ({burst.tags.get('communicator.impl', burst.param('hardware.backend'))}) on "
            f"{burst.param('hardware.world_size')} ranks"))
    else:
        sec.figures.append(_missing("communication per step (NCCL burst)",
                                    c.why_missing("nccl_burst", "at experiment.tokens=1"), "ms"))
    gemm_ms, table, gmiss, gruns = gemm_step(c.of("gemm"), gemm_kernel)
    if gemm_ms is not None:
        sec.figures.append(Figure("GEMM per step", gemm_ms, "ms", _unique(gruns),
                                  f"{len(table.rows)} GEMMs at M = 1, × count per layer × layers"))
    else:
        why = (c.why_missing("gemm") if not c.of("gemm") else
               f"missing: shapes not timed at M=1 in any GEMM run: {', '.join(gmiss)} "
               "(run experiment=gemm experiment.shapes=[all])")
        sec.figures.append(_missing("GEMM per step", why, "ms"))
    if table.rows:
        sec.tables.append(table)
    rest = tpot - comm - gemm_ms if None not in (tpot, comm, gemm_ms) else None
    sec.figures.append(Figure("rest (attention, norms, routing, host)", rest, "ms",
                              [r for r in (macro, burst) if r], "TPOT − communication − GEMM")
                       if rest is not None else
                       _missing("rest (attention, norms, routing, host)",
                                "needs TPOT, communication and GEMM", "ms"))
    if rest is not None and rest < 0:
        sec.notes.append(f"communication + GEMM exceed the measured TPOT by {-rest:.3f} ms: the "
                         "isolated measurements cost more than the server's real step (other "
                         "transport, warm caches or overlap in the server)")
    cs_burst = _share(comm, tpot)
    # the profile logs shares in percent (mean over ranks)
    cs_prof = profile.metrics.get("share_communication") / 100 if profile and \
        "share_communication" in profile.metrics else None
    sec.figures.append(Figure("communication share (burst / TPOT)", cs_burst, "%",
                              [r for r in (burst, macro) if r]) if cs_burst is not None else
                       _missing("communication share (burst / TPOT)", "needs the burst and TPOT", "%"))
    split = {k: profile.metrics.get(f"comm_{k}_ms_per_step") for k in ("transport", "wait")} \
        if profile else {}
    for k in ("transport", "wait"):
        label = f"communication share (profile {k} / TPOT)"
        v = _share(split.get(k), tpot)
        if v is not None:
            sec.figures.append(Figure(label, v, "%", [profile, macro],
                                      f"{split[k]:.3f} ms per step (mean over ranks) at concurrency "
                                      f"{profile.param('experiment.concurrency')}, over the batch-1 TPOT"))
        else:
            sec.figures.append(_missing(label, "needs the batch-1 TPOT and a profile of ≥ 2 ranks "
                                        "(the wait/transport split)" if profile else
                                        c.why_missing("profile"), "%"))
    if profile and cs_prof is not None:
        sec.figures.append(Figure("communication share (profile)", cs_prof, "%", [profile],
                                  f"exposed communication / profiled decode step of "
                                  f"{profile.metrics.get('decode_step_ms', float('nan')):.3f} ms, "
                                  f"{profile.metrics.get('steps_analysed', 0):.0f} steps"))
    else:
        sec.figures.append(_missing("communication share (profile)",
                                    f"profile run {profile.short} has no share_communication"
                                    if profile else c.why_missing("profile"), "%"))
    cs_tr = _share(split.get("transport"), tpot)
    if cs_burst is not None and cs_tr is not None:
        sec.figures.append(Figure("difference (burst − profile transport)", (cs_burst - cs_tr) * 100,
                                  "pp", [burst, macro, profile], "over the same denominator (TPOT)"))
    else:
        sec.figures.append(_missing("difference (burst − profile transport)",
                                    "needs the burst, TPOT and the profile's transport", "pp"))
    if burst and burst.param("experiment.communicator", str, "torch") != "vllm":
        sec.notes.append(f"burst run {burst.short} timed PyTorch's c10d "
                         f"({burst.param('hardware.backend')}), not vLLM's communicator (the "
                         "CPU build's shared-memory all-reduce, the GPU build's custom "
                         "all-reduce): it answers how c10d would do, not what the server pays")
    if gemm_ms is not None and tpot:
        sec.figures.append(Figure("GEMM share (GEMM / TPOT)", gemm_ms / tpot, "%", _unique(gruns + [macro])))
    if profile:
        per_rank = ("_min", "_median", "_max")
        shares = sorted(((k[6:], v) for k, v in profile.metrics.items()
                         if k.startswith("share_") and not k.endswith(per_rank)), key=lambda kv: -kv[1])
        # the groups (communication, gemm) are sums of categories: listed after them
        shares = ([kv for kv in shares if kv[0] not in PROFILE_GROUPS] +
                  [kv for kv in shares if kv[0] in PROFILE_GROUPS])
        sec.tables.append(Table(f"Profile: share of the decode step by category (run {profile.short})",
                                ["category", "share %", "min over ranks %", "max over ranks %"],
                                [[f"{k} (group)" if k in PROFILE_GROUPS else k, v,
                                  profile.metrics.get(f"share_{k}_min"),
                                  profile.metrics.get(f"share_{k}_max")] for k, v in shares],
                                f"decode step {profile.metrics.get('decode_step_ms', float('nan')):.3f} ms"
                                f" under the profiler, concurrency "
                                f"{profile.param('experiment.concurrency')}"))
    sec.plot = {"kind": "budget", "tpot": tpot, "parts": {"communication (burst)": comm,
                                                          "GEMM": gemm_ms, "rest": rest}}
    return sec


def _unique(runs: Sequence[Optional[RunView]]) -> list[RunView]:
    seen, out = set(), []
    for r in runs:
        if r is not None and r.run_id not in seen:
            seen.add(r.run_id)
            out.append(r)
    return out


# ----------------------------------------------------------------------------------------
# expert parallelism


def expert_parallel(c: Campaign) -> Section:
    sec = Section("Expert parallelism: All-to-All instead of the MoE AllReduce")
    a2a = c.latest("all_to_all")
    ar = c.latest("allreduce_sweep")
    if not a2a or not ar:
        for run, phase in ((a2a, "all_to_all"), (ar, "allreduce_sweep")):
            if not run:
                sec.figures.append(_missing(f"{phase} sweep", c.why_missing(phase)))
        sec.figures.append(_missing("EP break-even concurrency", "needs both sweeps"))
        return sec
    model = model_of(a2a)
    world = a2a.param("hardware.world_size", int)
    moe_layers = model.num_hidden_layers - model.first_k_dense_replace
    msg_per_token = model.hidden_size * model.dtype_bytes
    a2a_us = a2a.history("a2a_us")
    ar_us = ar.history("time_us")
    t_max = max(a2a_us) if a2a_us else 0
    table = Table("Per decode step, by concurrency", ["concurrency", "tokens/GPU", "a2a µs",
                                                      "EP ms (2 × a2a × MoE layers)",
                                                      "AllReduce bytes", "AllReduce µs",
                                                      "TP ms (AR × MoE layers)", "EP / TP", "EP pays"], [])
    conc, pays = [], []
    cc = 1
    while (cc + world - 1) // world <= t_max:
        t = (cc + world - 1) // world
        a = interp_loglog(a2a_us, t)
        nbytes = cc * msg_per_token
        r = interp_loglog(ar_us, nbytes)
        ep = 2 * moe_layers * a / 1e3 if a is not None else None
        tp = moe_layers * r / 1e3 if r is not None else None
        ok = ep < tp if ep is not None and tp is not None else None
        table.rows.append([cc, t, a, ep, nbytes, r, tp, ep / tp if ok is not None else None,
                           {True: "yes", False: "no", None: "n/a"}[ok]])
        if ok is not None:
            conc.append(cc)
            pays.append(ok)
        cc *= 2
    sec.tables.append(table)
    sec.notes.append(f"{world} ranks; {moe_layers} MoE layers; message {msg_per_token} B per token "
                     f"(hidden {model.hidden_size} × {model.dtype_bytes} B); a2a from run "
                     f"{a2a.short}, AllReduce from run {ar.short}, both "
                     f"{a2a.param('hardware.backend')}; tokens/GPU = ceil(c / {world}) (each "
                     "rank dispatches its share of the batch, as with data-parallel attention)")
    flip = next((i for i in range(1, len(pays)) if pays[i] != pays[i - 1]), None)
    if not pays:
        sec.figures.append(_missing("EP break-even concurrency", "no concurrency inside both sweeps"))
    elif flip is None:
        sec.figures.append(Figure("EP break-even concurrency", None, "", [a2a, ar],
                                  missing=f"none: EP {'pays' if pays[0] else 'does not pay'} at every "
                                          f"concurrency from {conc[0]} to {conc[-1]}"))
    else:
        what = "EP stops paying" if pays[flip - 1] else "EP starts paying"
        flips = [conc[i] for i in range(1, len(pays)) if pays[i] != pays[i - 1]]
        more = (f"; the sign flips {len(flips)} times (at {', '.join(map(str, flips))}): the "
                "two sweeps are noisier than the difference, see the table") if len(flips) > 1 else ""
        sec.figures.append(Figure("EP break-even concurrency", conc[flip], "", [a2a, ar],
                                  f"{what} at concurrency {conc[flip]} (between {conc[flip - 1]} "
                                  f"and {conc[flip]}){more}"))
    knee = a2a.metrics.get("knee_tokens_per_gpu")
    sec.figures.append(Figure("all-to-all knee", knee, "tokens/GPU", [a2a]) if knee is not None else
                       Figure("all-to-all knee", None, "tokens/GPU", [a2a], missing=
                              f"none within the sweep: {a2a.tags.get('knee', '')}"))
    sec.plot = {"kind": "ep", "x": [r[0] for r in table.rows], "ep": [r[3] for r in table.rows],
                "tp": [r[6] for r in table.rows]}
    return sec


# ----------------------------------------------------------------------------------------
# speculative decoding


SPEC_PARAMS = ("experiment.method", "experiment.num_speculative_tokens", "experiment.draft_model",
               "experiment.prompt_lookup_min", "experiment.prompt_lookup_max")


def spec_key(r: RunView) -> tuple:
    """What makes two spec_decode runs different settings (extra.* flattened per key)."""
    return tuple(r.params.get(k) for k in SPEC_PARAMS) + tuple(sorted(
        (k, v) for k, v in r.params.items() if k.startswith("experiment.extra.")))


def drafter(r: RunView) -> str:
    """'free' (n-gram, suffix), 'self' (the target drafts: k full passes) or 'unknown'."""
    method = r.params.get("experiment.method")
    if method in MODEL_FREE:
        return "free"
    if method == "draft_model" and r.params.get("experiment.draft_model") == "self":
        return "self"
    return "unknown"


def spec_label(r: RunView) -> str:
    method, k = r.params.get("experiment.method"), r.params.get("experiment.num_speculative_tokens")
    d = r.params.get("experiment.draft_model")
    label = f"{method} k={k}"
    if drafter(r) == "self":
        label += " (self-draft)"
    elif method not in MODEL_FREE and d not in (None, "null", "self"):
        label += f" (draft {d.rstrip('/').rsplit('/', 1)[-1]})"
    extra = [f"{k[len('experiment.extra.'):]}={v}" for k, v in sorted(r.params.items())
             if k.startswith("experiment.extra.")]
    return label + (f" [{', '.join(extra)}]" if extra else "")


def speculative(c: Campaign, alphas: Sequence[float], draft_lengths: Sequence[int]) -> Section:
    sec = Section("Speculative decoding: projected and measured")
    macro = c.latest("macro", lambda r: "single_stream_tpot_ms" in r.metrics)
    specs, seen = [], set()
    for r in c.of("spec_decode"):  # newest first: one run per distinct setting
        if spec_key(r) not in seen:
            seen.add(spec_key(r))
            specs.append(r)
    if not macro:
        sec.figures.append(_missing("projection", c.why_missing("macro") +
                                    " (its TPOT per concurrency is the verification cost)"))
    t1 = macro.metrics["single_stream_tpot_ms"] if macro else None
    levels = macro.history("tpot_ms_p50") if macro else {}

    valid = macro.history("valid") if macro else {}

    def step_ms(k: int, drafter_full: bool) -> Optional[float]:
        v = levels.get(k + 1)
        return None if v is None else v + (k * t1 if drafter_full else 0.0)

    lagged = sorted(c for c, v in valid.items() if not v and c in levels)
    if lagged:
        sec.notes.append(f"macro run {macro.short}: levels {lagged} are flagged invalid (client "
                         "lag or delivery stalls); their TPOT is still used as a verification cost")

    grid_ks = [k for k in draft_lengths if (k + 1) in levels]
    if macro:
        skipped = [k for k in draft_lengths if (k + 1) not in levels]
        if skipped:
            sec.notes.append(f"draft lengths {skipped} left out of the grid: macro run {macro.short} "
                             f"has no level at concurrency k+1 (its levels: {sorted(levels)})")
        for full, title in ((False, "n-gram (free drafter)"), (True, "self-draft (drafter = target)")):
            rows = []
            for a in alphas:
                rows.append([a] + [t1 / (step_ms(k, full) / expected_tokens(a, k)) for k in grid_ks])
            sec.tables.append(Table(f"Projected speedup over batch-1 TPOT, {title}",
                                    ["α"] + [f"k={k}" for k in grid_ks], rows,
                                    f"TPOT {t1:.3f} ms; verification = macro TPOT at "
                                    f"concurrency k+1 (run {macro.short})"))
    rows = []
    points = []
    what_if: list[list] = []
    labels = [spec_label(r) for r in specs]
    for r, label in zip(specs, labels):
        if labels.count(label) > 1:  # settings the label can't tell apart
            label = f"{label} #{r.short}"
        k = r.param("experiment.num_speculative_tokens", int)
        acc = r.metrics.get("single_stream_acceptance_rate")
        tpot = r.metrics.get("single_stream_tpot_ms")
        base = r.metrics.get("baseline/single_stream_tpot_ms")
        speedup = r.metrics.get("spec_speedup")
        # Tokens per decode step as the client received them (one chunk per engine step at
        # batch 1), steps without a draft included. Not 1 + accepted/drafts: vLLM's accepted
        # counter also counts tokens accepted past max_tokens and then dropped.
        per_step = r.metrics.get("single_stream_tokens_per_chunk")
        base_chunk = r.metrics.get("baseline/single_stream_tokens_per_chunk")
        if base_chunk is not None and base_chunk > 1.02:
            sec.notes.append(f"run {r.short}: its baseline streamed {base_chunk:.3f} tokens per chunk "
                             "(1 when every step is its own chunk): the server coalesced steps, so "
                             "tokens/step of the speculative server is overstated too")
        a_eff = effective_alpha(per_step - 1, k) if per_step is not None else None
        kind = drafter(r)
        step = step_ms(k, kind == "self") if kind != "unknown" else None
        proj_tpot = step / expected_tokens(a_eff, k) if a_eff is not None and step is not None else None
        # over the run's own baseline, like the measured speedup: the two then differ only
        # through the step cost
        proj = base / proj_tpot if proj_tpot and base else None
        rows.append([label, acc, per_step, a_eff, base, tpot, proj_tpot, speedup, proj,
                     tpot * per_step if tpot is not None and per_step is not None else None,
                     step, r])
        points.append((label, a_eff, speedup, proj))
        sec.figures.append(Figure(f"measured speedup, {label}", speedup, "×", [r],
                                  f"acceptance {acc if acc is not None else float('nan'):.3f}, "
                                  f"{per_step if per_step else float('nan'):.2f} tokens per step")
                           if speedup is not None else
                           _missing(f"measured speedup, {label}", "the run has no baseline"))
        if proj is not None:
            sec.figures.append(Figure(f"projected speedup, {label}", proj, "×", _unique([r, macro]),
                                      f"at its α_eff {a_eff:.3f}"))
        else:
            why = (f"the drafting cost of method {r.params.get('experiment.method')} with draft "
                   f"{r.params.get('experiment.draft_model')} is not measured by any phase"
                   if kind == "unknown" else
                   "needs macro TPOT at concurrency k+1, the run's baseline and its tokens per step")
            sec.figures.append(_missing(f"projected speedup, {label}", why))
        if tpot is not None and per_step is not None and base:
            step_meas = tpot * per_step  # this run's measured cost of one verification step
            what_if.append([label] + [base / (step_meas / expected_tokens(a, k)) for a in alphas] + [r])
    if not specs:
        sec.figures.append(_missing("measured speedup", c.why_missing("spec_decode")))
    else:
        sec.tables.append(Table("Measured against projected (batch 1)",
                                ["setting", "acceptance", "tokens/step", "α_eff", "base TPOT ms",
                                 "spec TPOT ms", "projected TPOT ms", "measured ×", "projected ×",
                                 "measured step ms", "projected step ms", "run"], rows,
                                "tokens/step = streamed tokens per chunk at batch 1; measured "
                                "step = spec TPOT × tokens/step; projected step = macro TPOT at "
                                "k+1 (+ k × TPOT for a self-draft); both speedups are over the "
                                "run's own baseline"))
    if what_if:
        sec.tables.append(Table("Speedup at other acceptance rates, at each run's measured step cost",
                                ["setting"] + [f"α={a:g}" for a in alphas] + ["run"], what_if,
                                "base TPOT / (measured step ms / E(α, k)): what a drafter of the "
                                "same cost with another acceptance would give"))
    if macro and grid_ks:
        sec.plot = {"kind": "spec", "alphas": list(alphas),
                    "series": {f"k={k}, free drafter": [t1 / (step_ms(k, False) / expected_tokens(a, k))
                                                        for a in alphas] for k in grid_ks},
                    "points": points}
    return sec
