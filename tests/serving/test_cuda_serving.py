"""vLLM's CUDA build serving the embedded default's model with torch.compile and CUDA graphs,
and one macro level measured against it (`pytest -m cuda` on a GPU box; skipped elsewhere).

The same model as the CPU campaign (tiny_kimi: Kimi's MLA head dims, which vLLM's CUDA MLA
backends accept), generated into the test's folder. Every figure is recomputed by hand from
requests.jsonl, and the client's TPOT is held against the server's own histogram."""

from __future__ import annotations

import orjson
import pytest

from k25exp.config.validate import to_typed
from k25exp.runners import runner_for
from k25exp.serving import server
from k25exp.stats import mean, percentile
from k25exp.tracking import MemoryRecorder
from tests.conftest import compose_cfg

pytestmark = [pytest.mark.cuda, pytest.mark.vllm, pytest.mark.e2e]


def _vllm_cuda() -> str | None:
    """Why vLLM's CUDA build cannot serve here (None: it can)."""
    try:
        from vllm.platforms import current_platform
    except Exception as e:
        return f"vLLM is not importable ({type(e).__name__}: {e})"
    return None if current_platform.is_cuda() else f"vLLM here is the {current_platform.device_type} build"


def test_a_macro_level_served_with_cuda_graphs(tmp_path):
    why = _vllm_cuda()
    if why:
        pytest.skip(f"needs vLLM's CUDA build: {why}")
    out = tmp_path / "run"
    cfg = to_typed(compose_cfg(
        "experiment=macro", "hardware=h200_x1", "hardware.device_name=", "model=tiny_kimi",
        "server.enforce_eager=false", "server.port=0", "server.kv_cache_memory_gib=4",
        f"server.model_cache={tmp_path / 'models'}", f"server.log_dir={tmp_path / 'logs'}",
        "experiment.input_tokens=32", "experiment.output_tokens=32",
        "experiment.concurrency=[1,4]", "experiment.single_stream_requests=4",
        "experiment.warmup=2", "experiment.rounds=2", "experiment.min_requests=8",
        "experiment.progress=false", f"paths.outputs={tmp_path}"))
    rec = MemoryRecorder()
    try:
        runner_for(cfg.experiment)(cfg, out, rec)
    finally:
        server.stop_all()
    # torch.compile and CUDA graphs, as the server logged its own config
    assert rec.tags["vllm.enforce_eager"] == "false"
    assert rec.tags["vllm.cudagraph_mode"] not in ("NONE", "unknown (not in the server log)")
    recs = [orjson.loads(x) for x in (out / "requests.jsonl").read_bytes().splitlines()]
    sweep = [r for r in recs if r["phase"] == "sweep"]
    assert sweep and all(r["usage"]["completion_tokens"] == 32 == sum(r["chunk_tokens"]) for r in sweep)
    for c in (1, 4):
        rs = [r for r in sweep if r["level"] == c]
        tpot = [(r["chunk_s"][-1] - r["chunk_s"][0]) / 31 * 1e3 for r in rs]
        assert rec.latest("tpot_ms_p50")[c] == pytest.approx(percentile(tpot, 50))
        assert rec.latest("tpot_ms_mean")[c] == pytest.approx(mean(tpot))
        # the server's histogram of the same requests: within a quarter of the client's figure
        # (a GPU step of a 3-layer model is ~1.4 ms, so the client's own cost shows)
        assert rec.latest("server_tpot_ms_mean")[c] == pytest.approx(mean(tpot), rel=0.25)
