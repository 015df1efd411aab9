"""Structured-config schemas: the types every YAML file in conf/ extends.

Hydra checks keys and types against these dataclasses at compose time, so a typo'd key or
a string where an int belongs fails before anything runs. Value checks that need several
fields at once (TP dividing the world size, dtypes a backend can reduce) live in
``k25exp.config.validate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING


@dataclass
class QuantConfig:
    """Weight quantization of the checkpoint (``none`` for bf16 weights)."""

    method: str = "none"  # none | w4a16
    bits: int = 16
    group_size: int = 0  # 0 = not grouped
    symmetric: bool = True
    scale_dtype: str = "bfloat16"
    format: str = ""  # e.g. compressed-tensors pack-quantized


@dataclass
class ModelConfig:
    """A DeepseekV3-style MoE text backbone (field names follow its config.json)."""

    name: str = MISSING
    architecture: str = "DeepseekV3ForCausalLM"
    hidden_size: int = MISSING
    num_hidden_layers: int = MISSING
    first_k_dense_replace: int = 0
    n_routed_experts: int = MISSING
    num_experts_per_tok: int = MISSING
    n_shared_experts: int = 1
    moe_intermediate_size: int = MISSING
    intermediate_size: int = MISSING
    num_attention_heads: int = MISSING
    num_key_value_heads: int = MISSING
    q_lora_rank: int = MISSING
    kv_lora_rank: int = MISSING
    qk_nope_head_dim: int = MISSING
    qk_rope_head_dim: int = MISSING
    v_head_dim: int = MISSING
    vocab_size: int = MISSING
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    topk_method: str = "noaux_tc"
    scoring_func: str = "sigmoid"
    max_position_embeddings: int = 4096
    # Activation dtype: what flows through the AllReduce and the GEMM inputs.
    dtype: str = "bfloat16"
    dtype_bytes: int = MISSING  # interpolated from dtype in model YAML
    quant: QuantConfig = field(default_factory=QuantConfig)


@dataclass
class HardwareConfig:
    """One box (or several identical ones) and how its devices talk.

    Bandwidths are per device and per direction, in GB/s (1e9 B/s); compute in TFLOP/s.
    """

    name: str = MISSING
    device: str = MISSING  # cpu | cuda
    device_name: str = ""  # what the box should report (checked against the real one in tags)
    backend: str = MISSING  # gloo | nccl
    nproc_per_node: int = MISSING  # ranks (GPUs) per node
    nnodes: int = 1
    node_rank: int = 0
    # Multi-node rendezvous; null endpoint = single node (torchrun --standalone).
    rdzv_endpoint: Optional[str] = None
    rdzv_backend: str = "c10d"
    rdzv_id: str = "k25exp"
    world_size: int = MISSING  # interpolated: nnodes × nproc_per_node
    tp: int = MISSING
    interconnect: str = MISSING  # pcie | nvlink | shm
    link_gbps: float = MISSING
    mem_bandwidth_gbps: float = MISSING
    peak_bf16_tflops: float = MISSING
    # Extra environment for the collective workers, e.g. {NCCL_P2P_DISABLE: "1"}.
    env: Dict[str, str] = field(default_factory=dict)


@dataclass
class TrackingConfig:
    backend: str = "mlflow"  # mlflow | none
    uri: Optional[str] = None
    experiment_name: str = "k25exp"
    # Where artifacts go for a local (sqlite/file) store; ignored for a remote server.
    artifact_root: Optional[str] = None
    campaign: Optional[str] = None  # tag shared by all runs of one campaign
    run_name: Optional[str] = None


@dataclass
class PathsConfig:
    root: str = MISSING
    outputs: str = MISSING


@dataclass
class FaultConfig:
    """Test hooks that exercise failure handling on a real process group.

    kill_rank dies (os._exit) at sweep point `at_point`; corrupt_rank perturbs one element
    of its result before the correctness check, as a broken transport would.
    """

    kill_rank: Optional[int] = None
    at_point: int = 0
    corrupt_rank: Optional[int] = None


@dataclass
class CollectiveExperiment:
    """Fields every collective experiment shares."""

    name: str = MISSING
    dtype: str = "${model.dtype}"
    warmup: int = 5
    iters: int = 20
    check: bool = True
    # Blocking-latency mode: ops timed one at a time (barrier, op, sync). Off = queued only.
    blocking: bool = True
    # CUDA graph capture of the burst (CUDA only; ignored on CPU with a note in the run).
    graph: bool = True
    timeout_s: float = 600.0
    # Measure only the first N sweep points (the debug group uses it); null = all.
    limit_points: Optional[int] = None
    fault: FaultConfig = field(default_factory=FaultConfig)


@dataclass
class NcclBurstConfig(CollectiveExperiment):
    """Bursts of AllReduces of the decode message, as one decode step issues them."""

    name: str = "nccl_burst"
    tokens: int = 1  # tokens in the batch: the message is hidden × dtype bytes × tokens
    message_bytes: int = MISSING  # interpolated
    ops_per_step: int = MISSING  # interpolated: 2 × num_hidden_layers
    # Measured decode step time (TPOT) of the real server, ms; gives decode_share when set.
    reference_tpot_ms: Optional[float] = None


@dataclass
class AllReduceSweepConfig(CollectiveExperiment):
    """nccl-tests style AllReduce sweep over message sizes."""

    name: str = "allreduce_sweep"
    min_bytes: int = 8
    max_bytes: int = 256 * 1024 * 1024
    factor: int = 2
    repeats: int = 3  # timed bursts of `iters` queued ops per size


@dataclass
class AllToAllConfig(CollectiveExperiment):
    """Expert-parallel dispatch: All-to-All of top-k token activations."""

    name: str = "all_to_all"
    tokens_per_gpu: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])
    top_k: int = "${model.num_experts_per_tok}"  # type: ignore[assignment]
    hidden_size: int = "${model.hidden_size}"  # type: ignore[assignment]
    repeats: int = 3
    # Knee: smallest tokens/GPU whose latency exceeds knee_factor × the flat baseline, the
    # median latency of the first knee_baseline_points points.
    knee_factor: float = 1.5
    knee_baseline_points: int = 3


@dataclass
class K25Config:
    """The root: what `python -m k25exp` composes."""

    model: ModelConfig = MISSING
    hardware: HardwareConfig = MISSING
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    experiment: Any = None
    seed: int = 0


# Experiment schemas by the name used in conf/experiment/*.yaml defaults lists.
EXPERIMENT_SCHEMAS: dict[str, type] = {
    "nccl_burst": NcclBurstConfig,
    "allreduce_sweep": AllReduceSweepConfig,
    "all_to_all": AllToAllConfig,
}
