"""macro: single-stream TPOT and throughput vs concurrency against a live vLLM server.

Phases, all with prompts of exactly `input_tokens` tokens (the served tokenizer's count),
`output_tokens` generated with ignore_eos, greedy, a fixed seed (or each request's own
lengths, drawn from experiment.input_len / output_len: k25exp.load.workload):
  1. warm-up: `warmup` requests one at a time, recorded as phase "warmup", never in figures
     (and, with `level_warmup`, one round of each closed-loop level just before it);
  2. single stream: `single_stream_requests` one at a time → single_stream_* figures
     (single_stream_valid = 0 when the client lagged, as for a level);
  3. sweep: for each concurrency C a closed loop of C workers → figures at step C (open
     loop: each rate; load=trace: the trace's requests at its times / each speedup;
     load=sessions: C multi-turn sessions in flight, k25exp.load.sessions, with per-turn TTFT).
A lengths file or a trace is read and checked line by line before the server starts.
With experiment.reset_prefix_cache (a dev endpoint: loopback servers only, unless opted in),
the prefix cache is reset before phase 2 and before every level, so no level reuses another's
prompts' KV; the tag `prefix_cache` says what actually happened. Each phase is flagged invalid when the client lagged or when
tokens reached it late in a burst (a delivery stall, k25exp.load.stalls); its figures are
logged all the same, with the TPOT of the requests no stall touched beside them. Figure definitions: k25exp.load.level_figures and .server_metrics.

Artifacts: requests.jsonl (one line per request, every phase), results.txt/.csv (one row per
level), plots/, server.log (the server's log over this job). A server that dies ends the job
with its log tail, after logging the levels already measured.

Here: the job's order of phases. One phase's requests and figures: macro_phases; the table,
summary and plots: macro_results.

Long because the phases share one event loop and one set of open connections; the
results (table, summary, recovery) are in macro_results.py, the level loop in macro_phases.py.
"""

from __future__ import annotations

import gc
import logging
import time
from contextlib import closing
from pathlib import Path
from typing import Optional

import httpx

from k25exp.config.experiments import MacroConfig
from k25exp.config.schema import K25Config
from k25exp.runners.macro_phases import Phases, completed
from k25exp.runners.macro_results import finish, row
from k25exp.runners.server_run import connect_server, copy_server_log, record_server
from k25exp.load import loops, repeats, validity
from k25exp.serving import admin
from k25exp.load.client import CompletionClient
from k25exp.serving.endpoint import Connection
from k25exp.serving.errors import ServerDied, ServerError
from k25exp.load.level_figures import describe_invalid, session_goodput
from k25exp.load.progress import Progress
from k25exp.load.prompts import load_tokenizer
from k25exp.serving.registry import release
from k25exp.telemetry import host_cpu
from k25exp.load.shards import CHUNKS_PER_PROCESS, available_cpus
from k25exp.load.sessions import SessionPlan, session_figures
from k25exp.load.trace import Trace
from k25exp.load.workload import TracePrompts, Workload
from k25exp.tracking.recorder import Recorder

log = logging.getLogger(__name__)

WARMUP_PROMPTS = 1_000_000  # warm-up prompts are indices from here: never a measured prompt

