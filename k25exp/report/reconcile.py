"""The decode step in milliseconds: micro-benchmarks against the profile, category by category,
at every profiled concurrency (k25exp.report.tpot_model predicts TPOT from the same parts).

Per profiled concurrency c (one profile run each; the profile phase sweeps c on one server):
    micro ms      comm_allreduce / comm_allgather: nccl_burst's allreduce_ms_per_step /
                  allgather_ms_per_step (the step's ops of that kind as one queued burst,
                  through the run's communicator) at tokens = c; moe: MoE layers × vLLM's
                  fused MoE call at c tokens (gemm's moe.tp<N>/vllm_fused_moe, or
                  vllm_marlin_moe for an INT4 checkpoint; never the plain-torch
                  reference); gemm: Σ of the step's other GEMMs at M = c × their count
                  per step (torch F.linear: vLLM's CPU build packs its own). GEMM and MoE
                  calls timed in-stream where the GEMM run has that figure (K calls back
                  to back in one CUDA graph ÷ K: <figure>/latency_us_instream), else
                  isolated (latency_us), and the row says which (k25exp.report.measured)
                  Between measured tokens / batches: log-log interpolation; never outside.
                  World size 1 (the server ran on one rank, k25exp.report.measured.one_rank):
                  the collectives are 0 ms, no burst needed
    profile ms    share_<category> / 100 × decode_step_ms (exposed time, mean over ranks);
                  communication also as the calls' transport and wait per step (both 0 ms
                  at world size 1: nothing to split, no peer to wait for)
    TPOT          the engine's TPOT at concurrency c: macro's server_tpot_ms_mean (vLLM's own
                  histogram; the client's TPOT on a busy host carries delivery stalls, which
                  shrink or stretch it), else the client's tpot_ms_p50
    slowdown      (profiled step + between-steps gap) / TPOT: the decode step's period under
                  the profiler over its period without (TPOT holds the host's gap between two
                  steps, so the step alone would read below 1 where the profiler slows
                  things down). No gap in the profile, no slowdown
"""

from __future__ import annotations

from typing import Optional

from k25exp.gemm.shapes import model_gemm_shapes
from k25exp.report import metrics as M
from k25exp.report.figures import Section, Table, missing
from k25exp.report.measured import (ONE_RANK, auto_kernel, burst_key, interp_loglog, model_of,
                                    one_rank, timed_us, used_us)
from k25exp.report.sources import Campaign
from k25exp.tracking.read import RunView

MICRO_CATEGORIES = ("comm_allreduce", "comm_allgather", "gemm", "moe")
# The rows first in every reconciliation; of them the step burst, the GEMMs and the MoE layers
# (MICRO_CATEGORIES) stand in for their categories in the prediction.
MICRO_ROWS = ("comm_allreduce", "comm_allgather", "comm_all_to_all", "gemm", "moe")
# The categories a profile without its rules' list (trace.categories: older runs) is read for.
UNCOVERED = ("attention", "norm_activation", "memory", "other", "idle")
GEMM_CATEGORIES = ("gemm_dense", "gemm_quantized")
EXPERT_SHAPES = ("expert_gate_up", "expert_down")


def profile_rows(p: RunView) -> tuple[str, ...]:
    """The reconciliation's rows for one profile: the micro rows, then every other category of
    the rules it was analysed with (its tag trace.categories: convolution, comm_other, a
    user's own) and idle. Their shares sum to 100 % of the step, so no category's time falls
    out of the parts; a profile without the tag gets UNCOVERED."""
    tag = p.tags.get("trace.categories")
    if not tag:
        return MICRO_ROWS + UNCOVERED
    rest = [c for c in tag.split(",") if c and c not in MICRO_ROWS and c not in GEMM_CATEGORIES]
    return MICRO_ROWS + tuple(rest) + ("idle",)


def uncovered_parts(per_c: dict[int, dict[str, float]]) -> list[str]:
    """The prediction's parts from the profiles: every row a profile measured that no
    micro-benchmark stands in for (`<row>_profile_ms` in reconcile's metrics), in row order."""
    out: list[str] = []
    for m in per_c.values():
        for key in m:
            row = key[:-len("_profile_ms")] if key.endswith("_profile_ms") else None
            if row and row not in MICRO_CATEGORIES and row not in out:
                out.append(row)
    return out


def shape_of(r: RunView) -> Optional[tuple[int, int]]:
    """The run's request shape: (experiment.input_tokens, experiment.output_tokens), a length
    distribution's centres; None when either was not logged."""
    n_in, n_out = (r.param(f"experiment.{k}_tokens", int) for k in ("input", "output"))
    return None if n_in is None or n_out is None else (n_in, n_out)


