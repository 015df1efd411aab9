"""profile: a torch.profiler capture of the live server's decode, broken down by kernel.

The server must run with vLLM's --profiler-config (conf/experiment/profile.yaml sets it; the
server manager restarts a running server only if its settings differ). Steps:
warm-up requests (outside the window), one round of the level (level_warmup) → the level
once without the profiler, sent as the
macro sends a level (unprofiled_tpot_*: this server start's own speed, which the report sets
against the macro's, and its decode-only TPOT, which gives the profiler's overhead)
→ POST /start_profile → `requests` decode requests at `concurrency` → POST /stop_profile
(blocks while every rank flushes) → every trace written since the window opened is copied
into the run (traces/) and analysed (k25exp.traces). The profiled requests' latencies are
recorded (requests.jsonl) but never logged as figures: the profiler slows the server down.
What their tail is made of is: each of their tokens joined to the captured steps on one clock
(the client reads its clock against the system clock the trace is stamped on: clock.json),
and every gap of the ITL tail given a cause (tail.*, clock.*: k25exp.runners.profile_tail).
Then, on the idle server, the step's collectives at tokens =
concurrency are timed inside its TP workers (server_burst_*, k25exp.serving.collective_probe):
the same burst the nccl_burst phase times in processes of its own, so the report can tell
where the two differ from how the server's step issues them.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import statistics
import time
from dataclasses import replace
from pathlib import Path

import httpx
import orjson

from k25exp.config.experiments import ProfileConfig, TraceBreakdownConfig
from k25exp.collectives.step import decode_step_ops
from k25exp.config.schema import K25Config
from k25exp.dtypes import dtype_bytes
from k25exp.gemm.floor import decode_floor
from k25exp.model import routing
from k25exp.runners.profile_tail import CLOCK_FILE, profiled_records, read_clock, save_clock, tail_of
from k25exp.runners.server_run import connect_server, copy_server_log, record_server
from k25exp.serving import collective_probe
from k25exp.serving.answers import refuse_html
from k25exp.serving.launch import extension_loaded
from k25exp.load.client import CompletionClient, run_level
from k25exp.load.level_figures import decode_prefills
from k25exp.load.prompts import PromptBuilder, load_tokenizer
from k25exp.serving.server import Connection, ServerError
from k25exp.traces import analyze, step_phases, summary_text, write_outputs
from k25exp.traces.token_gaps import ClientClock
from k25exp.tracking.recorder import Recorder

log = logging.getLogger(__name__)


class ProfileError(RuntimeError):
    pass


def with_scopes(cfg: K25Config) -> K25Config:
    """The server with vLLM's model-runner scopes on (sample, draft, bookkeep ...: the step's
    cycle split in k25exp.traces.step_phases); a user's own setting of the variable wins."""
    return replace(cfg, server=replace(cfg.server, env={**step_phases.ENV, **cfg.server.env}))


def run(cfg: K25Config, out: Path, rec: Recorder) -> dict[str, float]:
    exp: ProfileConfig = cfg.experiment
    logging.getLogger("httpx").setLevel(logging.WARNING)
    cfg = with_scopes(cfg)
    trace_dir = _trace_dir(cfg)
    conn = connect_server(cfg)
    record_server(cfg, conn, rec)
    rec.set_tags({"profile.note": "latencies under the profiler are not performance figures "
                  "and are not logged (only what the ITL tail is made of: tail.*); see "
                  "experiment=macro",
                  "profile.trace_dir": str(trace_dir)})
    try:
        window_s, stop_s, since, plain, profiled, clock = asyncio.run(_capture(cfg, conn, out))
    finally:
        copy_server_log(conn, out)
    rec.log_metrics({"profile_window_s": window_s, "stop_profile_s": stop_s,
                     **unprofiled_tpot(plain)})
    burst = server_burst(cfg, conn, out, rec)
    traces = sorted(p for p in trace_dir.rglob(exp.trace_glob) if p.stat().st_mtime >= since)
    # vLLM's API server writes a trace of its own (*async_llm*): host-side only, no steps.
    traces = [p for p in traces if "async_llm" not in p.name]
    if not traces:
        raise ProfileError(f"no trace matching {exp.trace_glob!r} appeared in {trace_dir} after "
                           "/stop_profile; is the server's torch_profiler_dir readable from here?")
    kept = out / "traces"
    kept.mkdir(parents=True, exist_ok=True)
    copies = [Path(shutil.copy2(p, kept / p.name)) for p in traces]
    metrics = breakdown(copies, exp, out, rec)
    floor = step_floor(cfg, metrics, rec)
    rec.log_metrics(floor)
    # the profiled tokens joined to the steps: the ITL tail by cause (k25exp.runners.profile_tail)
    return {**metrics, **floor, **burst, **tail_of(copies, profiled, clock, out, rec)}