LEVEL_METRICS = {  # logged at step = concurrency
    "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99", "ttft_ms_mean", "tpot_ms_p50", "tpot_ms_p90",
    "tpot_ms_p99", "tpot_ms_mean", "itl_ms_p50", "itl_ms_p99", "itl_ms_mean", "e2e_ms_p50",
    "e2e_ms_p99", "e2e_ms_mean", "output_tok_s", "request_s", "errors", "requests", "completed",
    "malformed_chunks", "output_tokens_mismatch", "prompt_tokens_mismatch", "client_lag_ms_p50",
    "client_lag_ms_p99", "client_lag_ms_max", "client_loop_lag_ms_p99", "client_loop_lag_ms_p50",
    "client_loop_lag_ms_mean", "client_cpu_util", "client_lagged", "client_lag_limit_ms",
    "client_late_sends", "client_lag_ref_ms",
    "delivery_stalls", "stalled_requests", "delivery_stall_ms_max", "delivery_stall_ms_total",
    "stall_ref_step_ms", "tpot_ms_mean_no_stalls", "tpot_ms_p50_no_stalls", "tpot_n_no_stalls",
    "valid", "wall_s", "server_tpot_ms_mean", "server_ttft_ms_mean", "server_itl_ms_mean",
    "server_e2e_ms_mean", "server_requests", "tpot_gap_pct",
    # speculative decoding, when the server runs it (server_metrics.spec_figures)
    "spec_drafts", "spec_draft_tokens", "spec_accepted_tokens", "acceptance_rate",
    "mean_accepted_tokens", "mean_acceptance_length", "tokens_per_chunk",
    # the other requests' prefills a decode step shared (level_figures.decode_prefills)
    "prefills_per_decode_step", "prefill_tokens_per_decode_step",
    "decode_only_tpot_ms", "prefill_shared_us_per_token", "prefill_fit_n",
    # what the ITL tail's causes can be told from without a trace (load.tail_client: tail_client.*)
    "server_preemptions", "server_itl_ms_p99_le", "server_itl_n",
    # whether other processes shared the host's CPUs while it ran (telemetry.host_cpu)
    "host_cpus", "host_busy_cores", "host_own_cores", "host_other_cores", "host_steal_cores",
    "host_shared",
}


LEVEL_METRICS |= {  # open loop, goodput, the user's view from the scheduled send
    "target_rate_req_s", "scheduled_rate_req_s", "achieved_rate_req_s", "rate_error_pct",
    "rate_missed", "goodput_req_s", "goodput_tok_s", "good_fraction", "client_lag_n",
    "output_tok_s_ci_lo", "output_tok_s_ci_hi", "prefix_cache_queries", "prefix_cache_hits",
    "prefix_cache_hit_rate", "repeats", "client_processes", "client_failures"}
LEVEL_METRICS |= {  # multi-turn sessions (k25exp.load.sessions); whether the server caches prefixes
    "sessions", "sessions_completed", "sessions_cut", "think_s_mean", "prefix_caching_enabled",
    "good_session_fraction"}
LEVEL_METRICS |= {  # the lengths the level's requests were drawn with; a schedule's send lag
    f"{x}_len_{s}" for x in ("input", "output") for s in ("mean", "std", "min", "max")} | {
    f"send_lag_ms_{s}" for s in ("p50", "p99", "mean", "n")}


# The single-stream phase's figures, logged once (no step): key -> the phase's figure.
SINGLE_STREAM = {
    "single_stream_tpot_ms": "tpot_ms_p50", "single_stream_tpot_ms_mean": "tpot_ms_mean",
    "single_stream_tpot_ms_n": "tpot_ms_n", "single_stream_tpot_ms_ci_lo": "tpot_ms_p50_ci_lo",
    "single_stream_tpot_ms_ci_hi": "tpot_ms_p50_ci_hi", "single_stream_ttft_ms": "ttft_ms_p50",
    "single_stream_itl_ms_p50": "itl_ms_p50", "single_stream_e2e_ms": "e2e_ms_p50",
    "single_stream_output_tok_s": "output_tok_s", "single_stream_errors": "errors",
    "single_stream_tokens_per_chunk": "tokens_per_chunk",
    "single_stream_server_tpot_ms_mean": "server_tpot_ms_mean",
    "single_stream_server_ttft_ms_mean": "server_ttft_ms_mean",
    "single_stream_client_lag_ms_p99": "client_lag_ms_p99",
    "single_stream_client_loop_lag_ms_mean": "client_loop_lag_ms_mean",
    "single_stream_client_loop_lag_ms_p99": "client_loop_lag_ms_p99",
    "single_stream_tpot_gap_pct": "tpot_gap_pct", "single_stream_client_lagged": "client_lagged",
    "single_stream_delivery_stalls": "delivery_stalls",
    "single_stream_delivery_stall_ms_max": "delivery_stall_ms_max",
    "single_stream_tpot_ms_no_stalls": "tpot_ms_p50_no_stalls",
    "single_stream_tpot_ms_mean_no_stalls": "tpot_ms_mean_no_stalls", "single_stream_valid": "valid",
}