def shape_note(profiles: dict[int, RunView], macro: Optional[RunView]) -> str:
    """A note when profiles ran requests of another shape (prompt / output tokens) than the
    macro's: a decode step's cost grows with its context, so their step is not the macro's
    step and the prediction built on it is off by that much. '' when they match or a shape
    was not logged."""
    want = shape_of(macro) if macro else None
    if want is None:
        return ""
    other = {k: got for k, p in sorted(profiles.items()) if (got := shape_of(p)) and got != want}
    if not other:
        return ""
    return ("profiles of another request shape than the macro's (" + f"{want[0]} prompt / {want[1]} "
            "output tokens): " + ", ".join(f"c = {k}: {a} / {b}" for k, (a, b) in other.items())
            + "; their decode steps hold another context than the macro's, so their parts are "
              "not the macro's (profile with experiment.input_tokens / output_tokens as the macro)")


def profile_runs(c: Campaign, macro: Optional[RunView] = None) -> dict[int, RunView]:
    """The latest finished profile run per profiled concurrency: of the macro's request shape
    where the campaign profiled that shape at that concurrency (a context sweep profiles
    several), else of any (shape_note names it)."""
    want = shape_of(macro) if macro else None
    out: dict[int, RunView] = {}
    for r in c.of("profile"):  # newest first
        k = r.param("experiment.concurrency", int)
        if k is None or "decode_step_ms" not in r.metrics:
            continue
        if k not in out or (shape_of(out[k]) != want and shape_of(r) == want):
            out[k] = r
    return out


def profile_ms(p: RunView, category: str) -> Optional[float]:
    step = p.metrics.get("decode_step_ms")
    if category == "gemm":
        parts = [p.metrics.get(f"share_{k}") for k in GEMM_CATEGORIES]
        share = sum(x for x in parts if x is not None) if any(x is not None for x in parts) else None
    else:
        share = p.metrics.get(f"share_{category}")
    return share / 100 * step if share is not None and step else None


class Micro:
    """The micro-benchmark estimate of each covered category at a concurrency (ms/step)."""

    def __init__(self, c: Campaign, served: Optional[Campaign] = None):
        """`served`: the campaign whose server the burst stands in for (graph replay or eager
        burst, as that server ran), when the bursts come from another campaign; then `c` is
        that other campaign and its server's world size is not asked."""
        bursts = [r for r in c.of("nccl_burst") if r.param("experiment.ops_per_step") is None]
        self.burst_runs: dict[int, RunView] = {}
        for r in bursts:
            self.burst_runs.setdefault(r.param("experiment.tokens", int), r)
        self.gemm = c.of("gemm")
        self.burst_key = burst_key(served or c, bursts[0] if bursts else None)  # graph replay if served so
        # the served run that shows one rank: no collectives in the step (0 ms, not missing)
        self.one_rank = one_rank(c) if served is None else None
        self.why: dict[str, str] = {}
        # (category, c) -> how its GEMM calls were timed: "in-stream", "isolated" or a mix
        self.timing: dict[tuple[str, int], str] = {}
        if not bursts and self.one_rank is None:
            self.why["comm"] = ("no nccl_burst run of the step's collectives (ops_per_step null) "
                                f"in campaign {c.id}")
        if not self.gemm:
            self.why["gemm"] = self.why["moe"] = f"no gemm run in campaign {c.id}"

    def _burst(self, key: str, c: int) -> Optional[float]:
        pts = {t: r.metrics[key] for t, r in self.burst_runs.items() if key in r.metrics}
        return interp_loglog(pts, c)

    def runs_for(self, category: str) -> list[RunView]:
        if category.startswith("comm"):
            return [self.one_rank] if self.one_rank else list(self.burst_runs.values())
        return self.gemm[:1]

    def at(self, category: str, c: int) -> Optional[float]:
        if category in ("comm_allreduce", "comm_allgather", "comm") and self.one_rank:
            return 0.0  # world size 1: vLLM issues no collective at TP 1
        if category == "comm_allreduce":
            return self._burst("allreduce_ms_per_step", c)
        if category == "comm_allgather":
            return self._burst("allgather_ms_per_step", c)
        if category == "comm":
            return self._burst(self.burst_key, c)
        if not self.gemm:
            return None
        g = self.gemm[0]
        model = model_of(g)
        tp = g.param("experiment.tp", int, 1)
        if category == "moe":
            kernel, _, us, how = moe_us(g, tp, c)
            if us is None:
                hist = sorted(set(g.history(f"moe.tp{tp}/{kernel}/latency_us")) |
                              set(g.history(f"moe.tp{tp}/{kernel}/latency_us_instream")))
                self.why["moe"] = (f"gemm run {g.short} has no {kernel} time at {c} tokens "
                                   f"(timed: {hist or 'none'})")
                return None
            self.timing[("moe", c)] = how
            return us * (model.num_hidden_layers - model.first_k_dense_replace) / 1e3
        if category == "gemm":
            total, hows = 0.0, []
            for s in model_gemm_shapes(model, tp, True):
                if s.name in EXPERT_SHAPES:
                    continue
                label = f"{s.name}.tp{tp}"
                k = auto_kernel(g, label)
                us, how = used_us(g, f"{label}/{k}", c) if k else (None, "")
                if us is None:
                    self.why["gemm"] = f"gemm run {g.short} has no {label} time at M = {c}"
                    return None
                total += us * s.count_per_layer * s.layers
                hows.append(how)
            self.timing[("gemm", c)] = _mix(hows)
            return total / 1e3
        return None


