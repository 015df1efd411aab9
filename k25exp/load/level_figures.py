"""Per-level figures from the per-request records, with the definitions they follow.

Per request (the client's clock, seconds after the request was sent):
    ttft     first streamed chunk that carries output tokens
    e2e      last chunk that carries output tokens (vLLM bench's E2EL)
    tpot     (e2e − ttft) / (output tokens − 1): vLLM's TPOT; output tokens from the
             server's `usage` (continuous_usage_stats gives each chunk's count too);
             requests with fewer than 2 output tokens have none
    itl      each gap between consecutive token-carrying chunks (vLLM's ITL; one chunk
             carrying several tokens, as with speculative decoding, makes one long gap)
    tokens_per_chunk  (output tokens − 1) / (token-carrying chunks − 1), over the level's
             requests: tokens per decode step as the client saw them (1 without speculative
             decoding, 1 + accepted with it, as long as the server streams each step as it
             happens: at batch 1 it does)
Per level (requests that failed count in `errors` only):
    output_tok_s   Σ output tokens / wall time of the level (first send → last response);
                   output_tok_s_ci_lo/_hi its 95 % interval by batch means over time windows
                   of the level (throughput_ci)
    request_s      successful requests / wall time
    client_lag_ms_p99   p99 of (actual − scheduled send time), the scheduled time of a
                   worker's next request being the end of its previous response; in an open
                   loop less the request's wait for a slot under the cap (max_concurrency, else
                   256): that wait is its queue_ms, in ttft_sched/e2e_sched, not here. Logged
                   with ≥ 100 sends only (client_lag_n says how many); client_lag_ms_max always
    client_loop_lag_ms_mean/p50/p99  how late the client's event loop woke a 10 ms sleeper
                   (p99 with ≥ 100 wake-ups only; client_loop_lag_n of them):
                   chunk arrival times are stamped that late. Its p99 also shows the client
                   being preempted (on a CPU box the server's threads share its cores). With
                   several client processes (experiment.client_processes), the laggiest one's
    client_cpu_util     client process CPU seconds / wall seconds (1.0 = one core); with
                   several processes, the busiest one's
    client_processes    processes that sent the level (logged when more than one)
    client_failures     client processes that failed during the level: their unfinished
                   requests are failed records (errors), and the level is invalid
    client_lagged  1 when the level measured the client, not the server, by the rule
                   experiment.validity.rule names (k25exp.load.validity): relative, sends late
                   by a fraction of the level's step (its ITL mean; an SLO probe's: the SLO's
                   tightest bound), more than a tail of them and at least two; absolute, the
                   send lag (its p99 with ≥ 100 sends, else its max) or client_loop_lag_ms_mean
                   above max_client_lag_ms; either, client_cpu_util above 0.9 (one event loop
                   near a full core)
    client_lag_limit_ms, client_late_sends, client_lag_ref_ms  what it was judged on: the lag
                   a send was held against, the sends that reached it, and (relative) the
                   step or bound that limit is a fraction of
    delivery_stalls, stalled_requests, delivery_stall_ms_max, delivery_stall_ms_total
                   tokens made on time but delivered late in a burst (k25exp.load.stalls)
    tpot_ms_mean_no_stalls, tpot_ms_p50_no_stalls, tpot_n_no_stalls  TPOT over the requests
                   no stall touched (tpot_ms_* count every request: what users saw)
    valid          1 unless the client lagged or failed, or a delivery stall was seen; invalid_reason()
                   names which
    tpot_gap_pct   (client mean TPOT − server mean TPOT) / server's, % (tpot_gap_pct())
    prefills_per_decode_step, prefill_tokens_per_decode_step  the other requests whose first
                   token (the end of their prefill) came while a request was decoding (after
                   its first token, before its last), and their prompt tokens, over that
                   request's decode steps (output tokens − 1), summed over the level's
                   requests: the prefill work a decode step of this level shared with it on
                   average (decode_prefills()). A closed loop of c requests in a steady state
                   approaches (c − 1) / output tokens; one that starts at once and ends in
                   waves shares fewer. Counted from the client's clock, not from latencies
    decode_only_tpot_ms, prefill_shared_us_per_token, prefill_fit_n  what those prefills
                   cost, measured without a profiler on the level's own server: the least
                   squares line of each request's TPOT (ms) on its shared prompt tokens per
                   decode step, weighted by its decode steps, over prefill_fit_n requests
                   (decode_prefills()). The intercept is the TPOT of a decode step that shares
                   no prefill; the slope, the marginal cost of one prompt token prefilled
                   inside a decode step (µs). The weighted means lie on the line, so
                   decode_only + slope × prefill_tokens_per_decode_step = the level's
                   token-weighted mean TPOT. No slope where no request shared a prefill (then
                   decode_only is that mean) or fewer than 3 requests decoded
    input_len_{mean,std,min,max}, output_len_{mean,std,min,max}  the lengths the level's
                   requests were built with (prompt_tokens_target, max_tokens: experiment.
                   input_len / output_len or the trace; k25exp.load.lengths.shape_figures)
    output_tokens_mismatch, prompt_tokens_mismatch  requests whose usage differs from the
                   lengths they were sent with
    send_lag_ms_{p50,p99,mean,n}  open loop and trace: each request's actual send less its
                   scheduled one (its lateness and its wait for a slot under the cap), ms
                   (send_lag_figures)
Percentiles are linear interpolation between order statistics (numpy's default).

Long because every per-level figure's definition sits beside its code, in one place.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from k25exp.config.experiments.validity import ValidityConfig
from k25exp.load import stalls, validity as lag_rule
from k25exp.load.lengths import shape_figures
from k25exp.stats import bootstrap_ci, mean, min_samples, percentile


def _pcts(prefix: str, xs: Sequence[float], qs: Sequence[int], scale: float = 1e3) -> dict:
    """prefix_p<q> for the percentiles the sample count supports (stats.min_samples), the
    mean, and prefix_n, the count every one of them is over."""
    if not xs:
        return {}
    out = {f"{prefix}_p{q}": percentile(xs, q) * scale for q in qs if len(xs) >= min_samples(q)}
    out[f"{prefix}_mean"] = mean(xs) * scale
    out[f"{prefix}_n"] = len(xs)
    return out


def _median_ci(prefix: str, xs: Sequence[float], scale: float = 1e3) -> dict:
    """Bootstrap 95 % interval of the median: prefix_p50_ci_lo / _hi."""
    if len(xs) < 2:
        return {}
    lo, hi = bootstrap_ci(xs)
    return {f"{prefix}_p50_ci_lo": lo * scale, f"{prefix}_p50_ci_hi": hi * scale}


def level_figures(records: Sequence[dict], wall_s: float, cpu_s: Optional[float] = None,
                  loop_lag_ms: Sequence[float] = (), max_client_lag_ms: float = float("inf"),
                  target_output: Optional[int] = None, target_input: Optional[int] = None,
                  stall_rule: stalls.StallRule = stalls.StallRule(),
                  step_ref_s: Optional[float] = None,
                  loop_lag_by_process: Optional[Sequence[Sequence[float]]] = None,
                  client_failures: Sequence[str] = (),
                  client_processes: Optional[int] = None,
                  spans: Sequence[tuple[float, float]] = (),
                  validity: Optional[ValidityConfig] = None,
                  lag_reference: Optional[tuple[float, str]] = None) -> dict:
    """The level's figures; annotates each record with its `stalls` (stalls.mark), measured
    against `step_ref_s` (the engine's TPOT) when given, else the level's median TPOT, or the
    decode-only TPOT where decode steps shared prefills and it is shorter (stall_reference).
    Several client processes (k25exp.load.shards): `cpu_s` is the busiest one's, the loop
    lag figures the laggiest one's (`loop_lag_by_process`, each process's samples), and
    `client_failures` names the processes that failed: any flags the level;
    `client_processes` how many sent it. `spans`: the
    level's wall time(s) (start, end; s from the records' t0; one per repeat), for the
    throughput interval. Client lag is judged by `validity`'s rule (None: the absolute one,
    with `max_client_lag_ms`; its default judges none), against `lag_reference` (ms, name)
    where given instead of the level's step (k25exp.load.validity)."""
    ok = [r for r in records if r["ok"]]
    shared = decode_prefills(ok)
    step = stalls.mark(records, stall_rule, stall_reference(records, step_ref_s, shared))
    m: dict[str, float] = {"requests": len(records), "completed": len(ok),
                           "errors": len(records) - len(ok),
                           "malformed_chunks": sum(r.get("malformed", 0) for r in records),
                           "wall_s": wall_s}
    ttft = [r["ttft_s"] for r in ok]
    tpot = [r["tpot_s"] for r in ok if r["tpot_s"] is not None]
    m.update(_pcts("ttft_ms", ttft, (50, 90, 99)))
    m.update(_pcts("tpot_ms", tpot, (50, 90, 99)))
    m.update(_median_ci("ttft_ms", ttft))
    m.update(_median_ci("tpot_ms", tpot))
    # from the scheduled send: what a user whose request was due then saw (client queueing in)
    m.update(_pcts("ttft_sched_ms", [r["ttft_sched_s"] for r in ok
                                     if r.get("ttft_sched_s") is not None], (50, 90, 99)))
    m.update(_pcts("e2e_sched_ms", [r["e2e_sched_s"] for r in ok
                                    if r.get("e2e_sched_s") is not None], (50, 90, 99)))
    m.update(stalls.figures(records))
    if step is not None:
        m["stall_ref_step_ms"] = step * 1e3
    clean = [r["tpot_s"] for r in ok if r["tpot_s"] is not None and not r["stalls"]]
    m["tpot_n_no_stalls"] = len(clean)
    if clean:
        m["tpot_ms_mean_no_stalls"] = mean(clean) * 1e3
        m["tpot_ms_p50_no_stalls"] = percentile(clean, 50) * 1e3
    itl = [b - a for r in ok for a, b in zip(r["chunk_s"], r["chunk_s"][1:])]
    m.update(_pcts("itl_ms", itl, (50, 99)))
    m.update(_pcts("e2e_ms", [r["e2e_s"] for r in ok], (50, 99)))
    multi = [r for r in ok if r["output_tokens"] and len(r["chunk_s"]) >= 2]
    if multi:
        m["tokens_per_chunk"] = (sum(r["output_tokens"] - 1 for r in multi)
                                 / sum(len(r["chunk_s"]) - 1 for r in multi))
    out_tokens = sum(r["output_tokens"] or 0 for r in ok)
    m["output_tokens"] = out_tokens
    m["output_tok_s"] = out_tokens / wall_s if wall_s > 0 else 0.0
    ci = throughput_ci(ok, spans)
    if ci is not None:
        m["output_tok_s_ci_lo"], m["output_tok_s_ci_hi"] = ci
    m["request_s"] = len(ok) / wall_s if wall_s > 0 else 0.0
    m.update(shared)
    m.update(shape_figures(records))
    # against each request's own lengths where it has them (a drawn shape, a trace)
    if target_output is not None:
        m["output_tokens_mismatch"] = sum(r["output_tokens"] != (r.get("max_tokens") or target_output)
                                          for r in ok)
    if target_input is not None:
        m["prompt_tokens_mismatch"] = sum(r["prompt_tokens"] is not None and r["prompt_tokens"]
                                          != (r.get("prompt_tokens_target") or target_input) for r in ok)
    lags = [r["lag_ms"] for r in records if r.get("lag_ms") is not None]
    if lags:  # a p99 only where 100 sends support one (stats.min_samples); the max always
        m["client_lag_ms_p50"] = percentile(lags, 50)
        if len(lags) >= min_samples(99):
            m["client_lag_ms_p99"] = percentile(lags, 99)
        m["client_lag_ms_max"] = max(lags)
        m["client_lag_n"] = len(lags)
    per_process = [x for x in (loop_lag_by_process or [loop_lag_ms]) if len(x)]
    if per_process:  # the laggiest process's: one slow event loop among healthy ones still lags
        m["client_loop_lag_ms_p50"] = max(percentile(x, 50) for x in per_process)
        p99s = [percentile(x, 99) for x in per_process if len(x) >= min_samples(99)]
        if p99s:
            m["client_loop_lag_ms_p99"] = max(p99s)
        m["client_loop_lag_ms_mean"] = max(mean(x) for x in per_process)
        m["client_loop_lag_n"] = float(sum(len(x) for x in per_process))
    if client_processes is not None:
        m["client_processes"] = float(client_processes)
    m["client_failures"] = float(len(client_failures))
    if cpu_s is not None and wall_s > 0:
        m["client_cpu_util"] = cpu_s / wall_s  # 1.0 = one core busy all the time
    m.update(lag_rule.judge(m, lags, validity, max_client_lag_ms, lag_reference))
    m["valid"] = float(not m["client_lagged"] and not m["delivery_stalls"]
                       and not m["client_failures"])
    return m


