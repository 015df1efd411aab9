"""experiment=spec_profile: its checks, and one capture of the real CPU build's speculative
server (n-gram, synthetic α) whose cycle splits into vLLM's scopes."""

from __future__ import annotations

import pytest

from k25exp.config.validate import ConfigError, to_typed
from tests.conftest import compose_cfg


def test_one_alpha_and_known_baselines():
    cfg = compose_cfg("experiment=spec_profile", "experiment.alphas=[0.5,0.9]",
                      "experiment.baselines=[baseline_sync,slow]")
    with pytest.raises(ConfigError) as e:
        to_typed(cfg, gpu_count=lambda: 0)
    msg = str(e.value)
    assert "experiment.alphas=[0.5, 0.9]: experiment=spec_profile profiles one acceptance" in msg
    assert "experiment.baselines=['baseline_sync', 'slow']: expected a subset of" in msg


def test_the_speculative_settings_are_checked_as_spec_decode_checks_them():
    cfg = compose_cfg("experiment=spec_profile", "experiment.num_speculative_tokens=0",
                      "experiment.alphas=[1.5]", "server.extra_args=[--speculative-config,{}]")
    with pytest.raises(ConfigError) as e:
        to_typed(cfg, gpu_count=lambda: 0)
    msg = str(e.value)
    assert "experiment.num_speculative_tokens=0: expected >= 1" in msg
    assert "experiment.alphas=[1.5]: each α must be in [0, 1], not [1.5]" in msg
    assert "server.extra_args has --speculative-config: experiment=spec_profile builds it" in msg


@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_the_speculative_cycle_splits_into_scopes_that_add_up(k25):
    alpha, k = 0.5, 2
    r = k25("experiment=spec_profile", "spec=ngram", "debug=quick", "server.port=0",
            "server.enforce_eager=true", f"experiment.num_speculative_tokens={k}",
            f"experiment.alphas=[{alpha}]", "experiment.baselines=[]", "experiment.concurrency=2",
            "experiment.requests=4", "experiment.output_tokens=24", "experiment.limit_points=null",
            timeout=1100)
    assert r.returncode == 0, r.stderr[-3000:]
    from mlflow.tracking import MlflowClient

    c = MlflowClient(r.uri)
    (run,) = c.search_runs([e.experiment_id for e in c.search_experiments()])
    m, tags = run.data.metrics, run.data.tags
    assert tags["spec.sampler"] and tags["spec.alphas"] == "0.5"
    # E(α, k) by hand: 1 + α + α² = 1.75 tokens per step at α = 0.5, k = 2
    assert m["spec_expected_tokens_per_step"] == pytest.approx(1.75)
    parts = ("verify", "sample", "draft", "bookkeep", "other", "gap")
    assert sum(m[f"phase_{p}_ms"] for p in parts) == pytest.approx(m["phase_cycle_ms"], rel=1e-9)
    # the n-gram drafter and the rejection sampler ran in their own scopes, outside the step
    assert m["phase_draft_ms"] > 0 and m["phase_sample_ms"] > 0 and m["phase_cycles"] >= 1
    assert not [key for key in m if key.startswith(("baseline/", "gap_"))]  # no baseline asked
