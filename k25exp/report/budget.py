"""The decode-time budget at batch 1 (one decode step of one sequence), in milliseconds.

    tpot_ms        macro's single_stream_tpot_ms (p50 of (e2e − ttft)/(tokens − 1))
    comm_ms        nccl_burst at tokens=1: the decode step's collectives (2 × layers + 2:
                   embedding all-reduce, 2 per layer, logits all-gather) through the run's
                   communicator (vLLM's own by default), as one burst (burst_ms; its CUDA-
                   graph replay, graph_burst_ms, when the server ran graphs; its transport,
                   burst_transport_ms, where the run split it at each op's last arrival as the
                   profile splits the server's: measured.burst_key).
                   World size 1 (the served runs' server.tp 1, measured.one_rank): 0 ms, and
                   every communication share 0 %: no collectives, no peer to wait for
    gemm_ms        Σ over the model's GEMMs of latency(M=1) × count_per_layer × layers, from
                   the GEMM runs (k25exp.gemm.shapes), the routed experts as vLLM runs them:
                   one fused MoE call per MoE layer at 1 token (moe.tp<N>/<the server's MoE
                   kernel>, reconcile.moe_kernel). Only a GEMM run without that call counts
                   each routed expert's two GEMMs top_k times, and the row says so (a GPU
                   pays a launch per call: 960 Marlin calls for Kimi's rank read 217 % of TPOT).
                   latency: the in-stream figure (<figure>/latency_us_instream: K calls back
                   to back in one CUDA graph over rotating weight copies > 2 × L2, ÷ K) where
                   the run has it, else the isolated one (<figure>/latency_us: one call
                   between two events after an L2 flush, which on a GPU carries a fixed cost
                   per call the server's graph does not pay); the table shows both and which
    rest_ms        tpot − comm − gemm (attention, norms, routing, sampling, host overhead)
    comm share     in percent, over one denominator, the batch-1 TPOT: 100 × comm_ms /
                   tpot_ms (burst) beside the batch-1 profile's communication transport and
                   wait per step / tpot_ms (the calls' time split at the last rank's arrival,
                   k25exp.traces.comm_split); the difference burst − transport is in
                   percentage points. The profile's exposed share of its own (profiled) step
                   is shown too; gemm_share = 100 × gemm_ms / tpot_ms
    placement,     burst − transport in two named parts, where the batch-1 profile timed the
    op pattern     same burst inside the server's own TP workers (server_burst_transport_ms,
                   k25exp.serving.collective_probe): placement = burst − in-server burst (the
                   ops in processes of their own vs in the server's, both back to back), op
                   pattern = in-server burst − the profile's transport (back to back vs between
                   the layers' work, as the step issues them); each in pp of the batch-1 TPOT
    the profile    the one at concurrency 1. Without one, the newest at another concurrency
                   gives the exposed share of its own step and the category table, both named
                   with its concurrency (and the tag report.budget_profile_concurrency); its
                   transport and wait per step over the batch-1 TPOT would mix two batches,
                   so those shares (and the pp difference) are missing, saying so
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from k25exp.gemm.shapes import model_gemm_shapes
from k25exp.report import metrics as M
from k25exp.report.figures import Figure, Section, Table, missing, share, unique_runs
from k25exp.report.measured import (ONE_RANK, auto_kernel, burst_key, model_of, one_rank,
                                    timed_us, used_us)
from k25exp.report.reconcile import EXPERT_SHAPES, moe_us
from k25exp.report.sources import Campaign
from k25exp.tracking.read import RunView

PROFILE_GROUPS = ("communication", "gemm")  # k25exp.traces: sums of comm_* / gemm_* categories


GEMM_COLUMNS = ["GEMM", "n × k", "per step", "kernel", "µs isolated", "µs in-stream", "used",
                "µs per step", "run"]
GEMM_TABLE_NOTE = ("µs isolated: one call between two CUDA events after an L2 flush "
                   "(<figure>/latency_us; on a GPU it carries a fixed cost of a few µs per call "
                   "that the server's CUDA graph does not pay); µs in-stream: K calls back to "
                   "back in one CUDA graph over rotating weight copies larger than 2 × L2, ÷ K "
                   "(<figure>/latency_us_instream, CUDA only); used: the in-stream figure where "
                   "the run has it, else the isolated one")


def gemm_step(gemm_runs: Sequence[RunView], kernel: Optional[str] = None
              ) -> tuple[Optional[float], Table, list[str], list[RunView]]:
    """GEMM time of one batch-1 decode step (ms), its per-shape table, what's missing. Each
    call counts its in-stream time where the run has one at M = 1, else its isolated time;
    the table shows both."""
    table = Table("GEMMs of one decode step at M = 1", list(GEMM_COLUMNS), [], GEMM_TABLE_NOTE)
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
    total, absent, used = 0.0, [], []
    fused = _fused_moe_at_1(gemm_runs, tp)
    if fused is not None:
        r, k, both, us, how = fused
        layers = next(s.layers for s in shapes if s.name in EXPERT_SHAPES)
        shapes = [s for s in shapes if s.name not in EXPERT_SHAPES]
        total += us * layers
        used.append(r)
        table.rows.append([f"routed experts (one fused MoE call, top-{model.num_experts_per_tok})",
                           "-", layers, k, both["isolated"], both["in-stream"], how, us * layers, r])
    for s in shapes:
        label = f"{s.name}.tp{tp}"
        found = None
        for r in gemm_runs:  # newest first: the latest run that timed this shape
            k = kernel or auto_kernel(r, label)
            us, how = used_us(r, f"{label}/{k}", 1) if k else (None, "")
            if us is not None:
                found = (r, k, timed_us(r, f"{label}/{k}", 1), us, how)
                break
        per = s.count_per_layer * s.layers
        if found is None:
            absent.append(s.name)
            table.rows.append([s.name, f"{s.n} × {s.k}", per, kernel or "auto", None, None, None,
                               None, "missing"])
            continue
        r, k, both, us, how = found
        total += us * per
        used.append(r)
        table.rows.append([s.name, f"{s.n} × {s.k}", per, k, both["isolated"], both["in-stream"],
                           how, us * per, r])
    return (total / 1e3 if not absent else None), table, absent, used


def _fused_moe_at_1(gemm_runs: Sequence[RunView], tp: int
                    ) -> Optional[tuple[RunView, str, dict[str, Optional[float]], float, str]]:
    """(run, kernel, {isolated, in-stream} µs, µs used, which) of the newest GEMM run's fused
    MoE call at 1 token: the kernel the server runs for the model (vLLM's Marlin MoE for INT4
    experts, its fused MoE else), in-stream where the run timed it so, else isolated."""
    for r in gemm_runs:
        k, both, us, how = moe_us(r, tp, 1)
        if us is not None:
            return r, k, both, us, how
    return None


def decode_budget(c: Campaign, gemm_kernel: Optional[str] = None) -> Section:
    sec = Section("Decode-time budget at batch 1")
    macro = c.latest("macro", lambda r: "single_stream_tpot_ms" in r.metrics)
    burst = (c.latest("nccl_burst", lambda r: r.param("experiment.tokens", int) == 1
                      and r.param("experiment.ops_per_step") is None)
             or c.latest("nccl_burst", lambda r: r.param("experiment.tokens", int) == 1))
    profile = c.latest("profile", lambda r: r.param("experiment.concurrency", int) == 1) \
        or c.latest("profile")
    if profile:
        k = profile.param("experiment.concurrency", int)
        sec.tags["report.budget_profile_concurrency"] = (
            "1" if k == 1 else f"{k} (no profile at concurrency 1)")
    tpot = macro.metrics["single_stream_tpot_ms"] if macro else None
    sec.figures.append(Figure(M.TPOT, tpot, [macro], "single-stream p50, client clock") if macro
                       else missing(M.TPOT, c.why_missing("macro")))
    if macro and macro.metrics.get("single_stream_valid") == 0:
        sec.notes.append(_invalid_single_stream(macro))
    solo = one_rank(c)  # world size 1: no collectives, no wait: 0 ms, never missing
    if solo:
        burst = None
        sec.notes.append(f"{ONE_RANK} (the server ran on one rank: run {solo.short})")
    comm_fig = (Figure(M.COMM, 0.0, [solo], ONE_RANK) if solo else _comm_figure(c, burst))
    comm = comm_fig.value
    sec.figures.append(comm_fig)
    gemm_ms, table, gmiss, gruns = gemm_step(c.of("gemm"), gemm_kernel)
    if gemm_ms is not None:
        hows = [row[6] for row in table.rows]
        sec.figures.append(Figure(M.GEMM, gemm_ms, unique_runs(gruns),
                                  f"{len(table.rows)} GEMMs at M = 1, × count per layer × layers; "
                                  f"timed in-stream: {hows.count('in-stream')}, isolated: "
                                  f"{hows.count('isolated')} (table below)"))
    else:
        why = (c.why_missing("gemm") if not c.of("gemm") else
               f"missing: shapes not timed at M=1 in any GEMM run: {', '.join(gmiss)} "
               "(run experiment=gemm experiment.shapes=[all])")
        sec.figures.append(missing(M.GEMM, why))
    if table.rows:
        sec.tables.append(table)
    rest = tpot - comm - gemm_ms if None not in (tpot, comm, gemm_ms) else None
    sec.figures.append(Figure(M.REST, rest, unique_runs([macro, burst or solo]),
                              "TPOT − communication − GEMM") if rest is not None else
                       missing(M.REST, "needs TPOT, communication and GEMM"))
    if rest is not None and rest < 0:
        sec.notes.append(f"communication + GEMM exceed the measured TPOT by {-rest:.3f} ms: the "
                         "isolated measurements cost more than the server's real step (other "
                         "transport, warm caches or overlap in the server)")
    sec.figures += (_one_rank_shares(solo, tpot, macro, profile) if solo else
                    _comm_shares(c, comm, tpot, burst, macro, profile))
    if burst and burst.param("experiment.communicator", str, "torch") != "vllm":
        sec.notes.append(f"burst run {burst.short} timed PyTorch's c10d "
                         f"({burst.param('hardware.backend')}), not vLLM's communicator (the "
                         "CPU build's shared-memory all-reduce, the GPU build's custom "
                         "all-reduce): it answers how c10d would do, not what the server pays")
    if gemm_ms is not None and tpot:
        sec.figures.append(Figure(M.GEMM_SHARE, share(gemm_ms, tpot), unique_runs(gruns + [macro])))
    if profile:
        sec.tables.append(_profile_table(profile))
    sec.plot = {"kind": "budget", "tpot": tpot, "parts": {"communication (burst)": comm,
                                                          "GEMM": gemm_ms, "rest": rest}}
    return sec


def _invalid_single_stream(macro: RunView) -> str:
    m = macro.metrics
    why = (["the client lagged"] if m.get("single_stream_client_lagged", 1) else []) + (
        [f"{m['single_stream_delivery_stalls']:.0f} delivery stall(s), longest "
         f"{m.get('single_stream_delivery_stall_ms_max', 0):.0f} ms"]
        if m.get("single_stream_delivery_stalls") else [])
    return (f"macro run {macro.short}: the single-stream phase is flagged invalid "
            f"({'; '.join(why)}), so its TPOT includes delay outside the engine; "
            "rerun on a quieter host")


def _comm_figure(c: Campaign, burst: Optional[RunView]) -> Figure:
    """The step's collectives at batch 1: the burst figure that matches the served config."""
    if not burst:
        return missing(M.COMM, c.why_missing("nccl_burst", "at experiment.tokens=1"))
    key = burst_key(c, burst)
    comm = burst.metrics.get(key)
    if comm is None:
        return missing(M.COMM, f"run {burst.short} has no {key}")
    ops = burst.param("experiment.ops_per_step", int)
    what = (f"the step's {burst.metrics.get('ops_per_step', 0):.0f} collectives "
            f"({burst.metrics.get('bytes_per_step', 0):.0f} B)" if ops is None else
            f"{ops} AllReduces of {burst.param('experiment.message_bytes')} B (the seed's "
            "burst: no embedding all-reduce, no logits all-gather)")
    how = {"graph_burst_ms": "CUDA-graph replay (the server runs graphs)",
           "burst_transport_ms": "queued, eager, transport only: each op from the last rank's "
           f"arrival to its end (the burst's own wait, {burst.metrics.get('burst_wait_ms', 0):.3f} "
           f"ms of {burst.metrics.get('burst_ms', 0):.3f}, left out: ops back to back make it)"
           }.get(key, "queued, eager")
    return Figure(M.COMM, comm, [burst],
                  f"{what}, {how}, communicator {burst.param('experiment.communicator', str, 'torch')}"
                  f" ({burst.tags.get('communicator.impl', burst.param('hardware.backend'))}) on "
                  f"{burst.param('hardware.world_size')} ranks")