def stall_reference(records: Sequence[dict], step_ref_s: Optional[float],
                    shared: dict[str, float]) -> Optional[float]:
    """The decode step a level's stalls are judged against (s): the engine's mean TPOT
    (`step_ref_s`), else the level's median request TPOT; where its decode steps shared
    prefills, the decode-only TPOT (the intercept of decode_prefills' fit: a step sharing
    none) when that is shorter. Why: a burst is chunks closer than a tenth of a decode step,
    and where steps that carry a prompt's prefill chunk alternate with steps that carry none,
    the mean is not a step anyone decodes at. On an H100 at 32 k prompts and c = 16 the mean
    TPOT was 155 ms while steps without a prefill took ~5-10 ms: every request decoding
    between two prefills read as a burst, and four "stalls" up to 9.6 s voided the level."""
    step = step_ref_s or stalls.level_step_s(records)
    alone = shared.get("decode_only_tpot_ms")
    if step and alone and alone > 0 and shared.get("prefill_tokens_per_decode_step", 0) > 0:
        return min(step, alone / 1e3)
    return step


def decode_prefills(ok: Sequence[dict]) -> dict[str, float]:
    """prefills_per_decode_step and prefill_tokens_per_decode_step (module docstring); {} when
    no request decoded more than one token."""
    if any(r.get("sent_s") is None for r in ok):  # records without the client's send clock
        return {}
    firsts = sorted((r["sent_s"] + r["ttft_s"], r.get("prompt_tokens") or 0) for r in ok)
    times = [t for t, _ in firsts]
    cum = np.concatenate([[0], np.cumsum([n for _, n in firsts])])
    steps = prefills = tokens = 0
    fit: list[tuple[float, float, int]] = []  # per request: (shared tokens/step, TPOT ms, steps)
    for r in ok:
        n = r["output_tokens"] or 0
        if n < 2:
            continue
        # strictly inside (first token, last token): the request's own first token is not
        lo = int(np.searchsorted(times, r["sent_s"] + r["ttft_s"], side="right"))
        hi = int(np.searchsorted(times, r["sent_s"] + r["e2e_s"], side="left"))
        own = int(cum[hi] - cum[lo]) if hi > lo else 0
        if hi > lo:
            prefills += hi - lo
            tokens += own
        steps += n - 1
        fit.append((own / (n - 1), (r["e2e_s"] - r["ttft_s"]) / (n - 1) * 1e3, n - 1))
    if not steps:
        return {}
    return {"prefills_per_decode_step": prefills / steps,
            "prefill_tokens_per_decode_step": tokens / steps, **_prefill_cost(fit)}


