"""One real vLLM CPU server for the tests of this package: started once, shared, stopped after
the package's last test (so it neither holds memory nor competes for cores afterwards).

The macro runner finds it through the server registry (same launch key), exactly as the jobs
of a multirun do, so every in-process test reuses it instead of paying another start.
"""

from __future__ import annotations

import os

import pytest

from k25exp.config.validate import to_typed
from k25exp.serving import server
from tests.conftest import compose_cfg
from tests.serving.helpers import orphans

API_KEY_ENV = "K25EXP_TEST_API_KEY"
SECRET = "sk-k25exp-test-7f3a9c"


@pytest.fixture(scope="package")
def vllm(tmp_path_factory):
    """{'overrides': the server's config overrides, 'conn': its Connection, 'cfg': typed}."""
    os.environ[API_KEY_ENV] = SECRET
    logs = tmp_path_factory.mktemp("vllm")
    overrides = ["experiment=macro", f"server.port={server.free_port()}",
                 f"server.api_key_env={API_KEY_ENV}", f"server.log_dir={logs}",
                 "server.max_model_len=512", "server.enforce_eager=true",  # starts 12 s sooner
                 # TP 1: two processes to start instead of four, and no TP workers busy-polling
                 # the cores the client needs. The TP 2 launch (split CPUs, a worker per rank,
                 # the tree stopped whole) is checked on the session campaign's servers.
                 "server.tp=1"]
    cfg = to_typed(compose_cfg(*overrides), gpu_count=lambda: 0)
    conn = server.connect(cfg.server, cfg.model, cfg.seed, cfg.hardware.device)
    yield {"overrides": overrides, "conn": conn, "cfg": cfg}
    server.stop_all()
    left = orphans()
    assert not left, f"vLLM processes left after the session server stopped: {left}"