def _mix(hows: list[str]) -> str:
    """'in-stream', 'isolated', or how many of the GEMM shapes were timed each way."""
    if len(set(hows)) <= 1:
        return hows[0] if hows else ""
    return (f"{hows.count('in-stream')} GEMM shapes in-stream, {hows.count('isolated')} isolated "
            "(no in-stream figure at this M)")


def moe_kernel(gemm: RunView) -> str:
    """The MoE candidate the server runs: vLLM's Marlin W4A16 MoE for an INT4 checkpoint
    (compressed-tensors W4A16 experts), its bf16 fused MoE otherwise."""
    w4a16 = gemm.params.get("model.quant.method") == "w4a16"
    return "vllm_marlin_moe" if w4a16 else "vllm_fused_moe"


def moe_us(gemm: RunView, tp: int, tokens: int
           ) -> tuple[str, dict[str, Optional[float]], Optional[float], str]:
    """(kernel, {isolated, in-stream} µs, µs used, "in-stream" | "isolated") of one MoE layer
    call of the candidate the server runs, at `tokens` (log-log between timed token counts):
    moe.tp<N>/<kernel>/latency_us_instream where the run has it, else .../latency_us."""
    kernel = moe_kernel(gemm)
    prefix = f"moe.tp{tp}/{kernel}"
    us, how = used_us(gemm, prefix, tokens)
    return kernel, timed_us(gemm, prefix, tokens), us, how


def engine_tpot(macro: Optional[RunView]) -> tuple[dict[int, float], str]:
    """Per level: the server's mean TPOT where logged, else the client's p50; and which."""
    if not macro:
        return {}, ""
    srv = macro.history("server_tpot_ms_mean")
    if srv:
        return dict(srv), "server mean (engine clock)"
    return dict(macro.history("tpot_ms_p50")), "client p50"


def reconcile(c: Campaign, micro: Optional[Micro] = None,
              tpot: Optional[tuple[dict[int, float], str]] = None
              ) -> tuple[Section, dict[int, dict[str, float]]]:
    """The reconciliation section and, per profiled concurrency, its metrics. `micro` and
    `tpot` (engine_tpot of the macro run) are built here unless the caller shares its own."""
    sec = Section("The decode step in milliseconds: micro-benchmarks vs the profile")
    macro = c.closed_loop_macro()
    profiles = profile_runs(c, macro)
    micro = micro or Micro(c)
    per_c: dict[int, dict[str, float]] = {}
    if not profiles:
        sec.figures.append(missing(M.RECONCILED, c.why_missing("profile")))
        return sec, per_c
    tpots, tpot_src = tpot or engine_tpot(macro)
    solo = micro.one_rank  # world size 1: the collectives and the wait are 0 ms, not missing
    if solo:
        sec.notes.append(f"{ONE_RANK} (the server ran on one rank: run {solo.short})")
    if note := shape_note(profiles, macro):
        sec.notes.append(note)
    for k in sorted(profiles):
        p = profiles[k]
        rows, m, caption = profile_metrics(p, k, micro, tpots.get(k))
        per_c[k] = m
        sec.tables.append(Table(
            f"concurrency {k}: ms per decode step (profile run {p.short})",
            ["category", "micro ms", "profile ms", "micro − profile", "note"], rows,
            f"macro TPOT ({tpot_src}) at c={k}: {_f(tpots.get(k))} ms (run "
            f"{macro.short if macro else '-'}); " + caption))
    return sec, per_c


