"""Every experiment composes from the real conf/, and derived sizes follow the model."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from k25exp.config.experiments import EXPERIMENT_SCHEMAS
from k25exp.config.schema import K25Config
from k25exp.config.store import project_root
from k25exp.config.validate import to_typed
from tests.conftest import compose_cfg

EXPERIMENTS = sorted(p.stem for p in (project_root() / "conf" / "experiment").glob("*.yaml"))
HARDWARE = sorted(p.stem for p in (project_root() / "conf" / "hardware").glob("*.yaml"))


def test_every_schema_has_an_experiment_file():
    assert set(EXPERIMENT_SCHEMAS) <= set(EXPERIMENTS)


@pytest.mark.parametrize("name", EXPERIMENTS)
@pytest.mark.parametrize("debug", [None, "quick"])
def test_experiment_composes_to_its_schema(name, debug):
    overrides = [f"experiment={name}"] + ([f"debug={debug}"] if debug else [])
    schema = EXPERIMENT_SCHEMAS[compose_cfg(*overrides).experiment.name]
    overrides += schema.example_overrides  # what it cannot run without, as its schema says
    typed = to_typed(compose_cfg(*overrides), gpu_count=lambda: 0)
    assert isinstance(typed, K25Config)
    assert isinstance(typed.experiment, EXPERIMENT_SCHEMAS[typed.experiment.name])
    assert name.startswith(typed.experiment.name)  # gemm_full is a gemm
    if debug:  # each experiment's own count shrunk, under its own name (its debug file's)
        quick = project_root() / "conf" / "debug_experiment" / f"quick_{typed.experiment.name}.yaml"
        if quick.exists():
            for key, value in OmegaConf.load(quick).get("experiment", {}).items():
                assert getattr(typed.experiment, key) == value, key
        assert typed.experiment.warmup == 1 and typed.experiment.limit_points == 3


@pytest.mark.parametrize("hw", HARDWARE)
def test_hardware_composes(hw):
    cfg = compose_cfg("experiment=nccl_burst", f"hardware={hw}")
    t = OmegaConf.to_object(cfg)
    assert t.hardware.world_size == t.hardware.nnodes * t.hardware.nproc_per_node
    assert t.hardware.world_size % t.hardware.tp == 0
    assert t.hardware.link_gbps > 0 and t.hardware.mem_bandwidth_gbps > 0
    # every constant says where it comes from; none of the shipped ones was measured on the
    # machine a run lands on
    for x in ("link_gbps", "mem_bandwidth_gbps", "peak_bf16_tflops"):
        assert getattr(t.hardware, f"{x}_source").startswith("nominal: "), (hw, x)


def test_cpu_local_says_its_link_and_peak_are_not_what_they_are_named():
    hw = OmegaConf.to_object(compose_cfg("experiment=nccl_burst", "hardware=cpu_local")).hardware
    assert hw.interconnect == "shm" and "loopback TCP" in hw.link_gbps_source
    assert "fp32" in hw.peak_bf16_tflops_source and "bf16" in hw.peak_bf16_tflops_source


def test_kimi_decode_message_is_derived():
    e = OmegaConf.to_object(compose_cfg("experiment=nccl_burst")).experiment
    assert (e.message_bytes, e.ops_per_step) == (14336, None)  # 7168 × 2 B; null = the step's list
    assert e.communicator in ("torch", "vllm") and e.logits_op == "all_gather"
    e8 = OmegaConf.to_object(compose_cfg("experiment=nccl_burst", "experiment.tokens=8")).experiment
    assert e8.message_bytes == 8 * 14336


def test_derived_sizes_follow_model_and_dtype_overrides():
    e = OmegaConf.to_object(compose_cfg("experiment=nccl_burst", "model=tiny_kimi")).experiment
    assert e.message_bytes == 512 * 2
    e = OmegaConf.to_object(compose_cfg("experiment=nccl_burst", "experiment.dtype=float32")).experiment
    assert e.message_bytes == 7168 * 4
    a = OmegaConf.to_object(compose_cfg("experiment=all_to_all", "model.num_experts_per_tok=4")).experiment
    assert (a.top_k, a.hidden_size) == (4, 7168)


def test_tracking_uri_follows_env_then_override(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = compose_cfg("experiment=nccl_burst", f"paths.outputs={tmp_path}")
    assert cfg.tracking.uri == f"sqlite:///{tmp_path}/mlflow.db"
    assert cfg.tracking.artifact_root == f"{tmp_path}/mlartifacts"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert compose_cfg("experiment=nccl_burst").tracking.uri == "http://127.0.0.1:5999"
    assert compose_cfg("experiment=nccl_burst", "tracking.uri=sqlite:////x/y.db").tracking.uri == "sqlite:////x/y.db"


def test_paths_are_absolute_from_project_root():
    cfg = compose_cfg("experiment=nccl_burst")
    assert cfg.paths.root == str(project_root())
    assert cfg.paths.outputs.startswith("/")


def test_gemm_threads_default_to_what_one_server_rank_gets():
    import os

    cpu = to_typed(compose_cfg("experiment=gemm"), gpu_count=lambda: 0)
    assert cpu.hardware.tp == 2 and cpu.experiment.threads == max(1, len(os.sched_getaffinity(0)) // 2)
    gpu = to_typed(compose_cfg("experiment=gemm", "hardware=h200_x1"), gpu_count=lambda: 1)
    assert gpu.experiment.threads is None  # torch's default on CUDA
    assert to_typed(compose_cfg("experiment=gemm", "experiment.threads=null"),
                    gpu_count=lambda: 0).experiment.threads is None
