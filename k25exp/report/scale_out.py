"""TPOT at TP N predicted from one TP-N rank served on one device, plus the step's collectives.

A campaign of `model.tp_rank_of=N` serves, on one device, exactly the layers one of N
tensor-parallel ranks runs (k25exp.model.tp_rank). Its engine TPOT at concurrency c is that
rank's decode step without communication. At TP N every step also runs the collectives vLLM
issues at TP N: one all-reduce after the vocab-parallel embedding, two per layer, and the
logits all-gather (2 × num_hidden_layers + 2 ops). So, per macro level c:

    TPOT_N(c) predicted = rank TPOT(c) (server mean, the engine's clock) + collectives_N(c)
    tok/s_N(c)          = c / TPOT_N(c) (output tokens per second over the c streams)

collectives_N(c), from the best source there is:
  * measured: the step burst (nccl_burst, ops_per_step null) of a campaign run on the N-GPU
    hardware (experiment.scale_out.collectives_campaign), at tokens = c (log-log between the
    measured token counts, never outside), the CUDA-graph replay when the rank was served
    with graphs and the burst has one;
  * else modelled, each op as α + bus bytes / β (nccl-tests' definitions, GB/s = 1e9 B/s):
        all-reduce of S = c × hidden × dtype bytes (14,336 B × c for Kimi), 2 × layers + 1
        of them:   α + S × 2(n − 1)/n / β
        logits all-gather, S = vocab × c × dtype bytes in all (vocab / N × c × dtype bytes
        per rank):  α + S × (n − 1)/n / β
    β: the bus bandwidth of the all-reduce sweep (allreduce_sweep, busbw_gbps at its largest
    message, ≥ 2 ranks) in the collectives campaign where there is one, "measured"; else the
    link rate of the box the external burst was measured on (experiment.scale_out.external.
    hardware: hardware.link_gbps, "nominal" unless its link_gbps_source says measured).
    α: the external burst's time per op (by default the seed campaign's 122 all-reduces of
    14,336 B in 6.81 ms on 8 × RTX PRO 6000 PCIe) less its own bytes' time at β, so the model
    passes through that measured point: α = ms / ops − op_bytes × 2(n − 1)/n / β. Quoted as
    theirs, never as k25exp's;
  * else (no box configured, experiment.scale_out.external.hardware null) the external
    burst's time per op × the step's ops, the same at every c.

Beside each level the table shows the seed's own served figures where it has one at that
concurrency (experiment.scale_out.external.seed_tpot_ms / seed_tok_s), and says when the
rank ran on other GPUs than the box the prediction prices the collectives for. What only N
GPUs can give is listed as missing with that reason: the step's collectives measured at TP N
(when no collectives campaign measured them) and their wait/transport split (a profile of N
ranks serving the whole model). The assumptions (every one a way the prediction can be off)
are listed in the section.
"""

from __future__ import annotations

from typing import Callable, Optional

from k25exp import nominal
from k25exp.report import metrics as M
from k25exp.report.figures import Figure, Section, Table, missing
from k25exp.report.measured import model_of
from k25exp.report.reconcile import Micro, engine_tpot
from k25exp.report.sources import Campaign, ReportError
from k25exp.tracking.read import RunView

ASSUMPTIONS = (
    "every rank runs the step the measured rank ran (dummy weights: the router's random "
    "scores spread tokens evenly; a trained router's hot experts make some ranks slower)",
    "the collectives are on the step's critical path, none hidden behind compute (vLLM's TP "
    "all-reduces are: each layer's output needs the sum)",
    "the ranks stay in lockstep: no wait for a late rank beyond what the burst itself holds",
    "the rank's host work per step (scheduling, sampling, launch) is the same at TP N as at "
    "TP 1, where one process drives one GPU",
)
MODEL_ASSUMPTION = (
    "each collective costs α + bus bytes / β: β is a ring at the bus bandwidth of the largest "
    "message at every size (small messages are latency-bound, which α holds); the logits "
    "all-gather has the all-reduce's α; α, the external burst's time per op less its bytes' "
    "time, is a property of the box and software it was measured on")


class Link:
    """β and α for the modelled collectives (module docstring), and where each comes from."""

    def __init__(self, beta_gbps: float, beta_src: str, kind: str, external: dict, n: int,
                 runs: list[RunView]):
        self.beta, self.kind, self.runs = beta_gbps, kind, runs
        per_op_us = external["ms"] / external["ops"] * 1e3
        n_ext = (external.get("hardware") or {}).get("world_size") or n
        self.alpha_us = max(0.0, per_op_us - _bus_us(external["op_bytes"], 2 * (n_ext - 1) / n_ext,
                                                     beta_gbps))
        self.describe = (f"modelled, α + bytes/β: α {self.alpha_us:.2f} µs per op (the "
                         f"external burst, not measured by k25exp: {external['source']}; "
                         f"{per_op_us:.2f} µs per op less its {external['op_bytes']} B at β), "
                         f"β {beta_gbps:g} GB/s {kind} ({beta_src})")