SERVER_BURST_TIMING = (
    "inside the server's TP workers (vLLM's /collective_rpc, k25exp.serving.collective_probe), "
    "server idle after the capture, profiler off: per burst a barrier on the TP group's CPU "
    "group, then the step's ops back to back through vLLM's tensor_model_parallel_* calls, "
    "eager, each op blocking (perf_counter_ns around it); split at each op's last arrival "
    "across ranks; medians over the bursts after 5 warm-up bursts")


def server_burst(cfg: K25Config, conn: Connection, out: Path, rec: Recorder) -> dict[str, float]:
    """The step's collectives timed in the server's own workers (module docstring); {} with a
    tag saying why where they are not (a failure here never loses the capture)."""
    exp: ProfileConfig = cfg.experiment
    if not exp.server_burst_reps:
        return {}
    if cfg.server.kind != "vllm" or cfg.server.tp < 2 or not extension_loaded(cfg.server):
        rec.set_tags({"server_burst.skipped": "the server's workers do not load the probe "
                      "(server=endpoint, TP 1, server.collective_probe=false or another "
                      "interpreter runs vLLM)"})
        return {}
    m = cfg.model
    ops = decode_step_ops(m.hidden_size, m.num_hidden_layers, m.vocab_size, cfg.server.tp,
                          exp.concurrency, dtype_bytes(m.dtype))
    try:
        results = collective_probe.run_in_server(conn.base_url, [(o.op, o.numel) for o in ops],
                                                 m.dtype, exp.server_burst_reps)
    except Exception as e:  # noqa: BLE001  (a probe failure is reported, the capture kept)
        log.warning("in-server burst not timed: %s", e)
        rec.set_tags({"server_burst.skipped": f"{type(e).__name__}: {e}"[:500]})
        return {}
    (out / "server_burst.json").write_bytes(orjson.dumps(
        {"ops": [[o.name, o.op, o.numel, o.nbytes] for o in ops], "results": results}))
    metrics = collective_probe.summarise(results)
    rec.set_tags({"server_burst.timing": SERVER_BURST_TIMING})
    rec.log_metrics(metrics)
    log.info("in-server burst: %.3f ms per step (transport %.3f ms), %d ops", metrics["server_burst_ms"],
             metrics.get("server_burst_transport_ms", float("nan")), len(ops))
    return metrics


def step_floor(cfg: K25Config, breakdown_metrics: dict[str, float], rec: Recorder) -> dict[str, float]:
    """The profiled step's memory-bandwidth floor beside its measured time (floor.* metrics,
    k25exp.gemm.floor): one rank of TP server.tp at batch = concurrency, the KV cache at
    the mean context of the requests' decode steps (input + output / 2 tokens). A model the
    byte count cannot shard is a tag, not a failed profile."""
    exp: ProfileConfig = cfg.experiment
    try:
        return decode_floor(cfg.model, cfg.server.tp, exp.concurrency,
                            exp.input_tokens + exp.output_tokens / 2,
                            cfg.hardware.mem_bandwidth_gbps, breakdown_metrics,
                            routing.of_config(cfg))
    except ValueError as e:
        log.warning("no bandwidth floor: %s", e)
        rec.set_tags({"floor.error": str(e)})
        return {}


