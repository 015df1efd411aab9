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
    bits: int = 16  # bits per weight (4 for W4A16)
    group_size: int = 0  # 0 = not grouped
    symmetric: bool = True  # no zero point
    scale_dtype: str = "bfloat16"  # dtype of the per-group scales
    format: str = ""  # e.g. compressed-tensors pack-quantized


@dataclass
class ModelConfig:
    """A DeepseekV3-style MoE text backbone (field names follow its config.json)."""

    name: str = MISSING  # the model's name (conf/model/NAME.yaml)
    architecture: str = "DeepseekV3ForCausalLM"  # config.json's architectures[0]
    # The text backbone's sizes, as its config.json names them.
    hidden_size: int = MISSING  # width of the residual stream (the all-reduce's elements per token)
    num_hidden_layers: int = MISSING  # decoder layers
    first_k_dense_replace: int = 0  # the first k layers have a dense MLP, the rest MoE
    n_routed_experts: int = MISSING  # routed experts per MoE layer
    num_experts_per_tok: int = MISSING  # top-k: routed experts each token goes to
    n_shared_experts: int = 1  # experts every token goes to
    moe_intermediate_size: int = MISSING  # one expert's intermediate width
    intermediate_size: int = MISSING  # the dense MLP's intermediate width
    num_attention_heads: int = MISSING  # attention heads (split over TP ranks)
    num_key_value_heads: int = MISSING  # KV heads (MLA: as many as attention heads)
    q_lora_rank: int = MISSING  # MLA: rank of the query's low-rank projection
    kv_lora_rank: int = MISSING  # MLA: the latent KV width the cache holds
    qk_nope_head_dim: int = MISSING  # MLA: per-head query/key dims without rotary embedding
    qk_rope_head_dim: int = MISSING  # MLA: per-head dims with rotary embedding (cached)
    v_head_dim: int = MISSING  # MLA: per-head value dims
    vocab_size: int = MISSING  # tokens in the vocabulary (lm_head's rows)
    n_group: int = 1  # router: expert groups (1 = none)
    topk_group: int = 1  # router: groups each token may pick experts from
    routed_scaling_factor: float = 1.0  # router: scale of the routed experts' output
    topk_method: str = "noaux_tc"  # router: noaux_tc loads the gate's correction bias
    scoring_func: str = "sigmoid"  # router: sigmoid or softmax scores
    max_position_embeddings: int = 4096  # longest context the config allows
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
    # Which experts the tokens go to (k25exp.model.routing): learned (the router's own),
    # uniform (top-k uniformly at random) or skewed (hot experts), in the server (vLLM's
    # routing simulator), the MoE micro-benchmark and the floor alike. null = uniform for a
    # MoE model served with dummy weights (an untrained router collapses a batch onto a few
    # experts), learned otherwise. Every run's tag `routing` says which it used.
    routing: Optional[str] = None