def _prefill_cost(fit: list[tuple[float, float, int]]) -> dict[str, float]:
    """decode_only_tpot_ms, prefill_shared_us_per_token, prefill_fit_n (module docstring)
    from (shared tokens per step, TPOT ms, decode steps) per request."""
    if len(fit) < 3:
        return {}
    x, y, w = (np.array(v, dtype=float) for v in zip(*fit))
    xm, ym = np.average(x, weights=w), np.average(y, weights=w)
    sxx = float(np.sum(w * (x - xm) ** 2))
    out = {"prefill_fit_n": float(len(fit))}
    if sxx <= 0:  # no request shared a prefill (or all shared alike): no slope to fit
        return {**out, "decode_only_tpot_ms": float(ym)} if xm == 0 else {}
    slope = float(np.sum(w * (x - xm) * (y - ym))) / sxx
    return {**out, "decode_only_tpot_ms": float(ym - slope * xm),
            "prefill_shared_us_per_token": slope * 1e3}


WINDOWS = 10  # per span: batches of the throughput interval


def throughput_ci(ok: Sequence[dict], spans: Sequence[tuple[float, float]],
                  windows: int = WINDOWS, n_boot: int = 2000, seed: int = 0):
    """95 % interval of output_tok_s by batch means: each span (a repeat's wall time) cut into
    `windows` equal windows, each window's output tokens (a request's tokens placed at the
    arrival of the chunks that carried them) over its length, and the ratio Σ tokens / Σ time
    bootstrapped over the windows (fixed seed). What varies is when tokens arrived: a steady
    level has a narrow interval, a level that ramped, stalled or drained a long tail a wide
    one, and one whose every window got the same tokens none. Resampling requests instead
    gives zero width always: ignore_eos makes every request the same size, over a fixed wall
    time. Windows next to each other are correlated (a request spans several), so this is
    the narrow side of the truth. None without spans or with fewer than 2 requests."""
    spans = [(a, b) for a, b in spans if b > a]
    if len(ok) < 2 or not spans:
        return None
    tok = np.zeros(windows * len(spans))
    length = np.repeat([(b - a) / windows for a, b in spans], windows)
    for r in ok:
        cs, ct, out = r.get("chunk_s") or [], r.get("chunk_tokens") or [], r.get("output_tokens")
        if not cs or not out or r.get("sent_s") is None:
            continue
        scale = out / (sum(ct) or 1)  # the server's count (usage), spread over its chunks
        for t, n in zip(cs, ct):
            at = r["sent_s"] + t
            for j, (a, b) in enumerate(spans):
                if a <= at <= b:
                    k = min(int((at - a) / (b - a) * windows), windows - 1)
                    tok[j * windows + k] += n * scale
                    break
    idx = np.random.default_rng(seed).integers(0, len(tok), size=(n_boot, len(tok)))
    rates = tok[idx].sum(axis=1) / length[idx].sum(axis=1)
    lo, hi = np.percentile(rates, [2.5, 97.5])
    return float(lo), float(hi)