def level_batch(exp: ProfileConfig | TraceBreakdownConfig) -> int | None:
    """The smallest decode batch that is the profiled level's: its concurrency less 10 %
    (requests of one level end a step or two apart). Steps below it, the ramp-up while the
    client sends the level's requests and the drain as they finish, are left out of the
    breakdown: at c = 256 on one H200, 8 of 39 steps ran 2 requests (7.8 ms, against 37.6 ms
    at 256) and their mean made the level's step 31.5 ms. None: a trace of someone else's."""
    c = getattr(exp, "concurrency", None)
    return max(1, int(c * 0.9)) if c else None


def breakdown(paths: list[Path], exp: ProfileConfig | TraceBreakdownConfig, out: Path,
              rec: Recorder) -> dict[str, float]:
    """Analyse traces, write tables/plots/JSON into out/breakdown, log the figures."""
    t = time.perf_counter()
    analysis = analyze(paths, rules_path=Path(exp.rules) if exp.rules else None,
                       max_steps=exp.limit_points, min_batch=level_batch(exp))
    metrics = write_outputs(analysis, out / "breakdown", top=exp.top_kernels)
    metrics["analyse_s"] = time.perf_counter() - t
    rec.log_metrics(metrics)
    # trace.categories: the rules' categories, whose shares (with idle) make up the step: the
    # report's reconciliation counts each of them, a user's own included, as a part of the step
    rec.set_tags({"traces": ",".join(p.name for p in paths)[:5000],
                  "trace.step_source": ",".join(sorted({r.step_source for r in analysis.ranks})),
                  "trace.categories": ",".join(analysis.categories)[:5000]})
    for w in analysis.warnings:
        log.warning("%s", w)
    print(summary_text(analysis), flush=True)
    return metrics


def _trace_dir(cfg: K25Config) -> Path:
    exp: ProfileConfig = cfg.experiment
    if exp.trace_dir:
        return Path(exp.trace_dir)
    prof = cfg.server.profiler or {}
    if cfg.server.kind == "vllm" and prof.get("torch_profiler_dir"):
        return Path(prof["torch_profiler_dir"])
    raise ProfileError("no trace folder: set server.profiler.torch_profiler_dir (launched server) "
                       "or experiment.trace_dir (server=endpoint: a folder this machine can read)")


def unprofiled_tpot(records: list[dict]) -> dict[str, float]:
    """The profiled level sent once more without the profiler, on this server start, as the
    macro sends a level: the mean of its requests' TPOTs (client clock, ms), how many, and
    its decode-only TPOT (level_figures' fit: the TPOT of a step that shares no prefill).
    Beside the macro's TPOT it tells this server start's own speed from the profiler's
    slowdown (the report's reconciliation): two starts of one server can differ by a third on
    a 2-core machine."""
    ok = [r for r in records if r.get("ok") and r.get("tpot_s")]
    if not ok:
        return {}
    out = {"unprofiled_tpot_ms_mean": statistics.fmean(r["tpot_s"] * 1e3 for r in ok),
           "unprofiled_tpot_n": float(len(ok))}
    if "decode_only_tpot_ms" in (fit := decode_prefills(ok)):
        out["unprofiled_decode_only_tpot_ms"] = fit["decode_only_tpot_ms"]
    return out


