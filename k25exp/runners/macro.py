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

from k25exp import plots, tables
from k25exp.config.schema import K25Config, MacroConfig
from k25exp.poll import PollTimeout, await_until
from k25exp.serving import server_metrics
from k25exp.serving.answers import json_body, refuse_html, what_came_back
from k25exp.serving.client import CompletionClient, run_level
from k25exp.serving.figures import (describe_invalid, invalid_reason, level_figures, saturation,
                                    tpot_gap_pct)
from k25exp.serving.stalls import StallRule
from k25exp.serving.prompts import PromptBuilder, load_tokenizer
from k25exp.serving.endpoint import Connection, connect
from k25exp.serving.errors import BadAnswer, ServerDied, ServerError
from k25exp.serving.registry import release
from k25exp.runners.server_run import copy_server_log, record_server
from k25exp.tracking.recorder import Recorder

log = logging.getLogger(__name__)

WARMUP_PROMPTS = 1_000_000  # warm-up prompts are indices from here: never a measured prompt

COLUMNS = [
    tables.Column("conc", "{}", 6), tables.Column("reqs", "{}", 6), tables.Column("err", "{}", 5),
    tables.Column("tok/s", "{:.1f}", 10), tables.Column("req/s", "{:.2f}", 8),
    tables.Column("ttft_p50", "{:.1f}", 10), tables.Column("ttft_p99", "{:.1f}", 10),
    tables.Column("tpot_p50", "{:.2f}", 10), tables.Column("tpot_p99", "{:.2f}", 10),
    tables.Column("srv_tpot", "{:.2f}", 10), tables.Column("itl_p50", "{:.2f}", 9),
    tables.Column("itl_p99", "{:.2f}", 9), tables.Column("e2e_p50", "{:.0f}", 9),
    tables.Column("lag_p99", "{:.2f}", 9), tables.Column("loop", "{:.2f}", 7),
    tables.Column("cpu", "{:.2f}", 6), tables.Column("stalls", "{:.0f}", 7),
    tables.Column("stall_max", "{:.0f}", 10), tables.Column("tpot_nostall", "{:.2f}", 13),
    tables.Column("valid", "{:.0f}", 6), tables.Column("why", "{}", 29),
]
ROW_KEYS = ["requests", "errors", "output_tok_s", "request_s", "ttft_ms_p50", "ttft_ms_p99",
            "tpot_ms_p50", "tpot_ms_p99", "server_tpot_ms_mean", "itl_ms_p50", "itl_ms_p99",
            "e2e_ms_p50", "client_lag_ms_p99", "client_loop_lag_ms_mean", "client_cpu_util",
            "delivery_stalls", "delivery_stall_ms_max", "tpot_ms_mean_no_stalls", "valid"]
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


class _NotReset(Exception):
    pass


async def _reset_prefix_cache(http: httpx.AsyncClient, state: dict) -> None:
    """POST /reset_prefix_cache, retried while vLLM answers success=false (blocks still held);
    `state` keeps whether it worked and why not (a server without dev mode: no more tries)."""
    if state.get("reset") is False:
        return

    async def reset() -> bool:
        r = await http.post("/reset_prefix_cache")
        if r.status_code != 200:
            raise _NotReset(f"HTTP {r.status_code} (vLLM needs VLLM_SERVER_DEV_MODE=1)")
        refuse_html(r, "vLLM's JSON {'success': bool}")
        if not r.content.strip():
            return True  # older vLLM: an empty 200
        body = json_body(r, "vLLM's JSON {'success': bool}")
        return not isinstance(body, dict) or bool(body.get("success", True))

    try:
        state["reset"] = await await_until(reset, None, 0.2, "POST /reset_prefix_cache",
                                           attempts=10)
    except httpx.HTTPError as e:
        state.update(reset=False, why=f"{type(e).__name__}: {e}")
    except _NotReset as e:
        state.update(reset=False, why=str(e))
    except PollTimeout:
        state.update(reset=False, why="the server kept answering success=false")