def invalid_reason(figs: dict) -> str:
    """Why a level is flagged invalid, in words ("" when it is valid); client lag with the
    rule that judged it and its numbers (the step's source, the limit) where the figures
    carry them (a level just measured; not one read back from MLflow)."""
    why = []
    if figs.get("client_failures"):
        why.append("client failed")
    if figs.get("client_lagged"):
        why.append(f"client lag ({figs['client_lag_rule']})" if figs.get("client_lag_rule")
                   else "client lag")
    if figs.get("rate_missed"):
        why.append("rate missed")
    if figs.get("delivery_stalls"):
        why.append("delivery stall")
    return " + ".join(why)


def describe_invalid(what: str, figs: dict) -> str:
    """One warning line for a level flagged invalid, with the figures behind each reason."""
    parts = []
    if figs.get("client_failures"):
        parts.append(f"{figs['client_failures']:.0f} client process(es) failed (their unfinished "
                     "requests are counted as errors; the level ran below its load)")
    if figs.get("client_lagged"):
        parts.append(f"the client lagged ({figs.get('client_lag_rule', 'rule unknown')}; send lag "
                     f"max {figs.get('client_lag_ms_max', 0):.1f} ms, loop lag mean "
                     f"{figs.get('client_loop_lag_ms_mean', 0):.1f} ms; CPU "
                     f"{100 * figs.get('client_cpu_util', 0):.0f} % of a core)")
    if figs.get("rate_missed"):
        parts.append(f"the client sent at {figs.get('achieved_rate_req_s', 0):.3f} req/s, "
                     f"{figs.get('rate_error_pct', 0):+.1f} % off the schedule's "
                     f"{figs.get('scheduled_rate_req_s', 0):.3f} req/s (target "
                     f"{figs.get('target_rate_req_s', 0):g})")
    if figs.get("delivery_stalls"):
        parts.append(f"{figs['delivery_stalls']:.0f} delivery stall(s) in "
                     f"{figs.get('stalled_requests', 0):.0f} request(s), longest "
                     f"{figs.get('delivery_stall_ms_max', 0):.0f} ms: tokens made on time reached "
                     "the client late, in a burst (TPOT without them: "
                     f"{figs.get('tpot_ms_mean_no_stalls', float('nan')):.2f} ms mean)")
    return f"{what} invalid: " + "; ".join(parts)