async def _capture(cfg: K25Config, conn: Connection, out: Path
                   ) -> tuple[float, float, float, list[dict], list[dict], ClientClock]:
    exp: ProfileConfig = cfg.experiment
    tok_path = cfg.server.tokenizer or conn.info.get("model_path")
    if not tok_path:
        raise ServerError("no tokenizer: set server.tokenizer")
    prompt = PromptBuilder(load_tokenizer(tok_path, cfg.server.trust_remote_code),
                           exp.input_tokens, exp.seed)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    clock = ClientClock.start(t0)  # the records' clock against the trace's (token_gaps)
    with open(out / "requests.jsonl", "wb") as jsonl:
        def keep(r: dict) -> None:
            jsonl.write(orjson.dumps(r) + b"\n")

        async with CompletionClient(conn.base_url, conn.model, conn.api_key,
                                    max_connections=exp.concurrency + 4,
                                    temperature=exp.temperature, seed=exp.seed) as client:
            common = dict(concurrency=exp.concurrency, max_tokens=exp.output_tokens, t0=t0,
                          input_tokens=exp.input_tokens, on_record=keep,
                          should_stop=lambda: not conn.alive())
            if exp.warmup:
                await run_level(client, lambda i: prompt(1_000_000 + i), phase="warmup", level=0,
                                n_requests=exp.warmup, **common)
            if exp.level_warmup:  # the level's batch shape once, outside every figure
                await run_level(client, lambda i: prompt(3_000_000 + i), phase="warmup",
                                level=exp.concurrency, n_requests=exp.concurrency, **common)
            # the level without the profiler, sent as the macro sends one (unprofiled_tpot)
            plain = {"records": []}
            if exp.reference_rounds:
                plain = await run_level(client, lambda i: prompt(2_000_000 + i),
                                        phase="unprofiled", level=exp.concurrency,
                                        n_requests=exp.reference_requests(), **common)
            http = client.http
            since = time.time() - 1.0  # file mtimes have coarse resolution on some filesystems
            await _post(http, "/start_profile", 60.0)
            w0 = time.perf_counter()
            res = await run_level(client, prompt, phase="profiled", level=exp.concurrency,
                                  n_requests=max(exp.requests, exp.concurrency), **common)
            window_s = time.perf_counter() - w0
            s0 = time.perf_counter()
            await _post(http, "/stop_profile", exp.stop_timeout_s)
            stop_s = time.perf_counter() - s0
    clock = clock.finish()
    save_clock(out, clock)
    failed = [r for r in res["records"] if not r["ok"]]
    if failed:
        raise ProfileError(f"{len(failed)} of {len(res['records'])} profiled requests failed: "
                           f"{failed[0].get('error')}")
    log.info("profile window %.1f s, /stop_profile %.1f s", window_s, stop_s)
    return window_s, stop_s, since, plain["records"], res["records"], clock


async def _post(http: httpx.AsyncClient, path: str, timeout_s: float) -> None:
    try:
        r = await http.post(path, timeout=timeout_s)
    except httpx.HTTPError as e:
        raise ProfileError(f"POST {path} failed: {type(e).__name__}: {e}") from e
    if r.status_code == 404:
        raise ProfileError(f"POST {path}: 404 — the server was started without "
                           "--profiler-config (set server.profiler)")
    if r.status_code >= 400:
        raise ProfileError(f"POST {path}: HTTP {r.status_code}: {r.text[:300]}")
    refuse_html(r, "vLLM's answer")  # a proxy's page: the profiler never saw the request


def recover(out: Path, rec: Recorder) -> str:
    """A killed job's figures (`k25exp recover`): the breakdown of the traces it had copied into
    traces/ (a capture is copied whole, after /stop_profile), by the runner's own analysis."""
    from k25exp.config.validate import typed_from_folder

    traces = sorted((out / "traces").glob("*.json*")) if (out / "traces").is_dir() else []
    if not traces:
        return "nothing: no traces/ (the job died before its capture was copied)"
    breakdown(traces, typed_from_folder(out).experiment, out, rec)
    if (out / CLOCK_FILE).exists() and (out / "requests.jsonl").exists():
        tail_of(traces, profiled_records(out), read_clock(out), out, rec)
        return (f"breakdown of {len(traces)} trace(s) in traces/ (k25exp.traces) and the ITL "
                "tail by cause (k25exp.runners.profile_tail), as the job would have")
    return f"breakdown of {len(traces)} trace(s) in traces/ (k25exp.traces), as the job would have"