@dataclass
class HardwareConfig:
    """One box (or several identical ones) and how its devices talk.

    Bandwidths are per device and per direction, in GB/s (1e9 B/s); compute in TFLOP/s.
    """

    name: str = MISSING  # the box's name (conf/hardware/NAME.yaml)
    device: str = MISSING  # cpu | cuda
    # What the devices should report (each found device's name must contain it; "" or, on a
    # CPU box, "cpu" matches any). A mismatch is a warning and the run's tags
    # device_found / device_name_match / device_warning.
    device_name: str = ""
    backend: str = MISSING  # gloo | nccl
    nproc_per_node: int = MISSING  # ranks (GPUs) per node
    nnodes: int = 1  # nodes (boxes) in the job
    node_rank: int = 0  # this node's index (0 logs the run)
    # Multi-node: torchrun's static rendezvous. Every node runs the same k25exp command with
    # its own node_rank (under SLURM: $SLURM_NODEID); rdzv_endpoint = host:port of node 0.
    # Node 0 (ranks 0 … nproc_per_node−1) gathers every rank's samples and logs the run.
    # Null endpoint on one node = torchrun --standalone.
    rdzv_endpoint: Optional[str] = None
    world_size: int = MISSING  # interpolated: nnodes × nproc_per_node
    tp: int = MISSING  # tensor-parallel degree the collectives are sized for (a step's ops at TP = tp)
    interconnect: str = MISSING  # pcie | nvlink | shm
    link_gbps: float = MISSING  # device-to-device link rate, GB/s per direction (the report's % of link)
    mem_bandwidth_gbps: float = MISSING  # memory bandwidth per device, GB/s (the rooflines and the floor)
    peak_bf16_tflops: float = MISSING  # dense bf16 peak per device, TFLOP/s (the GEMM roofline)
    # Where each constant above comes from: "nominal: <datasheet, spec, a figure measured once
    # elsewhere>" or "measured: <how, on which box>". Figures divided by one (% of link,
    # roofline %) carry it in their caption and tag (k25exp.nominal); unset = nominal.
    link_gbps_source: str = "nominal"
    mem_bandwidth_gbps_source: str = "nominal"  # where mem_bandwidth_gbps comes from
    peak_bf16_tflops_source: str = "nominal"  # where peak_bf16_tflops comes from
    # false = NCCL's peer-to-peer transport off (NCCL_P2P_DISABLE=1 in every rank): on an
    # NVLink box, the closest it gets to GPUs that talk through host memory over PCIe. A
    # field rather than an env entry so the two runs differ in one logged param.
    nccl_p2p: bool = True
    # Extra environment for the collective workers, e.g. {NCCL_DEBUG: INFO}.
    env: Dict[str, str] = field(default_factory=dict)
    # CPU build of vLLM: the highest ISA its kernel choice may see (avx2 | avx512 |
    # avx512_bf16 | amx; null = what the CPU has, vLLM's own choice). avx2 on an AVX-512 machine
    # runs the path an AVX2-only CPU takes (no shared-memory all-reduce: gloo) in the server,
    # the collective ranks and the GEMM job alike; avx512_bf16 on an AMX machine hides its tiles
    # (CPU_MLA attention, the MoE's vec kernels). Tags vllm.cpu_isa and vllm.attention_backend
    # say what each loaded and picked.
    vllm_cpu_isa: Optional[str] = None
    # CPU boxes: how a TP group's ranks get cores, VLLM_CPU_OMP_THREADS_BIND's syntax ("0,1|2,3":
    # one core list per rank) or "split" (this process's CPUs in equal blocks); null = unbound.
    # The CPU-build server binds its TP workers this way (server.cpu_threads_bind follows it)
    # and the collective ranks get the same placement, so both run as the server does.
    cpu_threads_bind: Optional[str] = "split"
    # CUDA boxes: NVML sampled every this many ms while a job measures (clocks, power,
    # utilisation, memory, temperature; throttling and shared-GPU flags), the first
    # nproc_per_node visible GPUs (k25exp.tracking.telemetry). 0 = off. Unused on CPU.
    telemetry_period_ms: float = 100.0


@dataclass
class TrackingConfig:
    backend: str = "mlflow"  # mlflow | offline | none
    uri: Optional[str] = None  # the MLflow store; null = $MLFLOW_TRACKING_URI, else outputs/mlflow.db
    # A remote server that does not answer /health within this time → offline run folder
    # (when offline_fallback), uploaded later with `k25exp sync`.
    connect_timeout_s: float = 5.0
    offline_fallback: bool = True
    experiment_name: str = "k25exp"  # MLflow experiment (tracking.yaml: k25exp/<experiment.name>)
    # Where artifacts go for a local (sqlite/file) store; ignored for a remote server.
    artifact_root: Optional[str] = None
    campaign: Optional[str] = None  # tag shared by all runs of one campaign
    run_name: Optional[str] = None  # null = the experiment and its overrides
    # Env names redacted wherever k25exp writes them (MLflow params, resolved config, server
    # log header), besides any name containing TOKEN, KEY, SECRET or PASSWORD (k25exp.redact).
    redact: List[str] = field(default_factory=list)
    # A job killed hard leaves its run RUNNING. Each multirun's start (so each phase of
    # ./multirun.sh), `k25exp ui`, `k25exp sync` and `k25exp recover` end such runs KILLED with
    # what their folder holds; a single job does not look (docs/mlflow.md: what a dead run
    # looks like until then). A run is dead when its pid on this host is gone (or reused); on
    # another host, when its heartbeat tag, refreshed every heartbeat_s (0 = never), is older
    # than stale_after_s.
    heartbeat_s: float = 30.0
    stale_after_s: float = 900.0
    recover_at_multirun_start: bool = True  # false: leave dead runs to `k25exp recover` / ui