def _level_metric(key: str) -> bool:
    return (key in LEVEL_METRICS or "_rep_" in key
            or key.startswith(("acceptance_pos", "ttft_sched_ms", "e2e_sched_ms", "tail_client.",
                               "turn"))
            or (key.endswith(("_n", "_p50_ci_lo", "_p50_ci_hi")) and key.startswith(
                ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"))))


def trace_requests(exp: MacroConfig, trace: Trace) -> int:
    """Requests a trace's level sends: its lines, or the first experiment.requests of them."""
    return min(len(trace), exp.requests or len(trace))


def run(cfg: K25Config, out: Path, rec: Recorder) -> dict[str, float]:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    work = Workload(cfg.experiment, cfg.server)  # files read and checked before a server starts
    t = time.perf_counter()
    generated: list[Path] = []
    try:
        conn = connect_server(cfg, on_generate=generated.append)
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
        return loops.run(_measure(cfg, conn, out, rec, work), cfg.experiment.client_event_loop)
    except ServerDied:
        if conn.managed:
            release(conn.managed)  # stop what's left of it; the next job starts afresh
        raise
    finally:
        gc.unfreeze()
        copy_server_log(conn, out)


async def _measure(cfg: K25Config, conn: Connection, out: Path, rec: Recorder,
                   work: Workload) -> dict[str, float]:
    """Warm-up, single stream, then the sweep's levels; the summary figures."""
    exp: MacroConfig = cfg.experiment
    prompt, trace, sessions, tok_path = _prompts(cfg, conn, work)
    gc.collect()
    gc.freeze()  # what exists now is never scanned again: collections between levels are cheap
    rec.set_tags({"macro.tokenizer": str(tok_path), "macro.tpot_definition":
                  "(e2e - ttft) / (output_tokens - 1), vLLM's; itl = gaps between token chunks",
                  "macro.load": _load_tag(exp), **work.describe(),
                  "macro.validity": validity.describe(exp.validity, exp.max_client_lag_ms,
                                                      exp.lag_reference())})
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, float] = {}
    rows: list = []
    measured: list = []
    cache: dict = {}  # whether the prefix cache could be reset, and why not
    # Closed on every path (an unexpected error included): what was measured stays readable.
    with open(out / "requests.jsonl", "wb") as jsonl:
        client_kw = dict(base_url=conn.base_url, model=conn.model, api_key=conn.api_key,
                         timeout_s=exp.request_timeout_s, max_connections=exp.max_in_flight() + 4,
                         continuous_usage=exp.continuous_usage, temperature=exp.temperature,
                         seed=exp.seed if exp.request_seed else None)
        async with CompletionClient(**client_kw) as client:
            rec.set_tags({"macro.client": _client_tag(exp, client)})
            with Progress(exp.progress) as progress, closing(Phases(
                    exp, conn, client, prompt, jsonl, progress, time.perf_counter(),
                    client_kw)) as ph:
                # every record's times (sent_s, scheduled_s) count from ph.t0
                await _warm_up(ph, 1, exp.warmup, WARMUP_PROMPTS)
                if exp.single_stream_requests:
                    summary.update(await _single_stream(ph, rec, cache))
                warm = levels_to_warm(exp, conn)
                rec.set_tags({"macro.level_warmup": _level_warmup_tag(exp, warm)})
                for c in exp.sweep_levels():
                    try:
                        figs = await _level(ph, c, rec, cache, measured_before=len(measured),
                                            trace=trace, sessions=sessions,
                                            warm_from=warm.get(int(c)))
                    except (ServerDied, ServerError):
                        finish(out, exp, rows, measured, summary, rec, jsonl)  # the levels so far
                        raise
                    measured.append((c, figs))
                    rows.append(row(c, figs))
    rec.set_tags({"prefix_cache": _prefix_cache_tag(exp, cache)})
    finish(out, exp, rows, measured, summary, rec, jsonl)
    return summary


def _level_warmup_tag(exp: MacroConfig, warm: dict[int, int]) -> str:
    """What the tag macro.level_warmup says: which levels this job warmed up, and why not the
    others."""
    if not exp.level_warmup:
        return "off (experiment.level_warmup=false)"
    if exp.load != "closed":
        return f"none: load={exp.load} (a closed-loop level's round only)"
    levels = [int(c) for c in exp.sweep_levels()]
    here = [c for c in levels if c in warm]
    before = [c for c in levels if c not in warm]
    parts = [f"one round (c requests, c in flight) before c = {', '.join(map(str, here))}"] if here else []
    if before:
        parts.append(f"c = {', '.join(map(str, before))} not again: an earlier job warmed this "
                     "server up there at this request shape")
    return "; ".join(parts)


async def _warm_up(ph: Phases, c: int, n: int, first: int) -> None:
    """n requests with c in flight, from prompt `first` on, as phase "warmup" (never in a
    figure); each record's prompt_index says which prompt it sent."""
    if not n:
        return
    res = await ph.run("warmup", c, c, n, None, first)
    for x in res["records"]:
        x["prompt_index"] = first + x["i"]
    ph.write(res)
    _check_alive(ph.conn, "warm-up")


# The (concurrency, prompt tokens, output tokens) each server was warmed up at in this
# process, by server (its URL and, when launched here, its pid: a restart starts afresh). A
# server that had run a level once (a speculative server's next α) showed no one-time stall,
# so a later job on the same server and shape skips that level's warm-up round.
_WARMED: dict[tuple, set[tuple]] = {}


def _server_id(conn: Connection) -> tuple:
    return conn.base_url, conn.managed.pid if conn.managed else None


def _shape(exp: MacroConfig, c: float) -> tuple:
    """What a level's warm-up is remembered by: its concurrency and request shape."""
    return int(c), exp.input_tokens, exp.output_tokens


def levels_to_warm(exp: MacroConfig, conn: Connection) -> dict[int, int]:
    """The levels this job warms up (experiment.level_warmup), each with its first prompt:
    those the server has not run a warm-up round of at this request shape in this process."""
    done = _WARMED.get(_server_id(conn), set())
    return {c: first for c, first in level_warmup_prompts(exp).items()
            if _shape(exp, c) not in done}


def level_warmup_prompts(exp: MacroConfig) -> dict[int, int]:
    """Each closed-loop level's first warm-up prompt (experiment.level_warmup: one round of
    the level before it is measured), every level its own prompts after the job's warm-up's:
    a level's warm-up never finds another's prompts in the prefix cache. {} without it."""
    if not exp.level_warmup or exp.load != "closed":
        return {}
    out, first = {}, WARMUP_PROMPTS + exp.warmup
    for c in exp.sweep_levels():
        out[int(c)] = first
        first += int(c)
    return out


def _prompts(cfg: K25Config, conn: Connection, work: Workload):
    """The job's prompt sources (the shaped one; a trace's or the sessions' for its sweep),
    every prompt built before anything is timed (tokenizing between requests would be client
    lag) or sent (a trace line too short for the tokenizer is named before the first request),
    and the tokenizer they were counted with."""
    exp: MacroConfig = cfg.experiment
    tok_path = cfg.server.tokenizer or conn.info.get("model_path")
    if not tok_path:
        raise ServerError("no tokenizer: set server.tokenizer (folder or hub id of the served model's)")
    tok = load_tokenizer(tok_path, cfg.server.trust_remote_code)
    prompt, trace = work.prompts(tok)
    sessions = work.sessions(tok)
    if trace is not None:
        trace.many(range(trace_requests(exp, trace.trace)))
    if sessions is not None:
        sessions.prepare(range(max(sessions_for(exp, c) for c in exp.sweep_levels()) * exp.repeats))
    if exp.duration_s is None:
        by_count = trace is None and sessions is None  # the sweep's own prompts, by request index
        sweep = [exp.requests_for(c) * exp.repeats for c in exp.sweep_levels()] if by_count else []
        prompt.many(range(max([exp.single_stream_requests] + sweep)))
        level_warm = sum(level_warmup_prompts(exp))  # the levels' c's: a round of each
        prompt.many(range(WARMUP_PROMPTS, WARMUP_PROMPTS + exp.warmup + level_warm))
    return prompt, trace, sessions, tok_path


def sessions_for(exp: MacroConfig, c: int) -> int:
    """Sessions a level of concurrency c runs (experiment.sessions.count, or about as many
    requests as a closed-loop level)."""
    return exp.sessions.per_level(c, exp.requests_for(c))


async def _single_stream(ph: Phases, rec: Recorder, cache: dict) -> dict[str, float]:
    """Requests one at a time: the single_stream_* figures (logged, and returned)."""
    exp, conn, http = ph.exp, ph.conn, ph.client.http
    if exp.reset_prefix_cache:
        await admin.reset_prefix_cache(http, cache)
    before = await admin.scrape(http, conn.model)
    res = await ph.run("single", 1, 1, exp.single_stream_requests, None, 0)
    if not conn.alive():
        ph.write(res)
    _check_alive(conn, "the single-stream phase")
    srv, src = await admin.server_view(http, conn.model, before, completed(res))
    figs = ph.figures(res, srv)
    if figs.get("tpot_ms_p50"):  # bounds the chunk rate of every level: auto client processes
        ph.single_tpot_s = figs["tpot_ms_p50"] / 1e3
    single = {k: figs[f] for k, f in SINGLE_STREAM.items() if figs.get(f) is not None}
    single.update({f"single_stream_{k}": v for k, v in srv.items()
                   if k.startswith(("spec_", "accept", "mean_accept"))})
    if not figs["valid"]:
        log.warning(describe_invalid("the single-stream phase", figs))
    rec.log_metrics(single)
    if src:
        rec.set_tags({f"server_metrics.{k}": v for k, v in src.items()})
    return single


async def _level(ph: Phases, c: float, rec: Recorder, cache: dict, measured_before: int,
                 trace: Optional[TracePrompts] = None,
                 sessions: Optional[SessionPlan] = None, warm_from: Optional[int] = None) -> dict:
    """One level of the sweep (concurrency c, c req/s in the open loop, the trace at speedup
    c, or c sessions in flight), `repeats` times pooled: its figures, logged at the level's
    step. A server that died or an endpoint that stopped answering raises, after logging what
    the level completed (`measured_before`: the levels measured before this one, for its
    message). `warm_from`: one warm-up round of the level first, from that prompt on."""
    exp, conn, http = ph.exp, ph.conn, ph.client.http
    if warm_from is not None:  # before the reset: the warm-up never warms the cache
        await _warm_up(ph, int(c), int(c), warm_from)
        _WARMED.setdefault(_server_id(conn), set()).add(_shape(exp, c))
    if exp.reset_prefix_cache:
        await admin.reset_prefix_cache(http, cache)
    before = await admin.scrape(http, conn.model)
    n = None if exp.duration_s else exp.requests_for(c)
    rate = c if exp.load == "open" else None
    due = None
    if trace is not None:  # every repeat replays the same lines (TracePrompts: i mod the trace)
        n = trace_requests(exp, trace.trace)
        due = trace.trace.due_s(c, n)
    count = sessions_for(exp, c) if sessions is not None else None
    if count:  # n: the level's requests (its records' indices), count × turns
        n = count * sessions.turns
    reps = []
    host0 = host_cpu.snapshot(ph.own_roots)  # blocks ~ms, outside the timed requests
    for r in range(exp.repeats):
        if r and exp.reset_prefix_cache:
            await admin.reset_prefix_cache(http, cache)
        rep = await ph.run("sweep", c, 0 if rate or trace else c, count or n, exp.duration_s,
                           r * (count or n or 0), rate=rate, due=due, prompt=trace,
                           sessions=sessions)
        for x in rep["records"]:  # step: the MLflow step its level's figures went to
            x["repeat"], x["prompt_index"], x["step"] = r, r * (n or 0) + x["i"], exp.step_of(c)
        reps.append(rep)
        if not conn.alive():
            break
    host1 = host_cpu.snapshot(ph.own_roots)
    res = repeats.pool(reps)
    lvl = f"rate {c:g}/s" if rate else f"speedup {c:g}" if trace else f"concurrency={c}"
    if completed(res) < len(res["records"]) and conn.managed is not None:
        await admin.settle(http, conn)  # a dying server closes sockets before it exits
    if not conn.alive():
        figs = ph.figures(res, {})
        rec.log_metrics({"errors": figs["errors"], "completed": figs["completed"]},
                        step=exp.step_of(c))
        raise ServerDied(f"vLLM died during level {lvl} ({figs['completed']} of {figs['requests']} "
                         f"requests completed; {measured_before} level(s) measured before it); "
                         f"last lines of its log:\n{conn.log_tail()}")
    if completed(res) == 0 and conn.managed is None:
        ph.figures(res, {})  # marks the failed requests' stalls and writes their records
        try:
            await http.get("/health", timeout=5.0)
        except httpx.HTTPError as e:
            raise ServerError(f"endpoint {conn.base_url} stopped answering during "
                              f"level {lvl}: {type(e).__name__}: {e}") from None
    srv, _ = await admin.server_view(http, conn.model, before, completed(res))
    figs = ph.figures(res, srv)
    if sessions is not None:
        figs.update(session_figures(res["records"], sessions.turns))
        figs.update(session_goodput(res["records"], sessions.turns, exp.slo.bounds()))
    if len(reps) > 1:
        figs.update(repeats.spread(ph.repeat_figures(reps)))
    limit = exp.validity.host_other_cores_max
    figs.update(host_cpu.figures(host0, host1, available_cpus(), limit))
    if figs.get("host_shared"):
        log.warning(f"level {lvl}: {host_cpu.describe(figs, limit)}; its server may have run "
                    "slower than alone (host_shared: spec_decode leaves such rounds out)")
    if not figs["valid"]:
        log.warning(describe_invalid(f"level rate {c:g}/s" if rate else f"level speedup {c:g}"
                                     if trace else f"level c={c}", figs))
    rec.log_metrics({k: v for k, v in figs.items() if _level_metric(k)}, step=exp.step_of(c))
    return figs


def _client_tag(exp: MacroConfig, client: CompletionClient) -> str:
    procs = (f"{exp.client_processes} client process(es) per level (fewer where a level has "
             "fewer streams)" if exp.client_processes else
             "client processes per level: auto (enough that each streams at most "
             f"{CHUNKS_PER_PROCESS} chunks/s of the level's most: per level, client_processes)")
    cap = ("; open loop over several processes: the cap split into equal shares, one per "
           "process" if exp.load == "open" else "")
    return (f"httpx {httpx.__version__} (one keep-alive connection per request in flight; "
            f"sockets: {client.socket_layer}), {loops.version(exp.client_event_loop)} event "
            f"loop; {procs}{cap} (the load it sends: macro.load)")


def _load_tag(exp: MacroConfig) -> str:
    cap = f", at most {exp.max_in_flight()} in flight" + (
        "" if exp.max_concurrency else " (the client's cap; max_concurrency unset)")
    if exp.load == "open":
        return (f"open loop: gamma arrivals (burstiness {exp.burstiness:g}; 1 = Poisson) at "
                f"{exp.sweep_levels()} req/s{cap}; latencies also from the scheduled send; "
                "step = rate x 1000")
    if exp.load == "trace":
        return (f"trace replay: {exp.trace.path} at its own times divided by each speedup "
                f"{exp.sweep_levels()}{cap}; latencies also from the scheduled send; "
                "step = speedup x 1000 (the trace: macro.trace)")
    ramp = f", workers started over {exp.ramp_s:g} s" if exp.ramp_s else ", all workers at once"
    if exp.load == "sessions":
        return (f"sessions: {exp.sweep_levels()} multi-turn sessions in flight (closed loop, a "
                f"worker's next session when its last one ended){ramp}; per-turn TTFT; step = "
                "concurrency (the sessions: macro.sessions)")
    return f"closed loop: {exp.sweep_levels()} workers{ramp}; step = concurrency"


def _prefix_cache_tag(exp: MacroConfig, cache: dict) -> str:
    if not exp.reset_prefix_cache:
        return "not reset (experiment.reset_prefix_cache=false)"
    if cache.get("reset") is False:
        return f"NOT reset between levels: {cache.get('why')}"
    return "reset before every level"


def _check_alive(conn: Connection, what: str) -> None:
    if not conn.alive():
        raise ServerDied(f"vLLM died during {what}; last lines of its log:\n{conn.log_tail()}")