def _bus_us(nbytes: float, factor: float, gbps: float) -> float:
    """Microseconds to move nbytes × factor (the bus bytes) at gbps (1e9 B/s)."""
    return nbytes * factor / (gbps * 1e9) * 1e6


def modelled_ms(link: Link, c: int, hidden: int, vocab: int, dtype_bytes: int, layers: int,
                n: int) -> float:
    """The step's collectives at c tokens: 2 × layers + 1 all-reduces + the logits all-gather."""
    ar = link.alpha_us + _bus_us(c * hidden * dtype_bytes, 2 * (n - 1) / n, link.beta)
    ag = link.alpha_us + _bus_us(vocab * c * dtype_bytes, (n - 1) / n, link.beta)
    return ((2 * layers + 1) * ar + ag) / 1e3


def _link(external: dict, n: int, other: Optional[Campaign]) -> tuple[Optional[Link], str]:
    """β from a measured all-reduce sweep on the N-GPU box, else the external box's link
    rate; (None, why) when neither is there."""
    sweep = other.latest("allreduce_sweep", lambda r: (r.param("hardware.world_size", int) or 0) >= 2
                         and bool(r.history("busbw_gbps"))) if other else None
    if sweep is not None:
        busbw = sweep.history("busbw_gbps")
        size = max(busbw)
        return Link(busbw[size], f"allreduce_sweep run {sweep.short}'s busbw at {size} B on "
                    f"{sweep.param('hardware.world_size')} ranks of "
                    f"{sweep.param('hardware.name', str, 'an unnamed box')}, campaign {other.id}",
                    "measured", external, n, [sweep]), ""
    hw = external.get("hardware")
    if not hw or not hw.get("link_gbps"):
        return None, ("no link rate for β: experiment.scale_out.external.hardware is null "
                      "and no allreduce_sweep on the N-GPU box")
    src = hw.get("link_gbps_source")
    return Link(float(hw["link_gbps"]), f"hardware {hw.get('name')}: "
                f"{nominal.describe('link_gbps', float(hw['link_gbps']), src)} per direction "
                f"over {hw.get('interconnect')}", nominal.kind(src), external, n, []), ""


