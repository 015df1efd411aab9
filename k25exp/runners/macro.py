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
import logging
import signal
import time
from pathlib import Path
from typing import Optional

import httpx
import orjson

from k25exp.config.schema import K25Config, MacroConfig
from k25exp.serving import admin
from k25exp.serving.client import CompletionClient, run_level
from k25exp.serving.figures import describe_invalid, invalid_reason, level_figures, tpot_gap_pct
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


def _level_metric(key: str) -> bool:
    return key in LEVEL_METRICS or key.startswith("acceptance_pos")


def requests_for(exp: MacroConfig, c: int) -> int:
    if exp.requests is not None:
        return exp.requests
    return max(exp.min_requests, exp.rounds * c)


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
    prompt = PromptBuilder(tok, exp.input_tokens, exp.seed)
    # Every prompt built before anything is timed: tokenizing between requests is client lag.
    if exp.duration_s is None:
        prompt.many(range(max([exp.single_stream_requests] +
                              [requests_for(exp, c) for c in exp.concurrency])))
        prompt.many(range(WARMUP_PROMPTS, WARMUP_PROMPTS + exp.warmup))
    gc.collect()
    gc.freeze()  # what exists now is never scanned again: collections between levels are cheap
    rec.set_tags({"macro.tokenizer": str(tok_path), "macro.client": f"httpx {httpx.__version__}, "
                  "one asyncio process, closed loop", "macro.tpot_definition":
                  "(e2e - ttft) / (output_tokens - 1), vLLM's; itl = gaps between token chunks"})
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
                                    max_connections=max(exp.concurrency) + 4,
                                    continuous_usage=exp.continuous_usage,
                                    temperature=exp.temperature, seed=exp.seed) as client:
            http = client.http

            def dead() -> bool:
                return not conn.alive()

            async def phase(name: str, level: int, c: int, n: Optional[int], duration: Optional[float],
                            first_prompt: int, progress: Progress) -> dict:
                """Runs one phase; returns its raw result (figures() turns it into figures)."""
                errors = done = 0
                task = progress.task(f"{name} c={c}", n)
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
                    res = await run_level(client, lambda i: prompt(first_prompt + i), phase=name,
                                          level=level, concurrency=c, max_tokens=exp.output_tokens,
                                          t0=t0, n_requests=n, duration_s=duration,
                                          input_tokens=exp.input_tokens, on_record=on_record,
                                          should_stop=dead)
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

                for c in exp.concurrency[:exp.limit_points]:
                    if exp.reset_prefix_cache:
                        await admin.reset_prefix_cache(http, cache)
                    before = await admin.scrape(http, conn.model)
                    n = None if exp.duration_s else requests_for(exp, c)
                    res = await phase("sweep", c, c, n, exp.duration_s, 0, progress)
                    if completed(res) < len(res["records"]) and conn.managed is not None:
                        await admin.settle(http, conn)  # a dying server closes sockets before it exits
                    if not conn.alive() or (completed(res) == 0 and conn.managed is None):
                        figs = figures(res, {})
                    if not conn.alive():
                        rec.log_metrics({"errors": figs["errors"], "completed": figs["completed"]}, step=c)
                        finish(out, exp, rows, measured, summary, rec, jsonl)
                        raise ServerDied(
                            f"vLLM died during level concurrency={c} ({figs['completed']} of "
                            f"{figs['requests']} requests completed; {len(measured)} level(s) measured "
                            f"before it); last lines of its log:\n{conn.log_tail()}")
                    if completed(res) == 0 and conn.managed is None:
                        try:
                            await http.get("/health", timeout=5.0)
                        except httpx.HTTPError as e:
                            finish(out, exp, rows, measured, summary, rec, jsonl)
                            raise ServerError(f"endpoint {conn.base_url} stopped answering during "
                                              f"level concurrency={c}: {type(e).__name__}: {e}") from None
                    srv, _ = await admin.server_view(http, conn.model, before, completed(res))
                    figs = figures(res, srv)
                    if not figs["valid"]:
                        log.warning(describe_invalid(f"level c={c}", figs, exp.max_client_lag_ms))
                    rec.log_metrics({k: v for k, v in figs.items() if _level_metric(k)}, step=c)
                    measured.append((c, figs))
                    rows.append([c] + [figs.get(k) for k in ROW_KEYS] + [invalid_reason(figs) or None])

    rec.set_tags({"prefix_cache": _prefix_cache_tag(exp, cache)})
    finish(out, exp, rows, measured, summary, rec, jsonl)
    return summary


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


