"""TPOT at TP N predicted from one TP-N rank served on one device, plus the step's collectives.

A campaign of `model.tp_rank_of=N` serves, on one device, exactly the layers one of N
tensor-parallel ranks runs (k25exp.model.tp_rank). Its engine TPOT at concurrency c is that
rank's decode step without communication. At TP N every step also runs the collectives vLLM
issues at TP N: one all-reduce after the vocab-parallel embedding, two per layer, and the
logits all-gather (2 × num_hidden_layers + 2 ops). So, per macro level c:

    TPOT_N(c) predicted = rank TPOT(c) (server mean, the engine's clock) + collectives_N(c)

collectives_N(c), from the best source there is:
  * measured: the step burst (nccl_burst, ops_per_step null) of a campaign run on the N-GPU
    hardware (experiment.scale_out.collectives_campaign), at tokens = c (log-log between the
    measured token counts, never outside), the CUDA-graph replay when the rank was served
    with graphs and the burst has one;
  * else external: a burst someone else measured (experiment.scale_out.external; by default
    the seed campaign's 122 all-reduces of 14,336 B in 6.81 ms on 8 × RTX PRO 6000 PCIe),
    per op × the step's ops, the same at every c. Quoted as theirs, never as k25exp's.

The assumptions (every one a way the prediction can be off) are listed in the section.
"""

from __future__ import annotations

from typing import Callable, Optional

from k25exp.report import metrics as M
from k25exp.report.figures import Figure, Section, Table, missing
from k25exp.report.measured import model_of
from k25exp.report.reconcile import Micro, engine_tpot
from k25exp.report.sources import Campaign, ReportError

ASSUMPTIONS = (
    "every rank runs the step the measured rank ran (dummy weights: the router's random "
    "scores spread tokens evenly; a trained router's hot experts make some ranks slower)",
    "the collectives are on the step's critical path, none hidden behind compute (vLLM's TP "
    "all-reduces are: each layer's output needs the sum)",
    "the ranks stay in lockstep: no wait for a late rank beyond what the burst itself holds",
    "the rank's host work per step (scheduling, sampling, launch) is the same at TP N as at "
    "TP 1, where one process drives one GPU",
)


def scale_out(c: Campaign, external: dict, other: Optional[Callable[[], Campaign]] = None,
              tpot: Optional[tuple[dict[int, float], str]] = None
              ) -> tuple[Optional[Section], dict[int, dict[str, float]]]:
    """The section (None when the campaign is not of one TP rank) and, per macro level, its
    metrics. `external`: {ms, ops, op_bytes, source, seed} (experiment.scale_out.external);
    `other`: loads the collectives campaign (ReportError when it has no runs), None when none
    is configured; `tpot`: engine_tpot of the macro run, built here unless the caller shares it."""
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
    if micro is not None and micro.burst_runs:
        hw = {r.params.get("hardware.name") for r in micro.burst_runs.values()}
        source = (f"measured: the step's {ops} collectives as one burst ({micro.burst_key}) in "
                  f"campaign {burst_campaign.id} on {', '.join(sorted(map(str, hw)))}")
        comm_at: Callable[[int], Optional[float]] = lambda k: micro.at("comm", k)
        runs = [macro, *micro.burst_runs.values()]
    else:
        per_op = external["ms"] / external["ops"]
        source = (f"external, not measured by k25exp: {external['source']}; "
                  f"{per_op * 1e3:.1f} µs per op × {ops} ops")
        comm_at = lambda k: per_op * ops
        runs = [macro]
        if other is not None:
            why = not_found or (f"campaign {burst_campaign.id} has no run of the step's "
                                "collectives (nccl_burst, ops_per_step null)")
            sec.notes.append(f"experiment.scale_out.collectives_campaign: {why}: the external "
                             "figure is used")
    rows, per_level = [], {}
    for k, rank_ms in sorted(tpots.items()):
        comm = comm_at(k)
        pred = rank_ms + comm if comm is not None else None
        rows.append([k, rank_ms, comm, pred, k / pred * 1e3 if pred else None])
        if pred is not None:
            per_level[k] = {M.SCALEOUT_TPOT_PRED: pred, M.SCALEOUT_TOK_S_PRED: k / pred * 1e3}
    sec.tables.append(Table(
        f"TPOT at TP {n}: the rank's ({tpot_src}) + the step's collectives",
        ["concurrency", "rank TPOT ms", "collectives ms", "predicted TPOT ms", "predicted tok/s"],
        rows, note=f"collectives: {source}"))
    c1 = per_level.get(1)
    sec.figures.append(Figure(M.SCALEOUT_TPOT_C1, c1[M.SCALEOUT_TPOT_PRED], runs, note=source)
                       if c1 else missing(M.SCALEOUT_TPOT_C1, "no macro level at concurrency 1"
                                          if 1 not in tpots else "no collectives figure at 1 token",
                                          runs))
    sec.notes += [f"assumed: {a}" for a in ASSUMPTIONS]
    if micro is None or not micro.burst_runs:
        sec.notes.append("assumed: the external burst's time per op holds at every batch (its "
                         f"ops carried {external['op_bytes']} B, batch 1; a larger batch sends "
                         "c times that), and an all-gather costs what an all-reduce does")
    if external.get("seed"):
        sec.notes.append(f"for comparison, external (not measured here): {external['seed']}")
    sec.tags["report.scaleout_collectives"] = source[:4000]
    return sec, per_level