def scale_out(c: Campaign, external: dict, other: Optional[Callable[[], Campaign]] = None,
              tpot: Optional[tuple[dict[int, float], str]] = None
              ) -> tuple[Optional[Section], dict[int, dict[str, float]]]:
    """The section (None when the campaign is not of one TP rank) and, per macro level, its
    metrics. `external`: experiment.scale_out.external as a dict ({ms, ops, op_bytes, source,
    seed, seed_tpot_ms, seed_tok_s, hardware}); `other`: loads the collectives campaign
    (ReportError when it has no runs), None when none is configured; `tpot`: engine_tpot of
    the macro run, built here unless the caller shares it."""
    macro = c.closed_loop_macro()
    n = macro.param("model.tp_rank_of", int) if macro else None
    if n is None:
        return None, {}
    sec = Section(f"TP {n} predicted from one TP-{n} rank on one device")
    model = model_of(macro)
    ops = 2 * model.num_hidden_layers + 2
    tpots, tpot_src = tpot or engine_tpot(macro)
    burst_campaign, not_found = None, ""
    if other is not None:
        try:
            burst_campaign = other()
        except ReportError as e:  # the rank's own figures still stand
            not_found = str(e)
    micro = Micro(burst_campaign, served=c) if burst_campaign else None
    measured = micro is not None and bool(micro.burst_runs)
    link, no_link = (None, "") if measured else _link(external, n, burst_campaign)
    if measured:
        hw = {r.params.get("hardware.name") for r in micro.burst_runs.values()}
        source = (f"measured: the step's {ops} collectives as one burst ({micro.burst_key}) in "
                  f"campaign {burst_campaign.id} on {', '.join(sorted(map(str, hw)))}")
        comm_at: Callable[[int], Optional[float]] = lambda k: micro.at("comm", k)
        runs = [macro, *micro.burst_runs.values()]
    elif link is not None:
        source = link.describe + f"; {ops - 1} all-reduces + the logits all-gather per step"
        comm_at = lambda k: modelled_ms(link, k, model.hidden_size, model.vocab_size,
                                        model.dtype_bytes, model.num_hidden_layers, n)
        runs = [macro, *link.runs]
    else:
        per_op = external["ms"] / external["ops"]
        source = (f"external, not measured by k25exp: {external['source']}; "
                  f"{per_op * 1e3:.1f} µs per op × {ops} ops")
        comm_at = lambda k: per_op * ops
        runs = [macro]
    if other is not None and not measured:
        why = not_found or (f"campaign {burst_campaign.id} has no run of the step's "
                            "collectives (nccl_burst, ops_per_step null)")
        beta = " (α; β from its allreduce_sweep)" if link is not None and link.runs else ""
        sec.notes.append(f"experiment.scale_out.collectives_campaign: {why}: the external "
                         f"figure is used{beta}")
    rows, per_level = [], {}
    seed_tpot = {int(k): v for k, v in (external.get("seed_tpot_ms") or {}).items()}
    seed_tok = {int(k): v for k, v in (external.get("seed_tok_s") or {}).items()}
    for k, rank_ms in sorted(tpots.items()):
        comm = comm_at(k)
        pred = rank_ms + comm if comm is not None else None
        lo_hi = seed_tpot.get(k)
        rows.append([k, rank_ms, k * model.hidden_size * model.dtype_bytes, comm, pred,
                     k / pred * 1e3 if pred else None,  # the seed's, where it has one ("" else)
                     "–".join(f"{x:g}" for x in lo_hi) if lo_hi else "", seed_tok.get(k, "")])
        if pred is not None:
            per_level[k] = {M.SCALEOUT_TPOT_PRED: pred, M.SCALEOUT_TOK_S_PRED: k / pred * 1e3,
                            M.SCALEOUT_COMM_PRED: comm}
    box = external.get("hardware") or {}
    sec.tables.append(Table(
        f"TPOT at TP {n}: the rank's ({tpot_src}) + the step's collectives",
        ["concurrency", "rank TPOT ms", "all-reduce B", "collectives ms", "predicted TPOT ms",
         "predicted tok/s", "seed TPOT ms (measured)", "seed tok/s (measured)"],
        rows, note=f"collectives: {source}" + _other_gpus(macro, box, measured, n)))
    c1 = per_level.get(1)
    sec.figures.append(Figure(M.SCALEOUT_TPOT_C1, c1[M.SCALEOUT_TPOT_PRED], runs, note=source)
                       if c1 else missing(M.SCALEOUT_TPOT_C1, "no macro level at concurrency 1"
                                          if 1 not in tpots else "no collectives figure at 1 token",
                                          runs))
    sec.figures += _needs_n_gpus(n, measured, macro)
    sec.notes += [f"assumed: {a}" for a in ASSUMPTIONS]
    if link is not None:
        sec.notes.append(f"assumed: {MODEL_ASSUMPTION}")
    elif not measured:
        if no_link:
            sec.notes.append(no_link)
        sec.notes.append("assumed: the external burst's time per op holds at every batch (its "
                         f"ops carried {external['op_bytes']} B, batch 1; a larger batch sends "
                         "c times that), and an all-gather costs what an all-reduce does")
    if external.get("seed"):
        sec.notes.append(f"for comparison, external (not measured here): {external['seed']}")
    sec.tags["report.scaleout_collectives"] = source[:4000]
    return sec, per_level


def _other_gpus(macro: RunView, box: dict, measured: bool, n: int) -> str:
    """The table note's word on the GPUs: the rank's, against the box the collectives are for."""
    rank_dev = macro.tags.get("device_found") or macro.params.get("hardware.device_name")
    box_dev = box.get("device_name")
    if not rank_dev:
        return f"; the rank's GPU is not recorded (hardware {macro.param('hardware.name')})"
    if measured or not box_dev:
        return f"; the rank ran on {rank_dev} (hardware {macro.param('hardware.name')})"
    if box_dev.lower() in rank_dev.lower() or rank_dev.lower() in box_dev.lower():
        return f"; the rank ran on the same GPUs ({rank_dev}) as the box the collectives are for"
    return (f"; other GPUs: the rank ran on {rank_dev} (hardware {macro.param('hardware.name')}), "
            f"not on the {box.get('world_size', n)} × {box_dev} of {box.get('name')} whose "
            f"collectives are priced here (and where the seed's figures were measured): its "
            f"compute time is {rank_dev}'s, so the prediction is {n} × that GPU with "
            f"{box.get('name')}'s collectives, not the seed's box")


def _needs_n_gpus(n: int, measured: bool, macro: RunView) -> list[Figure]:
    """What only N GPUs serving the whole model can give, missing with that reason."""
    why = (f"missing: needs two or more GPUs ({n} serving the whole model at TP {n}); this "
           f"campaign served one TP-{n} rank on one device (run {macro.short})")
    figs = [] if measured else [missing(M.SCALEOUT_BURST, f"{why}: the step's collectives "
                                        "burst (nccl_burst) on that box; set experiment.scale_out."
                                        "collectives_campaign to a campaign that ran it")]
    figs.append(missing(M.SCALEOUT_SPLIT, f"{why}: a profile of {n} ranks splits each "
                        "collective's time at the last rank's arrival into wait and transport; "
                        "one rank has no peer"))
    return figs