async def _scrape(http: httpx.AsyncClient, model: str) -> Optional[dict]:
    try:
        r = await http.get("/metrics")
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    refuse_html(r, "Prometheus text")
    try:
        return server_metrics.parse(r.text, model)
    except ValueError as e:
        raise BadAnswer(f"GET {r.request.url}: expected Prometheus text ({e}), got "
                        f"{what_came_back(r)}") from None


async def _server_view(http, model, before, completed) -> tuple[dict, dict]:
    """Scrapes /metrics until the level's requests are all counted (they are recorded as
    they finish, just after the client saw the last chunk), 2 s at most."""
    if before is None:
        return {}, {}
    view: dict = {}

    async def counted() -> bool:
        after = await _scrape(http, model)
        view["figs"] = server_metrics.level_means(before, after) if after is not None else ({}, {})
        return after is None or view["figs"][0].get("server_requests", 0) >= completed

    await await_until(counted, 2.0, 0.1, "the server's count of the level", raise_timeout=False)
    return view["figs"]


class _Progress:
    """A live progress bar per phase (rich); silent when disabled."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.p = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn)

            self.p = Progress(TextColumn("{task.description:>18}"), BarColumn(),
                              MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                              TimeElapsedColumn())
            self.p.start()
        return self

    def __exit__(self, *exc):
        if self.p:
            self.p.stop()

    def task(self, name: str, total: Optional[int]):
        return self.p.add_task(name, total=total, info="") if self.p else None

    def update(self, task, rec: dict, errors: int) -> None:
        if self.p is not None and task is not None:
            tpot = rec.get("tpot_s")
            info = f"err {errors}" + (f"  tpot {tpot * 1e3:.1f} ms" if tpot else "")
            self.p.update(task, advance=1, info=info)


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
                            first_prompt: int, progress: _Progress) -> dict:
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

            with _Progress(exp.progress) as progress:
                if exp.warmup:
                    write(await phase("warmup", 1, 1, exp.warmup, None, WARMUP_PROMPTS, progress))
                    _check_alive(conn, "warm-up")
                if exp.single_stream_requests:
                    if exp.reset_prefix_cache:
                        await _reset_prefix_cache(http, cache)
                    before = await _scrape(http, conn.model)
                    res = await phase("single", 1, 1, exp.single_stream_requests, None, 0, progress)
                    if not conn.alive():
                        write(res)
                    _check_alive(conn, "the single-stream phase")
                    srv, src = await _server_view(http, conn.model, before, completed(res))
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
                        await _reset_prefix_cache(http, cache)
                    before = await _scrape(http, conn.model)
                    n = None if exp.duration_s else requests_for(exp, c)
                    res = await phase("sweep", c, c, n, exp.duration_s, 0, progress)
                    if completed(res) < len(res["records"]) and conn.managed is not None:
                        await _settle(http, conn)  # a dying server closes sockets before it exits
                    if not conn.alive() or (completed(res) == 0 and conn.managed is None):
                        figs = figures(res, {})
                    if not conn.alive():
                        rec.log_metrics({"errors": figs["errors"], "completed": figs["completed"]}, step=c)
                        _finish(out, exp, rows, measured, summary, rec, jsonl)
                        raise ServerDied(
                            f"vLLM died during level concurrency={c} ({figs['completed']} of "
                            f"{figs['requests']} requests completed; {len(measured)} level(s) measured "
                            f"before it); last lines of its log:\n{conn.log_tail()}")
                    if completed(res) == 0 and conn.managed is None:
                        try:
                            await http.get("/health", timeout=5.0)
                        except httpx.HTTPError as e:
                            _finish(out, exp, rows, measured, summary, rec, jsonl)
                            raise ServerError(f"endpoint {conn.base_url} stopped answering during "
                                              f"level concurrency={c}: {type(e).__name__}: {e}") from None
                    srv, _ = await _server_view(http, conn.model, before, completed(res))
                    figs = figures(res, srv)
                    if not figs["valid"]:
                        log.warning(describe_invalid(f"level c={c}", figs, exp.max_client_lag_ms))
                    rec.log_metrics({k: v for k, v in figs.items() if _level_metric(k)}, step=c)
                    measured.append((c, figs))
                    rows.append([c] + [figs.get(k) for k in ROW_KEYS] + [invalid_reason(figs) or None])

    rec.set_tags({"prefix_cache": _prefix_cache_tag(exp, cache)})
    _finish(out, exp, rows, measured, summary, rec, jsonl)
    return summary


async def _settle(http: httpx.AsyncClient, conn: Connection, timeout_s: float = 10.0) -> None:
    """After failed requests: waits until the launched server either answers /health or has
    exited, so a crash is reported as one even when the level ended a moment before the
    process did."""
    async def settled() -> bool:
        if not conn.alive():
            return True
        return (await http.get("/health", timeout=2.0)).status_code == 200

    await await_until(settled, timeout_s, 0.2, "the server to answer or exit",
                      retry_on=(httpx.HTTPError,), raise_timeout=False)


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


def _finish(out: Path, exp: MacroConfig, rows: list, measured: list, summary: dict,
            rec: Recorder, jsonl) -> None:
    """Summary figures, table and plots from the levels measured so far."""
    jsonl.close()
    if not measured:
        return
    levels = [c for c, _ in measured]
    tput = [f["output_tok_s"] for _, f in measured]
    peak_i = max(range(len(tput)), key=tput.__getitem__)
    sat = saturation(levels, tput, exp.saturation_gain)
    s = {"peak_output_tok_s": tput[peak_i], "peak_concurrency": levels[peak_i],
         "invalid_levels": sum(1 for _, f in measured if not f["valid"]),
         "stalled_levels": sum(1 for _, f in measured if f["delivery_stalls"]),
         "sweep_errors": sum(f["errors"] for _, f in measured)}
    if sat is not None:
        s["saturation_concurrency"] = sat
    rec.log_metrics(s)
    rec.set_tags({"saturation": str(sat) if sat is not None else
                  f"none within the sweep (throughput still grew by more than "
                  f"{exp.saturation_gain:.0%} at its last step)"})
    summary.update(s)
    text = tables.write(out / "results", COLUMNS, rows,
                        f"macro: {exp.input_tokens} in / {exp.output_tokens} out tokens; ms "
                        "except tok/s, req/s; srv_tpot = server's mean; lag = client send lag; "
                        "loop = client loop lag (mean); cpu = client cores busy; stalls = delivery "
                        "stalls (tokens held back, released in a burst), stall_max their longest "
                        "silence; tpot_nostall = mean TPOT of the requests no stall touched")
    print(text, flush=True)
    pdir = out / "plots"
    flagged = [t if not f["valid"] else None for t, (_, f) in zip(tput, measured)]
    plots.sweep(pdir / "throughput_vs_concurrency.png", levels,
                {"output tok/s": tput, "invalid: client lag or delivery stall": flagged},
                "concurrency", "output tokens / s", "Throughput vs concurrency",
                vline=sat, vline_label=f"saturation (gain < {exp.saturation_gain:.0%})")
    plots.sweep(pdir / "tpot_vs_concurrency.png", levels,
                {k: [f.get(f"tpot_ms_{k}") for _, f in measured] for k in ("p50", "p90", "p99")}
                | {"server mean": [f.get("server_tpot_ms_mean") for _, f in measured]},
                "concurrency", "TPOT (ms)", "TPOT vs concurrency (vLLM definition)")
    _cdf_plot(pdir / "latency_cdf.png", out / "requests.jsonl")


def _cdf_plot(path: Path, jsonl: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_level: dict[int, list[dict]] = {}
    for line in jsonl.read_bytes().splitlines():
        r = orjson.loads(line)
        if r["phase"] == "sweep" and r["ok"]:
            by_level.setdefault(r["level"], []).append(r)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for ax, key, label in zip(axes, ("ttft_s", "tpot_s", "e2e_s"), ("TTFT", "TPOT", "end-to-end")):
        for c in sorted(by_level):
            xs = sorted(r[key] * 1e3 for r in by_level[c] if r[key] is not None)
            if xs:
                ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=f"c={c}")
        ax.set(xlabel=f"{label} (ms)", ylabel="fraction of requests", title=f"{label} CDF")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