@dataclass
class PathsConfig:
    root: str = MISSING  # the project root (config.yaml: $K25EXP_ROOT, the checkout or the working dir)
    outputs: str = MISSING  # where run folders, models, reports and the default store go



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
    served_model_name: str = MISSING  # the model name requests carry (--served-model-name)
    api_key_env: Optional[str] = None  # environment variable holding the API key; null = none
    # Tokenizer used to build prompts of exact token lengths; null = the model folder.
    tokenizer: Optional[str] = None
    trust_remote_code: bool = False  # let the tokenizer (and vLLM) run the model folder's code
    ready_timeout_s: float = 900.0  # launch: until /health and /v1/models answer
    # -- kind vllm only --
    # Checkpoint folder; null = the `model` group's folder, generated into model_cache on first
    # use (k25exp.serving.tiny_model): random bf16 weights, or a quantized model's config alone
    # (then load_format must be dummy).
    model_path: Optional[str] = None
    # vLLM's --load-format; null = its default (auto). dummy = random weights, nothing read.
    load_format: Optional[str] = None
    model_cache: str = MISSING  # where generated model folders go (vllm.yaml: outputs/models)
    host: str = "127.0.0.1"  # the launched server's bind address
    # vLLM's dev endpoints (/reset_prefix_cache, /start_profile, ...) answer without the API
    # key, so they are enabled only on a loopback bind, unless this is true (and an API key set).
    allow_dev_endpoints_on_network: bool = False
    port: int = 8000  # 0 = any free port
    python: Optional[str] = None  # interpreter that runs vLLM; null = this one
    # How `python` starts the server (vllm-cpu's `vllm` console script is broken).
    entrypoint: List[str] = field(default_factory=lambda: ["-m", "vllm.entrypoints.openai.api_server"])
    tp: int = MISSING  # --tensor-parallel-size (vllm.yaml: hardware.tp)
    dtype: str = MISSING  # --dtype (vllm.yaml: model.dtype)
    max_model_len: int = 4096  # --max-model-len
    max_num_seqs: Optional[int] = None  # --max-num-seqs; null = vLLM's default
    max_num_batched_tokens: Optional[int] = None  # --max-num-batched-tokens; null = vLLM's default
    gpu_memory_utilization: Optional[float] = None  # GPU builds
    # GPU builds: the KV cache's size (--kv-cache-memory-bytes) instead of what is left under
    # gpu_memory_utilization. vLLM then skips its start-up memory profiling, CUDA-graph memory
    # estimate included (in 0.26 its longest part of a cold start after torch.compile);
    # the step itself is unchanged.
    kv_cache_memory_gib: Optional[float] = None
    enforce_eager: bool = False  # --enforce-eager: no torch.compile, no CUDA graphs
    enable_prefix_caching: Optional[bool] = None  # null = vLLM's default
    seed: int = 0  # --seed
    # CPU build: VLLM_CPU_KVCACHE_SPACE (GiB) and VLLM_CPU_OMP_THREADS_BIND; "split" gives each
    # TP rank an equal share of this process's CPUs ("0|1" on two cores). Set only when
    # hardware.device is cpu.
    cpu_kvcache_space_gib: Optional[int] = None
    cpu_threads_bind: Optional[str] = "split"  # VLLM_CPU_OMP_THREADS_BIND, or split (vllm.yaml: hardware's)
    env: Dict[str, str] = field(default_factory=dict)  # extra environment for the server (secrets masked in logs)
    extra_args: List[str] = field(default_factory=list)  # more vLLM arguments, verbatim
    # vLLM run by this interpreter: the workers load k25exp's worker extension
    # (k25exp.serving.worker_extension, --worker-extension-cls): the profile times the step's
    # collectives inside them at TP > 1 (experiment.server_burst_reps), spec_decode sets its
    # synthetic acceptance between levels; a server run by another interpreter may lack k25exp.
    collective_probe: bool = True
    # vLLM's --profiler-config (JSON object), e.g. {profiler: torch, torch_profiler_dir: DIR}.
    profiler: Optional[Dict[str, Any]] = None
    log_dir: str = MISSING  # where server logs go (vllm.yaml: outputs/servers)
    stop_timeout_s: float = 30.0  # SIGTERM to SIGKILL when stopping the server's process group


@dataclass
class K25Config:
    """The root: what `python -m k25exp` composes."""

    model: ModelConfig = MISSING
    hardware: HardwareConfig = MISSING
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    # The server group: composed only by the experiments that drive a server (their files'
    # defaults list `/server: vllm`); None for every other experiment.
    server: Optional[ServerConfig] = None
    experiment: Any = None
    seed: int = 0  # the campaign's seed: prompts, weights, inputs (experiments interpolate it)