def _comm_shares(c: Campaign, comm: Optional[float], tpot: Optional[float],
                 burst: Optional[RunView], macro: Optional[RunView],
                 profile: Optional[RunView]) -> list[Figure]:
    """Communication's share by the burst and by the profile, over one denominator (TPOT)."""
    figs = []
    cs_burst = share(comm, tpot)
    figs.append(Figure(M.COMM_SHARE_BURST, cs_burst, [r for r in (burst, macro) if r])
                if cs_burst is not None else
                missing(M.COMM_SHARE_BURST, "needs the burst and TPOT"))
    k = profile.param("experiment.concurrency", int) if profile else None
    batch1 = profile if k == 1 else None  # per-step times over the batch-1 TPOT: batch 1 only
    split = {x: batch1.metrics.get(f"comm_{x}_ms_per_step") for x in ("transport", "wait")} \
        if batch1 else {}
    for x, metric in (("transport", M.COMM_SHARE_TRANSPORT), ("wait", M.COMM_SHARE_WAIT)):
        v = share(split.get(x), tpot)
        if v is not None:
            figs.append(Figure(metric, v, [batch1, macro],
                               f"{split[x]:.3f} ms per step (mean over ranks) at concurrency 1, "
                               "over the batch-1 TPOT"))
        elif profile and not batch1:
            figs.append(missing(metric, f"no profile at concurrency 1 (run {profile.short} "
                                f"profiled concurrency {k}: its per-step time over the batch-1 "
                                "TPOT would mix two batches)", [profile]))
        else:
            figs.append(missing(metric, "needs the batch-1 TPOT and a profile of ≥ 2 ranks "
                                "(the wait/transport split)" if profile else c.why_missing("profile")))
    # the profile logs shares in percent (mean over ranks), as the report does
    if profile and "share_communication" in profile.metrics:
        metric = M.COMM_SHARE_PROFILE if batch1 else dataclasses.replace(
            M.COMM_SHARE_PROFILE, label=f"{M.COMM_SHARE_PROFILE.label} at concurrency {k} "
                                        "(no batch-1 profile)")
        figs.append(Figure(metric, profile.metrics["share_communication"],
                           [profile], f"exposed communication / profiled decode step of "
                           f"{profile.metrics.get('decode_step_ms', float('nan')):.3f} ms at "
                           f"concurrency {k}, {profile.metrics.get('steps_analysed', 0):.0f} steps"))
    else:
        figs.append(missing(M.COMM_SHARE_PROFILE,
                            f"profile run {profile.short} has no share_communication"
                            if profile else c.why_missing("profile")))
    cs_tr = share(split.get("transport"), tpot)
    if cs_burst is not None and cs_tr is not None:
        figs.append(Figure(M.COMM_SHARE_DIFF, cs_burst - cs_tr, [burst, macro, profile],
                           "over the same denominator (TPOT)"))
    elif profile and not batch1:
        figs.append(missing(M.COMM_SHARE_DIFF, f"no profile at concurrency 1 (run {profile.short} "
                            f"profiled concurrency {k})", [profile]))
    else:
        figs.append(missing(M.COMM_SHARE_DIFF, "needs the burst, TPOT and the profile's transport"))
    return figs + _placement_and_pattern(cs_burst, cs_tr, tpot, burst, macro, profile, batch1)


