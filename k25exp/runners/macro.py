"""macro: single-stream TPOT and throughput vs concurrency against a live vLLM server.

Phases, all with prompts of exactly `input_tokens` tokens (the served tokenizer's count),
`output_tokens` generated with ignore_eos, greedy, a fixed seed:
  1. warm-up: `warmup` requests one at a time, recorded as phase "warmup", never in figures;
  2. single stream: `single_stream_requests` one at a time → single_stream_* figures
     (single_stream_valid = 0 when the client lagged, as for a level);
  3. sweep: for each concurrency C a closed loop of C workers → figures at step C.
With experiment.reset_prefix_cache (a dev endpoint: loopback servers only, unless opted in),
the prefix cache is reset before phase 2 and before every level, so no level reuses another's
prompts' KV; the tag `prefix_cache` says what actually happened. Each phase is flagged invalid when the client lagged or when
tokens reached it late in a burst (a delivery stall, k25exp.serving.stalls); its figures are
logged all the same, with the TPOT of the requests no stall touched beside them. Figure definitions: k25exp.serving.figures and .server_metrics.

Artifacts: requests.jsonl (one line per request, every phase), results.txt/.csv (one row per
level), plots/, server.log (the server's log over this job). A server that dies ends the job
with its log tail, after logging the levels already measured.
"""

from __future__ import annotations

import asyncio
import gc
import math
import logging
import signal
import time
from pathlib import Path
from typing import Optional

import httpx
import orjson

from k25exp.config.schema import K25Config, MacroConfig
from k25exp.serving import admin, repeats
from k25exp.serving.arrivals import schedule
from k25exp.serving.client import CompletionClient, run_level, run_open_level
from k25exp.serving.figures import (describe_invalid, goodput, invalid_reason, level_figures,
                                    rate_figures, tpot_gap_pct)
from k25exp.stats import suppressed
from k25exp.serving.stalls import StallRule
from k25exp.serving.progress import Progress
from k25exp.serving.prompts import PromptBuilder, load_tokenizer
from k25exp.serving.endpoint import Connection, connect
from k25exp.serving.errors import ServerDied, ServerError
from k25exp.serving.registry import release
from k25exp.runners.macro_results import ROW_KEYS, finish
from k25exp.runners.server_run import copy_server_log, record_server
from k25exp.tracking.recorder import Recorder

log = logging.getLogger(__name__)

WARMUP_PROMPTS = 1_000_000  # warm-up prompts are indices from here: never a measured prompt

LEVEL_METRICS = {  # logged at step = concurrency
    "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99", "ttft_ms_mean", "tpot_ms_p50", "tpot_ms_p90",
    "tpot_ms_p99", "tpot_ms_mean", "itl_ms_p50", "itl_ms_p99", "itl_ms_mean", "e2e_ms_p50",
    "e2e_ms_p99", "e2e_ms_mean", "output_tok_s", "request_s", "errors", "requests", "completed",
    "malformed_chunks", "output_tokens_mismatch", "prompt_tokens_mismatch", "client_lag_ms_p50",
    "client_lag_ms_p99", "client_lag_ms_max", "client_loop_lag_ms_p99", "client_loop_lag_ms_p50",
    "client_loop_lag_ms_mean", "client_cpu_util", "client_lagged",
    "delivery_stalls", "stalled_requests", "delivery_stall_ms_max", "delivery_stall_ms_total",
    "stall_ref_step_ms", "tpot_ms_mean_no_stalls", "tpot_ms_p50_no_stalls", "tpot_n_no_stalls",
    "valid", "wall_s", "server_tpot_ms_mean", "server_ttft_ms_mean", "server_itl_ms_mean",
    "server_e2e_ms_mean", "server_requests", "tpot_gap_pct",
    # speculative decoding, when the server runs it (server_metrics.spec_figures)
    "spec_drafts", "spec_draft_tokens", "spec_accepted_tokens", "acceptance_rate",
    "mean_accepted_tokens", "mean_acceptance_length", "tokens_per_chunk",
}