def tpot_gap_pct(figs: dict) -> Optional[float]:
    """(client's mean TPOT − server's mean TPOT) / server's, in %. Both follow the same
    definition, so the gap is delivery delay on top of the engine's: chunks held back by a busy
    API process, or a client that lagged. None without the server's figure."""
    client, server = figs.get("tpot_ms_mean"), figs.get("server_tpot_ms_mean")
    if client is None or not server:
        return None
    return (client - server) / server * 100


def saturation(levels: Sequence[int], tok_s: Sequence[float], gain: float) -> Optional[int]:
    """First level after which throughput grows by less than `gain` (a fraction) at the next
    level; None when it still grows by more at the last step of the sweep."""
    pts = sorted(zip(levels, tok_s))
    for (c, t), (_, t_next) in zip(pts, pts[1:]):
        if t_next < t * (1 + gain):
            return c
    return None


SLO_KEYS = {"ttft_ms": "ttft_sched_s", "tpot_ms": "tpot_s", "e2e_ms": "e2e_sched_s"}


def meets_slo(r: dict, slo: dict) -> bool:
    """Whether one request is good (goodput's docstring): it succeeded and meets every bound in
    `slo`. A request of fewer than 2 output tokens has no TPOT and meets any TPOT bound, as in
    vLLM's --goodput (it regards that TPOT as 0): with a length distribution or a trace that
    asks for 1-token answers, counting them as misses would charge the server for decode steps
    it never ran."""
    if not r["ok"]:
        return False
    for k, bound in slo.items():
        v = r.get(SLO_KEYS[k])
        if v is None and k == "tpot_ms" and (r.get("output_tokens") or 0) < 2:
            continue
        if v is None or v * 1e3 > bound:
            return False
    return True


