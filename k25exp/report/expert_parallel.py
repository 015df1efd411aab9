"""Expert parallelism against the MoE AllReduce it replaces, per concurrency c on `world` ranks.

    tokens/GPU     ceil(c / world): each rank dispatches its share of the batch
    ep_ms          2 (dispatch + combine) × MoE layers × a2a_us(tokens/GPU), all_to_all sweep
    tp_ms          MoE layers × allreduce_us(c × hidden × dtype bytes), allreduce_sweep:
                   the AllReduce after each MoE layer that EP replaces
    both interpolated log-log between measured points, never extrapolated
    A campaign whose server ran on one rank (world size 1) and has neither sweep: every figure
    here is missing as one that needs two or more GPUs (k25exp.report.measured.needs_gpus)
"""

from __future__ import annotations

from k25exp.report import metrics as M
from k25exp.report.figures import Figure, Section, Table, missing
from k25exp.report.measured import interp_loglog, model_of, needs_gpus, one_rank
from k25exp.report.sources import Campaign


def expert_parallel(c: Campaign) -> Section:
    sec = Section("Expert parallelism: All-to-All instead of the MoE AllReduce")
    a2a = c.latest("all_to_all")
    ar = c.latest("allreduce_sweep")
    if not a2a or not ar:
        solo = one_rank(c)
        for run, phase, metric in ((a2a, "all_to_all", M.A2A_SWEEP),
                                  (ar, "allreduce_sweep", M.AR_SWEEP)):
            if not run:
                sec.figures.append(missing(metric, needs_gpus(f"an {phase} sweep across ranks", solo)
                                           if solo else c.why_missing(phase)))
        sec.figures.append(missing(M.EP_BREAK_EVEN, needs_gpus("the all_to_all and allreduce_sweep "
                                                               "sweeps", solo) if solo else
                                   "needs both sweeps"))
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
        sec.figures.append(missing(M.EP_BREAK_EVEN, "no concurrency inside both sweeps"))
    elif flip is None:
        sec.figures.append(missing(M.EP_BREAK_EVEN, f"none: EP {'pays' if pays[0] else 'does not pay'} "
                                   f"at every concurrency from {conc[0]} to {conc[-1]}", [a2a, ar]))
    else:
        what = "EP stops paying" if pays[flip - 1] else "EP starts paying"
        flips = [conc[i] for i in range(1, len(pays)) if pays[i] != pays[i - 1]]
        more = (f"; the sign flips {len(flips)} times (at {', '.join(map(str, flips))}): the "
                "two sweeps are noisier than the difference, see the table") if len(flips) > 1 else ""
        sec.figures.append(Figure(M.EP_BREAK_EVEN, conc[flip], [a2a, ar],
                                  f"{what} at concurrency {conc[flip]} (between {conc[flip - 1]} "
                                  f"and {conc[flip]}){more}"))
    knee = a2a.metrics.get("knee_tokens_per_gpu")
    sec.figures.append(Figure(M.A2A_KNEE, knee, [a2a]) if knee is not None else
                       missing(M.A2A_KNEE, a2a.tags.get("knee") or "none within the sweep", [a2a]))
    sec.plot = {"kind": "ep", "x": [r[0] for r in table.rows], "ep": [r[3] for r in table.rows],
                "tp": [r[6] for r in table.rows]}
    return sec
