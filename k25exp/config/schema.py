"""Structured-config schemas of what every job has: the model, the hardware, tracking, the
server and the root (K25Config). Each experiment's schema is its own unit, in
k25exp.config.experiments.

Hydra checks keys and types against these dataclasses at compose time, so a typo'd key or
a string where an int belongs fails before anything runs. Value checks that need several
fields at once (TP dividing the world size, dtypes a backend can reduce) live in
``k25exp.config.validate`` and in each experiment schema's ``check``.
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
    # One tensor-parallel rank as the model a device runs: N = the shapes one of N TP ranks
    # runs (heads, expert/dense intermediate and vocab / N; MLA's low-rank projections, the
    # router and every layer whole, as vLLM replicates them), served at TP 1. The fields above
    # stay the whole model's; k25exp.model.tp_rank derives the rank (model folder, GEMM
    # shapes, weight memory). null = the whole model.
    tp_rank_of: Optional[int] = None


@dataclass
class HardwareConfig:
    """One box (or several identical ones) and how its devices talk.

    Bandwidths are per device and per direction, in GB/s (1e9 B/s); compute in TFLOP/s.
    """

    name: str = MISSING
    device: str = MISSING  # cpu | cuda
    # What the devices should report (each found device's name must contain it; "" or, on a
    # CPU box, "cpu" matches any). A mismatch is a warning and the run's tags
    # device_found / device_name_match / device_warning.
    device_name: str = ""
    backend: str = MISSING  # gloo | nccl
    nproc_per_node: int = MISSING  # ranks (GPUs) per node
    nnodes: int = 1
    node_rank: int = 0
    # Multi-node: torchrun's static rendezvous. Every node runs the same k25exp command with
    # its own node_rank (under SLURM: $SLURM_NODEID); rdzv_endpoint = host:port of node 0.
    # Node 0 (ranks 0 … nproc_per_node−1) gathers every rank's samples and logs the run.
    # Null endpoint on one node = torchrun --standalone.
    rdzv_endpoint: Optional[str] = None
    world_size: int = MISSING  # interpolated: nnodes × nproc_per_node
    tp: int = MISSING
    interconnect: str = MISSING  # pcie | nvlink | shm
    link_gbps: float = MISSING
    mem_bandwidth_gbps: float = MISSING
    peak_bf16_tflops: float = MISSING
    # Where each constant above comes from: "nominal: <datasheet, spec, a figure measured once
    # elsewhere>" or "measured: <how, on which box>". Figures divided by one (% of link,
    # roofline %) carry it in their caption and tag (k25exp.nominal); unset = nominal.
    link_gbps_source: str = "nominal"
    mem_bandwidth_gbps_source: str = "nominal"
    peak_bf16_tflops_source: str = "nominal"
    # false = NCCL's peer-to-peer transport off (NCCL_P2P_DISABLE=1 in every rank): on an
    # NVLink box, the closest it gets to GPUs that talk through host memory over PCIe. A
    # field rather than an env entry so the two runs differ in one logged param.
    nccl_p2p: bool = True
    # Extra environment for the collective workers, e.g. {NCCL_DEBUG: INFO}.
    env: Dict[str, str] = field(default_factory=dict)
    # CPU build of vLLM: the highest ISA its kernel choice may see (avx2 | avx512 |
    # avx512_bf16; null = what the CPU has, vLLM's own choice). avx2 on an AVX-512 machine runs
    # the path an AVX2-only CPU takes (no shared-memory all-reduce: gloo) in the server, the
    # collective ranks and the GEMM job alike. Tag vllm.cpu_isa says what each loaded.
    vllm_cpu_isa: Optional[str] = None
    # CUDA boxes: NVML sampled every this many ms while a job measures (clocks, power,
    # utilisation, memory, temperature; throttling and shared-GPU flags), the first
    # nproc_per_node visible GPUs (k25exp.tracking.telemetry). 0 = off. Unused on CPU.
    telemetry_period_ms: float = 100.0


@dataclass
class TrackingConfig:
    backend: str = "mlflow"  # mlflow | offline | none
    uri: Optional[str] = None
    # A remote server that does not answer /health within this time → offline run folder
    # (when offline_fallback), uploaded later with `k25exp sync`.
    connect_timeout_s: float = 5.0
    offline_fallback: bool = True
    experiment_name: str = "k25exp"
    # Where artifacts go for a local (sqlite/file) store; ignored for a remote server.
    artifact_root: Optional[str] = None
    campaign: Optional[str] = None  # tag shared by all runs of one campaign
    run_name: Optional[str] = None
    # Env names redacted wherever k25exp writes them (MLflow params, resolved config, server
    # log header), besides any name containing TOKEN, KEY, SECRET or PASSWORD (k25exp.redact).
    redact: List[str] = field(default_factory=list)
    # A job killed hard leaves its run RUNNING: every command that opens the store (and
    # `k25exp recover`) ends such runs KILLED with what their folder holds. A run is dead when
    # its pid on this host is gone (or reused); on another host, when its heartbeat tag,
    # refreshed every heartbeat_s (0 = never), is older than stale_after_s.
    heartbeat_s: float = 30.0
    stale_after_s: float = 900.0
    recover_on_open: bool = True


@dataclass
class PathsConfig:
    root: str = MISSING
    outputs: str = MISSING



@dataclass
class ServerConfig:
    """The vLLM server the serving experiments talk to (conf/server/).

    kind `vllm` launches one from these settings (argument list, own process group) and
    keeps it while the settings are unchanged; kind `endpoint` attaches to a server someone
    else runs at `base_url`. The API key is read from the environment variable named by
    `api_key_env` and never logged.
    """

    kind: str = MISSING  # vllm | endpoint
    base_url: str = MISSING  # vllm: interpolated from host and port
    served_model_name: str = MISSING
    api_key_env: Optional[str] = None
    # Tokenizer used to build prompts of exact token lengths; null = the model folder.
    tokenizer: Optional[str] = None
    trust_remote_code: bool = False
    ready_timeout_s: float = 900.0  # launch: until /health and /v1/models answer
    # -- kind vllm only --
    # Checkpoint folder; null = the `model` group's folder, generated into model_cache on first
    # use (k25exp.serving.tiny_model): random bf16 weights, or a quantized model's config alone
    # (then load_format must be dummy).
    model_path: Optional[str] = None
    # vLLM's --load-format; null = its default (auto). dummy = random weights, nothing read.
    load_format: Optional[str] = None
    model_cache: str = MISSING
    host: str = "127.0.0.1"
    # vLLM's dev endpoints (/reset_prefix_cache, /start_profile, ...) answer without the API
    # key, so they are enabled only on a loopback bind, unless this is true (and an API key set).
    allow_dev_endpoints_on_network: bool = False
    port: int = 8000  # 0 = any free port
    python: Optional[str] = None  # interpreter that runs vLLM; null = this one
    entrypoint: List[str] = field(default_factory=lambda: ["-m", "vllm.entrypoints.openai.api_server"])
    tp: int = MISSING
    dtype: str = MISSING
    max_model_len: int = 4096
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    gpu_memory_utilization: Optional[float] = None  # GPU builds
    # GPU builds: the KV cache's size (--kv-cache-memory-bytes) instead of what is left under
    # gpu_memory_utilization. vLLM then skips its start-up memory profiling, CUDA-graph memory
    # estimate included (in 0.26 its longest part of a cold start after torch.compile);
    # the step itself is unchanged.
    kv_cache_memory_gib: Optional[float] = None
    enforce_eager: bool = False
    enable_prefix_caching: Optional[bool] = None  # null = vLLM's default
    seed: int = 0
    # CPU build: VLLM_CPU_KVCACHE_SPACE (GiB) and VLLM_CPU_OMP_THREADS_BIND; "split" gives each
    # TP rank an equal share of this process's CPUs ("0|1" on two cores). Set only when
    # hardware.device is cpu.
    cpu_kvcache_space_gib: Optional[int] = None
    cpu_threads_bind: Optional[str] = "split"
    env: Dict[str, str] = field(default_factory=dict)
    extra_args: List[str] = field(default_factory=list)
    # vLLM's --profiler-config (JSON object), e.g. {profiler: torch, torch_profiler_dir: DIR}.
    profiler: Optional[Dict[str, Any]] = None
    log_dir: str = MISSING
    stop_timeout_s: float = 30.0


@dataclass
class K25Config:
    """The root: what `python -m k25exp` composes."""

    model: ModelConfig = MISSING
    hardware: HardwareConfig = MISSING
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    experiment: Any = None
    seed: int = 0