def _placement_and_pattern(cs_burst: Optional[float], cs_tr: Optional[float],
                           tpot: Optional[float], burst: Optional[RunView],
                           macro: Optional[RunView], profile: Optional[RunView],
                           batch1: Optional[RunView]) -> list[Figure]:
    """burst − profile transport in two parts, by the same burst timed inside the server's
    workers (the batch-1 profile's server_burst_transport_ms): placement = burst − in-server
    burst (own processes vs the server's, same back-to-back ops), op pattern = in-server
    burst − the step's own transport (ops back to back vs between the layers' work)."""
    server = batch1.metrics.get("server_burst_transport_ms") if batch1 else None
    why = ("no profile at concurrency 1" if profile and not batch1 else
           f"profile run {profile.short} timed no in-server burst: "
           f"{profile.tags.get('server_burst.skipped', 'no server_burst_transport_ms')}"
           if profile else "needs a profile at concurrency 1")
    cs_server = share(server, tpot)
    if cs_server is None:
        runs = [profile] if profile else []
        return [missing(m, why if server is None else "needs the batch-1 TPOT", runs) for m in (M.COMM_SHARE_SERVER_BURST, M.COMM_DIFF_PLACEMENT, M.COMM_DIFF_PATTERN)]
    n = batch1.metrics.get("server_burst_bursts", 0)
    figs = [Figure(M.COMM_SHARE_SERVER_BURST, cs_server, [batch1, macro],
                   f"{server:.3f} ms per step: the step's collectives in the server's own TP "
                   f"workers, back to back, transport only, median of {n:.0f} bursts (the "
                   "profile run's tag server_burst.timing says how)")]
    figs.append(Figure(M.COMM_DIFF_PLACEMENT, cs_burst - cs_server, [burst, batch1, macro],
                       "the same ops back to back in processes of their own vs in the server's")
                if cs_burst is not None else missing(M.COMM_DIFF_PLACEMENT, "needs the burst"))
    figs.append(Figure(M.COMM_DIFF_PATTERN, cs_server - cs_tr, [batch1, macro],
                       "back to back vs issued between the layers' work, as the server's step "
                       "does (both in the server's workers)")
                if cs_tr is not None else missing(M.COMM_DIFF_PATTERN, "needs the profile's transport"))
    return figs


