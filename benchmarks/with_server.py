"""Runs a command against the vLLM server a k25exp config describes, then stops the server.

    python benchmarks/with_server.py OVERRIDE ... -- COMMAND ...

The server is launched as a k25exp job would launch it (k25exp.serving: the same argument
list, environment, model folder and routing), so a benchmark that attaches to an endpoint
(vLLM's own `bench serve`, benchmarks/client_vs_vllm_bench.py) measures the engine k25exp's
jobs measure. COMMAND gets K25_BASE_URL, K25_MODEL (the served model name) and
K25_MODEL_PATH (the model folder, for a tokenizer) in its environment; `{base_url}`,
`{model}` and `{model_path}` in its arguments are replaced too. Exit status: COMMAND's.
"""

from __future__ import annotations

import os
import subprocess
import sys

from hydra import compose, initialize_config_dir

from k25exp.config import register_configs
from k25exp.config.store import project_root
from k25exp.config.validate import to_typed
from k25exp.serving import server


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    cut = argv.index("--")
    overrides, command = argv[:cut], argv[cut + 1:]
    register_configs()
    with initialize_config_dir(config_dir=str(project_root() / "conf"), version_base="1.3"):
        cfg = to_typed(compose("config", overrides=["experiment=macro", *overrides]))
    conn = server.connect(cfg.server, cfg.model, cfg.seed, cfg.hardware.device,
                          redact=cfg.tracking.redact, cpu_isa=cfg.hardware.vllm_cpu_isa)
    try:
        facts = {"base_url": conn.base_url, "model": conn.model,
                 "model_path": conn.info.get("model_path", "")}
        print(f"with_server: {conn.base_url} serving {conn.model} (started in "
              f"{conn.start_s or 0:.0f} s)", flush=True)
        env = {**os.environ, "K25_BASE_URL": facts["base_url"], "K25_MODEL": facts["model"],
               "K25_MODEL_PATH": facts["model_path"]}
        return subprocess.call([a.format(**facts) for a in command], env=env)
    finally:
        server.stop_all()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