LEVEL_METRICS |= {  # open loop, goodput, the user's view from the scheduled send
    "target_rate_req_s", "scheduled_rate_req_s", "achieved_rate_req_s", "rate_error_pct",
    "rate_missed", "goodput_req_s", "goodput_tok_s", "good_fraction", "client_lag_n",
    "output_tok_s_ci_lo", "output_tok_s_ci_hi", "prefix_cache_queries", "prefix_cache_hits",
    "prefix_cache_hit_rate", "repeats"}


def _level_metric(key: str) -> bool:
    return (key in LEVEL_METRICS or "_rep_" in key
            or key.startswith(("acceptance_pos", "ttft_sched_ms", "e2e_sched_ms"))
            or (key.endswith(("_n", "_p50_ci_lo", "_p50_ci_hi")) and key.startswith(
                ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"))))


def requests_for(exp: MacroConfig, c: float) -> int:
    """Requests at a level: experiment.requests, else `rounds` rounds of the closed loop's
    workers, or `rounds` seconds of the open loop's arrivals; at least min_requests."""
    if exp.requests is not None:
        return exp.requests
    return max(exp.min_requests, math.ceil(exp.rounds * c))


def sweep_levels(exp: MacroConfig) -> list:
    """The sweep's levels: concurrencies (closed loop) or request rates (open loop)."""
    levels = exp.request_rate if exp.load == "open" else exp.concurrency
    return list(levels[:exp.limit_points])


def step_of(exp: MacroConfig, level: float) -> int:
    """The MLflow step a level's figures go to: its concurrency, or its rate × 1000."""
    return int(round(level * 1000)) if exp.load == "open" else int(level)


def run(cfg: K25Config, out: Path, rec: Recorder) -> dict[str, float]:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    t = time.perf_counter()
    generated: list[Path] = []
    try:
        conn = connect(cfg.server, cfg.model, cfg.seed, cfg.hardware.device,
                       on_generate=generated.append, redact=cfg.tracking.redact)
    except ServerError as e:
        rec.log_metrics({"server_starts": 0})
        log_path = getattr(e, "log_path", None)
        if log_path and Path(log_path).exists():  # a start that failed: keep its whole log
            out.mkdir(parents=True, exist_ok=True)
            (out / "server.log").write_bytes(Path(log_path).read_bytes())
        raise
    if generated:
        rec.log_metrics({"model_generate_s": time.perf_counter() - t})
    record_server(cfg, conn, rec)
    try:
        return asyncio.run(_measure(cfg, conn, out, rec))
    except ServerDied:
        if conn.managed:
            release(conn.managed)  # stop what's left of it; the next job starts afresh
        raise
    finally:
        gc.unfreeze()
        copy_server_log(conn, out)


async def _measure(cfg: K25Config, conn: Connection, out: Path, rec: Recorder) -> dict[str, float]:
    exp: MacroConfig = cfg.experiment
    tok_path = cfg.server.tokenizer or conn.info.get("model_path")
    if not tok_path:
        raise ServerError("no tokenizer: set server.tokenizer (folder or hub id of the served model's)")
    tok = load_tokenizer(tok_path, cfg.server.trust_remote_code)
    prompt = PromptBuilder(tok, exp.input_tokens, exp.seed, exp.prefix_tokens, exp.prefix_groups)
    # Every prompt built before anything is timed: tokenizing between requests is client lag.
    if exp.duration_s is None:
        prompt.many(range(max([exp.single_stream_requests] +
                              [requests_for(exp, c) * exp.repeats for c in sweep_levels(exp)])))
        prompt.many(range(WARMUP_PROMPTS, WARMUP_PROMPTS + exp.warmup))
    gc.collect()
    gc.freeze()  # what exists now is never scanned again: collections between levels are cheap
    rec.set_tags({"macro.tokenizer": str(tok_path), "macro.client": f"httpx {httpx.__version__}, "
                  "one asyncio process, closed loop", "macro.tpot_definition":
                  "(e2e - ttft) / (output_tokens - 1), vLLM's; itl = gaps between token chunks",
                  "macro.load": _load_tag(exp)})
    out.mkdir(parents=True, exist_ok=True)
    # Closed on every path (an unexpected error included): what was measured stays readable.
    with open(out / "requests.jsonl", "wb") as jsonl:
        t0 = time.perf_counter()
        summary: dict[str, float] = {}
        rows, measured = [], []
        cache: dict = {}
        killed = {"done": False}
        rule = StallRule(exp.stall_burst_frac, exp.stall_min_chunks, exp.stall_min_gap_ms)

        async with CompletionClient(conn.base_url, conn.model, conn.api_key, exp.request_timeout_s,
                                    max_connections=_max_in_flight(exp) + 4,
                                    continuous_usage=exp.continuous_usage,
                                    temperature=exp.temperature, seed=exp.seed) as client:
            http = client.http

            def dead() -> bool:
                return not conn.alive()

            async def phase(name: str, level: float, c: int, n: Optional[int], duration: Optional[float],
                            first_prompt: int, progress: Progress, rate: Optional[float] = None) -> dict:
                """Runs one phase (closed loop of c workers, or open loop at `rate`); returns its
                raw result (figures() turns it into figures)."""
                errors = done = 0
                task = progress.task(f"{name} " + (f"{rate:g}/s" if rate else f"c={c}"), n)
                f = exp.fault
                kill_here = name == "sweep" and f.kill_server_at_level == level and conn.managed

                def on_record(r: dict) -> None:
                    nonlocal errors, done
                    errors += not r["ok"]
                    done += 1
                    progress.update(task, r, errors)
                    if kill_here and not killed["done"] and done >= f.after_requests:
                        killed["done"] = True  # the fault hook: a crash, as SIGKILL of every process
                        log.warning("fault: killing the server at concurrency %d", level)
                        conn.managed.kill(signal.SIGKILL)

                # No garbage collection while a level runs: a full pass over the half million
                # objects transformers leaves behind stalls the event loop for 0.2-1 s (seen as
                # client lag); reference counting frees the level's garbage, the rest goes after.
                gc.disable()
                try:
                    if rate is not None:
                        due = schedule(rate, exp.burstiness, exp.seed + int(level * 1000), n, duration,
                                       exact=exp.exact_rate and n is not None)
                        res = await run_open_level(client, lambda i: prompt(first_prompt + i),
                                                   phase=name, level=level, due_s=due,
                                                   max_tokens=exp.output_tokens, t0=t0,
                                                   max_concurrency=exp.max_concurrency,
                                                   input_tokens=exp.input_tokens,
                                                   on_record=on_record, should_stop=dead)
                        res["rate"] = rate
                    else:
                        res = await run_level(client, lambda i: prompt(first_prompt + i), phase=name,
                                              level=level, concurrency=c, max_tokens=exp.output_tokens,
                                              t0=t0, n_requests=n, duration_s=duration,
                                              input_tokens=exp.input_tokens, on_record=on_record,
                                              should_stop=dead,
                                              ramp_s=exp.ramp_s if name == "sweep" else 0.0)
                finally:
                    gc.enable()
                gc.collect()
                return res

            def write(res: dict) -> None:
                # Written once the level is over: no disk I/O in the event loop while it measures
                # (a write stalled by other processes' writeback would show up as client lag).
                if not res.get("written"):
                    jsonl.write(b"".join(orjson.dumps(r) + b"\n" for r in res["records"]))
                    jsonl.flush()
                    res["written"] = True

            def figures(res: dict, srv: dict) -> dict:
                """The phase's figures with the server's view merged; marks each record's delivery
                stalls against the engine's own TPOT when the server gave one (delivery cannot
                compress it, unlike the client's, which collapses when every chunk came in a burst),
                else against the level's median request TPOT; then writes the records."""
                step = srv.get("server_tpot_ms_mean")
                figs = level_figures(res["records"], res["wall_s"], res["cpu_s"], res["loop_lag_ms"],
                                     exp.max_client_lag_ms, exp.output_tokens, exp.input_tokens,
                                     rule, step_ref_s=step / 1e3 if step else None)
                _merge_server(figs, srv)
                if res.get("rate") is not None:
                    # each repeat against its own schedule; the level keeps the worst one's
                    rf = [rate_figures(x["records"], x["due_s"], x["rate"], exp.max_rate_error)
                          for x in res.get("repeats", [res])]
                    figs.update(max(rf, key=lambda f: (f["rate_missed"], abs(f.get("rate_error_pct") or 0))))
                    figs["valid"] = float(figs["valid"] and not figs["rate_missed"])
                figs.update(goodput(res["records"], res["wall_s"], exp.slo.bounds()))
                write(res)
                return figs

            def completed(res: dict) -> int:
                return sum(1 for r in res["records"] if r["ok"])

            with Progress(exp.progress) as progress:
                if exp.warmup:
                    write(await phase("warmup", 1, 1, exp.warmup, None, WARMUP_PROMPTS, progress))
                    _check_alive(conn, "warm-up")
                if exp.single_stream_requests:
                    if exp.reset_prefix_cache:
                        await admin.reset_prefix_cache(http, cache)
                    before = await admin.scrape(http, conn.model)
                    res = await phase("single", 1, 1, exp.single_stream_requests, None, 0, progress)
                    if not conn.alive():
                        write(res)
                    _check_alive(conn, "the single-stream phase")
                    srv, src = await admin.server_view(http, conn.model, before, completed(res))
                    figs = figures(res, srv)
                    single = {"single_stream_tpot_ms": figs.get("tpot_ms_p50"),
                              "single_stream_tpot_ms_mean": figs.get("tpot_ms_mean"),
                              "single_stream_tpot_ms_n": figs.get("tpot_ms_n"),
                              "single_stream_tpot_ms_ci_lo": figs.get("tpot_ms_p50_ci_lo"),
                              "single_stream_tpot_ms_ci_hi": figs.get("tpot_ms_p50_ci_hi"),
                              "single_stream_ttft_ms": figs.get("ttft_ms_p50"),
                              "single_stream_itl_ms_p50": figs.get("itl_ms_p50"),
                              "single_stream_e2e_ms": figs.get("e2e_ms_p50"),
                              "single_stream_output_tok_s": figs.get("output_tok_s"),
                              "single_stream_errors": figs["errors"],
                              "single_stream_tokens_per_chunk": figs.get("tokens_per_chunk"),
                              "single_stream_server_tpot_ms_mean": figs.get("server_tpot_ms_mean"),
                              "single_stream_server_ttft_ms_mean": figs.get("server_ttft_ms_mean"),
                              "single_stream_client_lag_ms_p99": figs.get("client_lag_ms_p99"),
                              "single_stream_client_loop_lag_ms_mean": figs.get("client_loop_lag_ms_mean"),
                              "single_stream_client_loop_lag_ms_p99": figs.get("client_loop_lag_ms_p99"),
                              "single_stream_tpot_gap_pct": figs.get("tpot_gap_pct"),
                              "single_stream_client_lagged": figs["client_lagged"],
                              "single_stream_delivery_stalls": figs["delivery_stalls"],
                              "single_stream_delivery_stall_ms_max": figs["delivery_stall_ms_max"],
                              "single_stream_tpot_ms_no_stalls": figs.get("tpot_ms_p50_no_stalls"),
                              "single_stream_valid": figs["valid"]}
                    single = {k: v for k, v in single.items() if v is not None}
                    single.update({f"single_stream_{k}": v for k, v in srv.items()
                                   if k.startswith(("spec_", "accept", "mean_accept"))})
                    if not figs["valid"]:
                        log.warning(describe_invalid("the single-stream phase", figs,
                                                     exp.max_client_lag_ms))
                    rec.log_metrics(single)
                    summary.update(single)
                    if src:
                        rec.set_tags({f"server_metrics.{k}": v for k, v in src.items()})

                for c in sweep_levels(exp):
                    if exp.reset_prefix_cache:
                        await admin.reset_prefix_cache(http, cache)
                    before = await admin.scrape(http, conn.model)
                    n = None if exp.duration_s else requests_for(exp, c)
                    rate = c if exp.load == "open" else None
                    reps = []
                    for r in range(exp.repeats):
                        if r and exp.reset_prefix_cache:
                            await admin.reset_prefix_cache(http, cache)
                        rep = await phase("sweep", c, 0 if rate else c, n, exp.duration_s,
                                          r * (n or 0), progress, rate=rate)
                        for x in rep["records"]:
                            x["repeat"], x["prompt_index"] = r, r * (n or 0) + x["i"]
                        reps.append(rep)
                        if not conn.alive():
                            break
                    res = repeats.pool(reps)
                    lvl = f"rate {c:g}/s" if rate else f"concurrency={c}"
                    if completed(res) < len(res["records"]) and conn.managed is not None:
                        await admin.settle(http, conn)  # a dying server closes sockets before it exits
                    if not conn.alive() or (completed(res) == 0 and conn.managed is None):
                        figs = figures(res, {})
                    if not conn.alive():
                        rec.log_metrics({"errors": figs["errors"], "completed": figs["completed"]},
                                        step=step_of(exp, c))
                        finish(out, exp, rows, measured, summary, rec, jsonl)
                        raise ServerDied(
                            f"vLLM died during level {lvl} ({figs['completed']} of "
                            f"{figs['requests']} requests completed; {len(measured)} level(s) measured "
                            f"before it); last lines of its log:\n{conn.log_tail()}")
                    if completed(res) == 0 and conn.managed is None:
                        try:
                            await http.get("/health", timeout=5.0)
                        except httpx.HTTPError as e:
                            finish(out, exp, rows, measured, summary, rec, jsonl)
                            raise ServerError(f"endpoint {conn.base_url} stopped answering during "
                                              f"level {lvl}: {type(e).__name__}: {e}") from None
                    srv, _ = await admin.server_view(http, conn.model, before, completed(res))
                    figs = figures(res, srv)
                    if len(reps) > 1:
                        figs.update(repeats.spread([level_figures(
                            x["records"], x["wall_s"], x["cpu_s"], x["loop_lag_ms"],
                            exp.max_client_lag_ms, exp.output_tokens, exp.input_tokens, rule)
                            for x in reps]))
                    if not figs["valid"]:
                        log.warning(describe_invalid(f"level rate {c:g}/s" if rate else f"level c={c}",
                                                     figs, exp.max_client_lag_ms))
                    rec.log_metrics({k: v for k, v in figs.items() if _level_metric(k)},
                                    step=step_of(exp, c))
                    measured.append((c, figs))
                    rows.append([c] + [figs.get(k, suppressed(figs, k)) for k in ROW_KEYS]
                                + [invalid_reason(figs) or None])

    rec.set_tags({"prefix_cache": _prefix_cache_tag(exp, cache)})
    finish(out, exp, rows, measured, summary, rec, jsonl)
    return summary


def _load_tag(exp: MacroConfig) -> str:
    if exp.load == "open":
        cap = f", at most {exp.max_concurrency} in flight" if exp.max_concurrency else ""
        return (f"open loop: gamma arrivals (burstiness {exp.burstiness:g}; 1 = Poisson) at "
                f"{exp.request_rate} req/s{cap}; latencies also from the scheduled send; "
                "step = rate x 1000")
    ramp = f", workers started over {exp.ramp_s:g} s" if exp.ramp_s else ", all workers at once"
    return f"closed loop: {exp.concurrency} workers{ramp}; step = concurrency"


def _max_in_flight(exp: MacroConfig) -> int:
    if exp.load == "open":
        return exp.max_concurrency or 256
    return max(exp.concurrency)


def _prefix_cache_tag(exp: MacroConfig, cache: dict) -> str:
    if not exp.reset_prefix_cache:
        return "not reset (experiment.reset_prefix_cache=false)"
    if cache.get("reset") is False:
        return f"NOT reset between levels: {cache.get('why')}"
    return "reset before every level"


def _merge_server(figs: dict, srv: dict) -> None:
    """The server's view of a phase into its figures, with the client-vs-server TPOT gap."""
    figs.update(srv)
    gap = tpot_gap_pct(figs)
    if gap is not None:
        figs["tpot_gap_pct"] = gap


def _check_alive(conn: Connection, what: str) -> None:
    if not conn.alive():
        raise ServerDied(f"vLLM died during {what}; last lines of its log:\n{conn.log_tail()}")