def _one_rank_shares(solo: RunView, tpot: Optional[float], macro: Optional[RunView],
                     profile: Optional[RunView]) -> list[Figure]:
    """World size 1: every communication share is 0 % (no collectives, no wait), over TPOT
    as at any world size; the profile's own share where it logged one."""
    runs = unique_runs([solo, macro])
    figs = [Figure(metric, 0.0, runs, ONE_RANK) if tpot else missing(metric, "needs the batch-1 TPOT")
            for metric in (M.COMM_SHARE_BURST, M.COMM_SHARE_TRANSPORT, M.COMM_SHARE_WAIT)]
    logged = profile.metrics.get("share_communication") if profile else None
    figs.append(Figure(M.COMM_SHARE_PROFILE, logged if logged is not None else 0.0,
                       unique_runs([profile or solo]),
                       f"exposed communication / profiled decode step, run {profile.short}"
                       if logged is not None else ONE_RANK))
    for metric in (M.COMM_SHARE_DIFF, M.COMM_SHARE_SERVER_BURST, M.COMM_DIFF_PLACEMENT,
                   M.COMM_DIFF_PATTERN):
        figs.append(Figure(metric, 0.0, runs, ONE_RANK) if tpot else
                    missing(metric, "needs the batch-1 TPOT"))
    return figs


def _profile_table(profile: RunView) -> Table:
    per_rank = ("_min", "_median", "_max")
    shares = sorted(((k[6:], v) for k, v in profile.metrics.items()
                     if k.startswith("share_") and not k.endswith(per_rank)), key=lambda kv: -kv[1])
    # the groups (communication, gemm) are sums of categories: listed after them
    shares = ([kv for kv in shares if kv[0] not in PROFILE_GROUPS] +
              [kv for kv in shares if kv[0] in PROFILE_GROUPS])
    return Table(f"Profile: share of the decode step by category (run {profile.short})",
                 ["category", "share %", "min over ranks %", "max over ranks %"],
                 [[f"{k} (group)" if k in PROFILE_GROUPS else k, v,
                   profile.metrics.get(f"share_{k}_min"),
                   profile.metrics.get(f"share_{k}_max")] for k, v in shares],
                 f"decode step {profile.metrics.get('decode_step_ms', float('nan')):.3f} ms"
                 f" under the profiler, concurrency {profile.param('experiment.concurrency')}")
