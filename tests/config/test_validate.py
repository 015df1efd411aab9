"""Bad configs fail before anything runs, naming the key and what was expected."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException

from k25exp.config.validate import ConfigError, to_typed
from tests.conftest import compose_cfg


def typed(*overrides: str, gpus: int = 0):
    return to_typed(compose_cfg(*overrides), gpu_count=lambda: gpus)


def test_unknown_group_option_lists_the_valid_ones():
    with pytest.raises(MissingConfigException) as e:
        compose_cfg("experiment=nccl_bursts")
    assert "experiment/nccl_bursts" in str(e.value) and "allreduce_sweep" in str(e.value)
    with pytest.raises(MissingConfigException, match="hardware/dgx"):
        compose_cfg("experiment=nccl_burst", "hardware=dgx")


@pytest.mark.parametrize("override", ["experiment.tokenz=3", "model.hidden=5"])
def test_unknown_key(override):
    with pytest.raises(ConfigCompositionException) as e:
        compose_cfg("experiment=nccl_burst", override)
    assert override.lstrip("+").split("=")[0] in str(e.value) + str(e.value.__cause__)


def test_added_key_is_rejected_not_dropped():
    # `+key=` gets past Hydra's struct check; OmegaConf would then drop the key silently.
    with pytest.raises(ConfigError, match=r"experiment.tokenz: unknown key for NcclBurstConfig"):
        typed("experiment=nccl_burst", "+experiment.tokenz=3")


def test_wrong_type_names_key_and_value():
    with pytest.raises(ConfigCompositionException) as e:
        compose_cfg("experiment=nccl_burst", "experiment.tokens=many")
    msg = str(e.value) + str(e.value.__cause__)
    assert "experiment.tokens" in msg and "many" in msg


def test_no_experiment_selected():
    with pytest.raises(ConfigError, match="experiment=NAME"):
        typed()


def test_tp_must_divide_world_size():
    with pytest.raises(ConfigError, match=r"hardware.tp=3 must divide hardware.world_size=2"):
        typed("experiment=nccl_burst", "hardware.tp=3")


@pytest.mark.parametrize("override,key", [
    ("experiment.tokens=0", "experiment.tokens=0"),
    ("experiment.bursts=-1", "experiment.bursts=-1"),
    ("experiment.ops_per_step=0", "experiment.ops_per_step=0"),
    ("hardware.nproc_per_node=0", "hardware.nproc_per_node=0"),
])
def test_non_positive_sizes_and_counts(override, key):
    with pytest.raises(ConfigError) as e:
        typed("experiment=nccl_burst", override)
    assert key in str(e.value) and "expected a positive number" in str(e.value)


def test_sweep_bounds_and_token_lists():
    with pytest.raises(ConfigError, match="experiment.min_bytes=1024 > experiment.max_bytes=8"):
        typed("experiment=allreduce_sweep", "experiment.min_bytes=1024", "experiment.max_bytes=8")
    with pytest.raises(ConfigError, match="experiment.factor=1"):
        typed("experiment=allreduce_sweep", "experiment.factor=1")
    with pytest.raises(ConfigError, match="tokens_per_gpu contains -4"):
        typed("experiment=all_to_all", "experiment.tokens_per_gpu=[1,-4]")
    # 1 × top-1 × hidden 7 elements cannot split over 2 ranks
    with pytest.raises(ConfigError, match="does not split evenly over world_size 2"):
        typed("experiment=all_to_all", "model.hidden_size=7", "model.num_experts_per_tok=1")


def test_dtype_the_backend_cannot_reduce():
    with pytest.raises(ConfigError) as e:
        typed("experiment=nccl_burst", "experiment.dtype=float8_e4m3fn")
    assert "experiment.dtype='float8_e4m3fn' cannot be reduced by backend 'gloo'" in str(e.value)
    assert "bfloat16" in str(e.value)  # says what would work
    with pytest.raises(ConfigError, match="unknown dtype 'bf17'"):
        typed("experiment=nccl_burst", "experiment.dtype=bf17")


def test_nccl_needs_enough_gpus():
    with pytest.raises(ConfigError) as e:
        typed("experiment=nccl_burst", "hardware=rtx_pro_6000_x8_pcie", gpus=1)
    assert "needs 8 GPUs on this node, found 1" in str(e.value)
    assert typed("experiment=nccl_burst", "hardware=rtx_pro_6000_x8_pcie", gpus=8)
    with pytest.raises(ConfigError, match="backend='nccl' needs hardware.device='cuda'"):
        typed("experiment=nccl_burst", "hardware.backend=nccl")


def test_all_problems_reported_at_once():
    with pytest.raises(ConfigError) as e:
        typed("experiment=nccl_burst", "hardware.tp=3", "experiment.tokens=0")
    assert "hardware.tp=3" in str(e.value) and "experiment.tokens=0" in str(e.value)


def test_multinode_needs_rendezvous_endpoint():
    with pytest.raises(ConfigError, match="hardware.rdzv_endpoint=None: hardware.nnodes=2 > 1 needs host:port"):
        typed("experiment=nccl_burst", "hardware.nnodes=2")
    t = typed("experiment=nccl_burst", "hardware.nnodes=2", "hardware.rdzv_endpoint=node0:29500")
    assert t.hardware.world_size == 4


def test_cli_reports_config_error_without_traceback(k25):
    r = k25("experiment=nccl_burst", "hardware.tp=3", seed=False)
    assert r.returncode == 2
    assert "hardware.tp=3 must divide hardware.world_size=2" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (r.outputs / "mlflow.db").exists()  # nothing ran, nothing was recorded


def test_p2p_off_is_a_hardware_field_that_reaches_every_rank():
    from omegaconf import OmegaConf

    from k25exp.runners.collective import rank_env

    on = to_typed(compose_cfg("experiment=nccl_burst", "hardware=h200_x8_nvlink"), gpu_count=lambda: 8)
    off = to_typed(compose_cfg("experiment=nccl_burst", "hardware=h200_x8_nvlink", "hardware.nccl_p2p=false",
                               "+hardware.env.NCCL_DEBUG=INFO"), gpu_count=lambda: 8)
    assert "NCCL_P2P_DISABLE" not in rank_env(on.hardware)
    assert rank_env(off.hardware) == {"NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "INFO"}
    # the two configs differ in that one field (what MLflow logs as params)
    a, b = (OmegaConf.to_container(OmegaConf.structured(x.hardware)) for x in (on, off))
    assert {k for k in a if a[k] != b[k]} == {"nccl_p2p", "env"}
    with pytest.raises(ConfigError, match="hardware.nccl_p2p=false turns off NCCL.*'gloo' is not NCCL"):
        to_typed(compose_cfg("experiment=nccl_burst", "hardware.nccl_p2p=false"))
    with pytest.raises(ConfigError, match="set hardware.nccl_p2p=false instead"):
        to_typed(compose_cfg("experiment=nccl_burst", "hardware=h200_x8_nvlink",
                             "+hardware.env.NCCL_P2P_DISABLE=1"), gpu_count=lambda: 8)


def test_vllm_communicator_is_one_node_only_and_the_default_follows():
    two = ("experiment=nccl_burst", "hardware.nnodes=2", "hardware.nproc_per_node=1",
           "hardware.rdzv_endpoint=127.0.0.1:29500")
    assert typed(*two).experiment.communicator == "torch"  # the default across nodes
    with pytest.raises(ConfigError, match=r"experiment.communicator=vllm with hardware.nnodes=2"):
        typed(*two, "experiment.communicator=vllm")
    with pytest.raises(ConfigError, match=r"experiment.communicator='nccl': expected one of torch, vllm"):
        typed("experiment=nccl_burst", "experiment.communicator=nccl")


def test_a_hardware_constant_source_is_nominal_or_measured():
    with pytest.raises(ConfigError, match=r"hardware.link_gbps_source='datasheet': expected "
                                          r"'nominal: \.\.\.' or 'measured: \.\.\.'"):
        typed("experiment=nccl_burst", "hardware.link_gbps_source=datasheet")
    t = typed("experiment=nccl_burst", "hardware.link_gbps_source='measured: allreduce plateau'")
    assert t.hardware.link_gbps_source == "measured: allreduce plateau"