def goodput(records: Sequence[dict], wall_s: float, slo: dict) -> dict:
    """vLLM's --goodput: a request is good when it succeeded and meets every SLO given
    (ttft_ms, tpot_ms, e2e_ms; TTFT and E2E counted from the scheduled send, as a user
    waits; meets_slo). goodput_req_s / goodput_tok_s over the level's wall time; good_fraction
    of all requests sent (failed ones included). Every request is judged on its own lengths:
    with a length distribution or a trace, a long prompt's TTFT and a long answer's E2E against
    the same bounds as a short one's. A multi-turn session's turn is a request like any other:
    its TTFT and E2E count from its own scheduled send (the end of the answer before it plus
    the think time), never from the session's start, so the user's think time is never in it
    (session_goodput: the sessions every turn of which was good)."""
    if not slo:
        return {}
    good = [r for r in records if meets_slo(r, slo)]
    return {"goodput_req_s": len(good) / wall_s if wall_s > 0 else 0.0,
            "goodput_tok_s": sum(r["output_tokens"] or 0 for r in good) / wall_s if wall_s > 0 else 0.0,
            "good_fraction": len(good) / len(records) if records else 0.0}


def session_goodput(records: Sequence[dict], turns: int, slo: dict) -> dict:
    """good_session_fraction: of the level's sessions, those whose `turns` turns were all sent
    and all good (meets_slo): a conversation a user had without one slow answer. A session cut
    short (a failed turn ends it) is not good. {} without an SLO or sessions."""
    by_session: dict[int, list[dict]] = {}
    for r in records:
        if r.get("session") is not None:
            by_session.setdefault(r["session"], []).append(r)
    if not slo or not by_session:
        return {}
    good = sum(1 for rs in by_session.values()
               if len(rs) == turns and all(meets_slo(r, slo) for r in rs))
    return {"good_session_fraction": good / len(by_session)}


def send_lag_figures(records: Sequence[dict]) -> dict:
    """send_lag_ms_p50/_p99/_mean/_n (p99 with 100 sends or more): each sent request's actual
    send time less its scheduled one, in ms. In an open loop or a trace replay that is how far
    the client kept the schedule: its own lateness (lag_ms) and any wait for a slot under the
    cap (queue_ms) together."""
    return _pcts("send_lag_ms", [r["sent_s"] - r["scheduled_s"] for r in records
                                 if r.get("sent_s") is not None and r.get("scheduled_s") is not None],
                 (50, 99))


def rate_figures(records: Sequence[dict], due_s: Sequence[float], target: float,
                 max_error: float) -> dict:
    """Open loop: the target rate, the rate the drawn schedule realises (a random schedule
    of n requests is ±1/√n off its mean), the rate the client actually sent at, and whether
    that is more than max_error (a fraction) off the schedule: then the level measured the
    client's pace, not the one asked for, and is flagged (`rate_missed`)."""
    from k25exp.load.arrivals import rate_of

    sched = rate_of(due_s)
    sent = rate_of([r["sent_s"] for r in records if r.get("sent_s") is not None])
    m = {"target_rate_req_s": target}
    if sched is not None:
        m["scheduled_rate_req_s"] = sched
    if sent is not None:
        m["achieved_rate_req_s"] = sent
    if sched and sent:
        m["rate_error_pct"] = (sent - sched) / sched * 100
    m["rate_missed"] = float(abs(m.get("rate_error_pct", 0.0)) > max_error * 100)
    return m
