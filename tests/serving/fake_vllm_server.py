"""A fake vLLM server for process-lifecycle tests: no model.

It stands in for `python -m vllm.entrypoints.openai.api_server` where what is tested is the
process (launch from config, readiness, reuse, stop with its whole tree, signals, ports,
logs), never the serving itself: run it through the config with
`server.entrypoint=[-m,tests.serving.fake_vllm_server]`, and k25exp's real launch code starts
it with the argv it builds for vLLM. It reads --host, --port, --served-model-name and
--api-key (or VLLM_API_KEY, as vLLM does) and ignores the rest; binds the port or exits 1
with "Address already in use" as vLLM does; answers /health, /v1/models, /metrics, streaming
/v1/completions, /reset_prefix_cache (only with VLLM_SERVER_DEV_MODE=1), /version, with
tests.serving.stub_server. It prints whether HF_TOKEN is set (never its value).

Behaviour on request, by environment (server.env):
  FAKE_VLLM_EXIT_EARLY=<code>  print an error and exit with that code before binding
  FAKE_VLLM_START_DELAY_S=<s>  wait before binding (a slow start; FAKE_VLLM_HANG_AT_START=1:
                               forever)
  FAKE_VLLM_WORKERS=<n>        start n worker processes first (vLLM's engine core, TP workers)
  FAKE_VLLM_GAP_MS=<ms>        pause between streamed tokens (default 2)
  FAKE_VLLM_TTFT_MS=<ms>       pause before the first token, a "prefill" (default 0)
  FAKE_VLLM_STEP_MS=<ms>       a batch engine instead of the gap: one chunk to every stream in
                               flight per step (vLLM's decode step; stub_server says how)
  FAKE_VLLM_METRICS=html       answer /metrics with an HTML page (a proxy's login form)
  FAKE_VLLM_STAGGER=1          every other completion at half speed (concurrent ones end apart)
  FAKE_VLLM_ENGINE=1           tests.serving.engine_stub instead: steps as vLLM's engine does
                               (FAKE_VLLM_STEP_MS, default 20; FAKE_VLLM_PREFILL_US_PER_TOKEN),
                               answers /start_profile and /stop_profile, and writes its steps as
                               a trace into --profiler-config's torch_profiler_dir; delays by
                               step index from FAKE_VLLM_INJECT, JSON {"<step>": {Injection's
                               fields}}, e.g. {"10": {"slow_ms": 150}}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time

from tests.serving.engine_stub import EngineStub, Injection
from tests.serving.stub_server import StubServer


def _worker() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


def main() -> None:
    if "--worker" in sys.argv:
        return _worker()
    p = argparse.ArgumentParser(description="a fake vLLM server (no model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default="fake")
    p.add_argument("--model", default="")
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"))
    p.add_argument("--profiler-config", default="{}")
    a, _ = p.parse_known_args()
    env = os.environ.get
    print(f"fake vLLM: pid {os.getpid()}, HF_TOKEN {'is set' if env('HF_TOKEN') else 'is not set'}, "
          f"dev mode {'on' if env('VLLM_SERVER_DEV_MODE') == '1' else 'off'}", flush=True)
    if env("FAKE_VLLM_EXIT_EARLY"):
        print("fake vLLM: error: exiting early as asked (FAKE_VLLM_EXIT_EARLY)", flush=True)
        sys.exit(int(env("FAKE_VLLM_EXIT_EARLY")))
    workers = [subprocess.Popen([sys.executable, "-m", "tests.serving.fake_vllm_server",
                                 # the model in its argv: tests find their own server's workers
                                 "--worker", str(i), "--model", a.model]) for i in range(int(env("FAKE_VLLM_WORKERS", "0")))]
    print(f"fake vLLM: {len(workers)} workers started: pids {' '.join(str(w.pid) for w in workers)}",
          flush=True)
    if env("FAKE_VLLM_HANG_AT_START"):
        while True:
            time.sleep(3600)
    time.sleep(float(env("FAKE_VLLM_START_DELAY_S", "0")))
    common = dict(model=a.served_model_name, api_key=a.api_key,
                  dev_mode=env("VLLM_SERVER_DEV_MODE") == "1")
    if env("FAKE_VLLM_ENGINE") == "1":
        stub = EngineStub(host=a.host, port=a.port, step_s=float(env("FAKE_VLLM_STEP_MS", "20")) / 1e3,
                          prefill_s_per_token=float(env("FAKE_VLLM_PREFILL_US_PER_TOKEN", "0")) / 1e6,
                          injections={int(k): Injection(**v) for k, v in
                                      json.loads(env("FAKE_VLLM_INJECT", "{}")).items()},
                          trace_dir=json.loads(a.profiler_config).get("torch_profiler_dir"),
                          record=False, **common)
    else:
        stub = StubServer(a.host, a.port, gap_s=float(env("FAKE_VLLM_GAP_MS", "2")) / 1e3,
                          ttft_s=float(env("FAKE_VLLM_TTFT_MS", "0")) / 1e3, misbehave=False,
                          metrics_html=env("FAKE_VLLM_METRICS") == "html",
                          stagger=env("FAKE_VLLM_STAGGER") == "1",
                          step_s=float(env("FAKE_VLLM_STEP_MS", "0")) / 1e3, **common)

    async def serve() -> None:
        try:
            await stub.start()
        except OSError as e:  # vLLM's words, so the manager's detection is tested as it runs
            print(f"ERROR: [Errno {e.errno}] error while attempting to bind on address "
                  f"({a.host!r}, {a.port}): {e.strerror.lower()}", flush=True)
            for w in workers:
                w.terminate()
            sys.exit(1)
        print(f"fake vLLM: serving {a.served_model_name} on {stub.base_url}", flush=True)
        await asyncio.Event().wait()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    asyncio.run(serve())


if __name__ == "__main__":
    main()