def profile_metrics(p: RunView, k: int, micro: Micro, tpot: Optional[float]
                    ) -> tuple[list[list], dict[str, float], str]:
    """One profile at concurrency k reconciled: its table's rows, its metrics (the report's
    recon.* at step k: what the prediction reads) and its caption after the macro's TPOT.
    `tpot`: the macro's TPOT at k (None: none measured there)."""
    solo = micro.one_rank  # world size 1: the collectives and the wait are 0 ms, not missing
    rows, m = [], {}
    for cat in profile_rows(p):
        mi = micro.at(cat, k) if cat in MICRO_CATEGORIES else None
        pr = profile_ms(p, cat)
        if solo and cat.startswith("comm") and pr is None:
            pr = 0.0
        rows.append([cat, mi, pr, (mi - pr) if mi is not None and pr is not None else None,
                     _row_note(micro, cat, k, mi)])
        if mi is not None:
            m[f"{cat}_micro_ms"] = mi
        if pr is not None:
            m[f"{cat}_profile_ms"] = pr
    comm = {x: p.metrics.get(f"comm_{x}_ms_per_step") for x in ("transport", "wait", "raw")}
    if solo:
        comm = {x: 0.0 if v is None else v for x, v in comm.items()}
    burst = micro.at("comm", k)
    rows.append(["communication (step burst)", burst, comm["transport"],
                 (burst - comm["transport"]) if None not in (burst, comm["transport"]) else None,
                 (f"{ONE_RANK}; " if solo else "") +
                 f"profile: transport {_f(comm['transport'])} + wait {_f(comm['wait'])} = "
                 f"raw {_f(comm['raw'])} ms (calls' own durations, mean over ranks)"])
    in_server = p.metrics.get("server_burst_transport_ms")  # the burst in the server's workers
    if in_server is not None:
        rows.append(["communication (in-server burst)", in_server, comm["transport"],
                     (in_server - comm["transport"]) if comm["transport"] is not None else None,
                     "the same burst in the server's own TP workers, back to back (profile's "
                     "server_burst_transport_ms); − the step's transport = the op pattern"])
    step = p.metrics.get("decode_step_ms")
    gap = p.metrics.get("between_steps_ms")
    rows.append(["between steps (host)", None, gap, None,
                 "median gap between consecutive decode steps: in no step's category"])
    m_pf = p.metrics.get("prefill_us_per_token")  # the profile's prefill steps, per token
    if m_pf is not None:
        m["prefill_us_per_token"] = m_pf
    for name, v in (("between_steps_ms", gap), ("comm_burst_ms", burst),
                    ("comm_transport_ms", comm["transport"]),
                    ("comm_wait_ms", comm["wait"]), ("comm_server_burst_ms", in_server),
                    ("profiled_step_ms", step), ("tpot_ms", tpot)):
        if v is not None:
            m[name] = v
    if step and tpot and gap is not None:
        m["profiler_slowdown"] = (step + gap) / tpot
    # the profile's own server start without the profiler, against the macro's server
    plain, plain_n = (p.metrics.get(f"unprofiled_tpot_{x}") for x in ("ms_mean", "n"))
    start_note = ""
    if plain is not None:
        m["profile_server_tpot_ms"] = plain
        start_note = (f"; the profile's server without the profiler: {_f(plain)} ms TPOT "
                      f"(mean of {_f(plain_n, 0)} requests)")
        if tpot:
            m["server_start_pct"] = (plain / tpot - 1) * 100
            start_note += (f", {m['server_start_pct']:+.1f} % against the macro's server "
                           "(another start of the same server: what no part explains)")
    ref = p.metrics.get("unprofiled_decode_only_tpot_ms")  # that start's decode-only TPOT
    if ref is not None and step and gap is not None:
        m["profiler_overhead_ms"] = step + gap - ref
        start_note += (f"; the profiler's overhead: {m['profiler_overhead_ms']:.3f} ms per "
                       f"step (profiled step + gap − that start's decode-only TPOT without "
                       f"it, {_f(ref)} ms)")
    caption = (f"profiled step {_f(step)} ms; profiler slowdown ((profiled step + between-steps "
               "gap) / TPOT) "
               + (f"{_f(m['profiler_slowdown'], 2)}×" if "profiler_slowdown" in m else
                  "missing (" + ("no between_steps_ms in the profile" if gap is None else
                                 "needs the profiled step and TPOT") + ")")
               + f"; overlap {_f(p.metrics.get('overlap_share'), 1)} %"
               " of the step counted twice by raw category times" + start_note)
    return rows, m, caption


def _row_note(micro: Micro, cat: str, k: int, mi: Optional[float]) -> str:
    """A reconciliation row's note: why its micro figure is missing, or what it is."""
    if cat not in MICRO_CATEGORIES:
        return "no micro-benchmark"
    if mi is None:
        return micro.why.get(cat.split("_")[0], "")
    if cat.startswith("comm") and micro.one_rank:
        return ONE_RANK
    how = micro.timing.get((cat, k))
    return f"timed {how}" if how else ""


def _f(v: Optional[float], nd: int = 3) -> str:
    return "-" if v is None else f"{v:.{nd}f}"
