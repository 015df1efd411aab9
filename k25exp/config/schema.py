"""Structured-config schemas: the types every YAML file in conf/ extends.

Hydra checks keys and types against these dataclasses at compose time, so a typo'd key or
a string where an int belongs fails before anything runs. Value checks that need several
fields at once (TP dividing the world size, dtypes a backend can reduce) live in
``k25exp.config.validate``.

An experiment is registered in one place, its schema class (``@experiment``): the class
names its runner (``_target_``, called as ``run(cfg, out_dir, recorder)``), the checks that
validate it (``checks``, inherited ones run too) and its place in the campaign
(``campaign_order`` and ``campaign_sweep``, read by multirun.sh and the report).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional

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
    # stay the whole model's; k25exp.serving.tp_rank derives the rank (model folder, GEMM
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
class FaultConfig:
    """Test hooks that exercise failure handling on a real process group.

    kill_rank dies (os._exit) at sweep point `at_point`; corrupt_rank perturbs one element
    of its result before the correctness check, as a broken transport would.
    """

    kill_rank: Optional[int] = None
    at_point: int = 0
    corrupt_rank: Optional[int] = None


# Experiment schemas by the name used in conf/experiment/*.yaml defaults lists; filled by
# @experiment, so a new experiment is one YAML file, one schema class and one runner module.
EXPERIMENT_SCHEMAS: dict[str, type] = {}


def experiment(cls: type) -> type:
    """Registers an experiment's schema class under its `name` default."""
    name = cls.__dataclass_fields__["name"].default
    assert name not in EXPERIMENT_SCHEMAS, f"experiment {name!r} registered twice"
    assert cls.__dataclass_fields__["_target_"].default.endswith(".run"), cls
    EXPERIMENT_SCHEMAS[name] = cls
    return cls


@dataclass
class Registered:
    """What every experiment schema declares about itself (class variables: not config keys)."""

    # The runner, `run(cfg, out_dir, recorder) -> summary` (a config key, so a user can
    # point an experiment at their own runner, and the run's params say which one ran).
    _target_: str = MISSING
    # Dotted paths of `check(cfg, problems)` functions; a subclass's list adds to its parents'.
    checks: ClassVar[tuple[str, ...]] = ()
    # Position in ./multirun.sh's campaign (None: not a campaign phase) and its sweep
    # arguments (Hydra multirun syntax, split on spaces).
    campaign_order: ClassVar[Optional[int]] = None
    campaign_sweep: ClassVar[str] = ""
    # False for jobs that read other runs (report) rather than measure a phase.
    measures: ClassVar[bool] = True
    # The figures and params a user looks at first: the first columns of the MLflow runs
    # view `k25exp ui` links to (k25exp.tracking.ui_view), in this order.
    headline: ClassVar[tuple[str, ...]] = ()
    headline_params: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def all_checks(cls) -> list[str]:
        seen: list[str] = []
        for klass in reversed(cls.__mro__):
            for c in getattr(klass, "checks", ()) if "checks" in vars(klass) else ():
                if c not in seen:
                    seen.append(c)
        return seen


_V = "k25exp.config.validate."


@dataclass
class ExperimentBase(Registered):
    """Fields every experiment has (debug=quick sets them, whatever the experiment).

    Counts are named for what they count, one name per meaning: `warmup` untimed units
    before timing starts, `bursts` timed bursts (collectives), `ops_per_burst` ops queued in
    one burst, `calls` timed kernel calls (gemm), `requests` requests (serving).
    """

    name: str = MISSING
    warmup: int = 5  # untimed units (ops, calls, requests) before anything is timed
    # Measure only the first N sweep points (the debug group uses it); null = all.
    limit_points: Optional[int] = None


@dataclass
class CollectiveExperiment(ExperimentBase):
    """Fields every collective experiment shares."""

    checks: ClassVar[tuple[str, ...]] = (_V + "check_collective",)

    bursts: int = 3  # timed bursts per point (queued: each burst timed as a whole)

    dtype: str = "${model.dtype}"
    check: bool = True
    # Blocking-latency mode: ops timed one at a time (barrier, op, sync). Off = queued only.
    blocking: bool = True
    # CUDA graph capture of the burst (CUDA only; ignored on CPU with a note in the run).
    graph: bool = True
    # How long one collective waits for its peers before the process group gives up (gloo /
    # NCCL timeout): catches a hung or dead rank. Not a limit on the sweep's length.
    pg_timeout_s: float = 600.0
    # torchrun's wall-clock limit for the whole job; null = none (a long sweep is fine).
    wall_limit_s: Optional[float] = None
    # Who performs the ops: vllm = vLLM's own TP communicator (the path its server runs),
    # torch = PyTorch's c10d. Default: vllm when vLLM is importable here, else torch.
    communicator: str = "${k25.communicator:${hardware.nnodes}}"  # type: ignore[assignment]
    # NCCL runs: first an untimed probe job with NCCL's TUNING log, whose choices (algorithm,
    # protocol, channels per op size) become tags (one more torchrun start; false skips it).
    nccl_probe: bool = True
    fault: FaultConfig = field(default_factory=FaultConfig)


@experiment
@dataclass
class NcclBurstConfig(CollectiveExperiment):
    """Bursts of AllReduces of the decode message, as one decode step issues them."""

    checks: ClassVar[tuple[str, ...]] = (_V + "check_nccl_burst",)
    campaign_order: ClassVar[Optional[int]] = 1
    campaign_sweep: ClassVar[str] = "experiment.tokens=1,8,64"  # batches the report interpolates
    headline: ClassVar[tuple[str, ...]] = ("burst_ms", "ops_per_step", "busbw_gbps", "decode_share")
    headline_params: ClassVar[tuple[str, ...]] = ("experiment.tokens", "experiment.communicator")

    name: str = "nccl_burst"
    _target_: str = "k25exp.runners.nccl_burst.run"
    bursts: int = 20  # timed repetitions of the step's burst
    tokens: int = 1  # tokens in the batch: the message is hidden × dtype bytes × tokens
    message_bytes: int = MISSING  # interpolated: the per-layer all-reduce
    # null: the decode step's collectives as vLLM runs them at TP = world size (embedding
    # all-reduce, 2 per layer, the logits all-gather: k25exp.collectives.step). A number N:
    # N all-reduces of message_bytes (the seed campaign's 122 = 2 × 61 layers).
    ops_per_step: Optional[int] = None
    # How vLLM gathers the logits: all_gather (its default on every platform but a few) or gather.
    logits_op: str = "all_gather"
    # Measured decode step time (TPOT) of the real server, ms; gives decode_share when set.
    reference_tpot_ms: Optional[float] = None


@experiment
@dataclass
class AllReduceSweepConfig(CollectiveExperiment):
    """nccl-tests style AllReduce sweep over message sizes."""

    checks: ClassVar[tuple[str, ...]] = (_V + "check_allreduce_sweep",)
    campaign_order: ClassVar[Optional[int]] = 2
    headline: ClassVar[tuple[str, ...]] = ("peak_busbw_gbps", "time_us", "busbw_gbps")
    headline_params: ClassVar[tuple[str, ...]] = ("experiment.communicator",)

    name: str = "allreduce_sweep"
    _target_: str = "k25exp.runners.allreduce_sweep.run"
    min_bytes: int = 8
    max_bytes: int = 256 * 1024 * 1024
    factor: int = 2
    ops_per_burst: int = 20  # all-reduces queued back to back in one timed burst


@experiment
@dataclass
class AllToAllConfig(CollectiveExperiment):
    """Expert-parallel dispatch: All-to-All of top-k token activations."""

    checks: ClassVar[tuple[str, ...]] = (_V + "check_all_to_all",)
    campaign_order: ClassVar[Optional[int]] = 3
    headline: ClassVar[tuple[str, ...]] = ("knee_tokens_per_gpu", "a2a_us", "a2a_us_per_token", "busbw_gbps")

    name: str = "all_to_all"
    _target_: str = "k25exp.runners.all_to_all.run"
    tokens_per_gpu: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])
    top_k: int = "${model.num_experts_per_tok}"  # type: ignore[assignment]
    hidden_size: int = "${model.hidden_size}"  # type: ignore[assignment]
    ops_per_burst: int = 20  # all-to-alls queued back to back in one timed burst
    # Knee: smallest tokens/GPU whose latency exceeds knee_factor × the flat baseline, the
    # median latency of the first knee_baseline_points points.
    knee_factor: float = 1.5
    knee_baseline_points: int = 3
    # vLLM's expert-parallel all2all managers dispatch tokens by expert, not an
    # all_to_all_single of a buffer: this experiment times c10d's until that path is timed.
    communicator: str = "torch"


@experiment
@dataclass
class GemmConfig(ExperimentBase):
    """Weight GEMMs of a decode step at the model's shapes, per kernel candidate.

    limit_points keeps the first N values of the M sweep.
    """

    checks: ClassVar[tuple[str, ...]] = (_V + "check_gemm",)
    campaign_order: ClassVar[Optional[int]] = 4
    campaign_sweep: ClassVar[str] = "experiment.shapes=[all]"  # the report sums every GEMM of a step
    headline: ClassVar[tuple[str, ...]] = ("kernels_failed",)
    headline_params: ClassVar[tuple[str, ...]] = ("experiment.shapes", "experiment.kernels")

    name: str = "gemm"
    _target_: str = "k25exp.runners.gemm.run"
    warmup: int = 3
    # CUDA: warm up for at least this long after the first call (JIT, autotuning), as
    # triton's do_bench does (its default: 25 ms); CPU: unused
    warmup_ms: float = 25.0
    calls: int = 10  # timed calls per (shape, kernel, M)
    # Names from the model's GEMMs (k25exp.gemm.shapes), or ["all"].
    shapes: List[str] = field(default_factory=lambda: ["expert_gate_up", "expert_down"])
    include_lm_head: bool = True  # when shapes = ["all"]
    # User-named GEMMs, {name: {n: N, k: K}}: weight [n × k], y = x @ W.T with x [M × k].
    # Untyped so `+experiment.extra_shapes.NAME={n: 4096, k: 7168}` works from the command
    # line; validate.py checks the entries.
    extra_shapes: Dict[str, Any] = field(default_factory=dict)
    # "tp": each rank's shard at hardware.tp; "full": the unsharded weight.
    shards: List[str] = field(default_factory=lambda: ["tp"])
    tp: int = "${hardware.tp}"  # type: ignore[assignment]
    m_values: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])
    # Concurrencies whose average tokens per routed expert (batch × top_k / n_experts) are
    # added to the M sweep and tabulated (moe_regime.csv).
    moe_concurrency: List[int] = field(default_factory=lambda: [1, 8, 32, 128])
    # Kernel candidates by name (see `registry`) and the baseline for speedup_vs_bf16.
    kernels: List[str] = field(default_factory=lambda: ["torch_bf16", "w4a16_reference", "torch_int4", "marlin"])
    baseline: str = "torch_bf16"
    registry: Dict[str, Any] = field(default_factory=dict)
    group_size: int = "${model.quant.group_size}"  # type: ignore[assignment]
    rtol: float = 2e-2  # correctness gate, max|y - y_ref| / max|y_ref|
    device: str = "${hardware.device}"
    flush_l2: bool = True  # CUDA only: 256 MiB zeroed before every timed call
    graph: bool = False  # CUDA only: time a CUDA-graph replay (no launch overhead)
    # CPU: torch.set_num_threads. Default: the CPUs one TP rank of the CPU-build server gets
    # (this process's CPUs / hardware.tp), so the GEMMs and the MoE layer are timed on the
    # threads a rank runs them on; null = torch's default (every core).
    threads: Optional[int] = "${k25.rank_threads:${hardware.device},${hardware.tp}}"  # type: ignore[assignment]
    seed: int = "${seed}"  # type: ignore[assignment]
    # One MoE layer's routed experts as one fused call (k25exp.gemm.moe) at a batch of c
    # tokens: vLLM's own fused MoE op, and a plain-torch grouped reference. [] skips it.
    moe_kernels: List[str] = field(default_factory=lambda: ["vllm_fused_moe", "vllm_marlin_moe",
                                                            "reference_grouped_moe"])
    moe_batches: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    moe_max_weight_gib: float = 8.0  # skip (with the reason) a layer whose weights exceed it


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
class SloConfig:
    """Latency bounds a good request meets (vLLM's --goodput), in ms; null = no bound. TTFT
    and E2E are counted from the scheduled send."""

    ttft_ms: Optional[float] = None
    tpot_ms: Optional[float] = None
    e2e_ms: Optional[float] = None

    def bounds(self) -> dict[str, float]:
        """The bounds given, {name: ms}."""
        return {k: v for k, v in vars(self).items() if v is not None}


@dataclass
class MacroFaultConfig:
    """Test hook: SIGKILL the launched server's process group during one sweep level."""

    kill_server_at_level: Optional[int] = None  # a concurrency of experiment.concurrency
    after_requests: int = 1  # ...once this many requests of that level have finished


@experiment
@dataclass
class MacroConfig(Registered):
    """Phase 1: single-stream TPOT and throughput vs concurrency over the HTTP API."""

    checks: ClassVar[tuple[str, ...]] = (_V + "check_macro", _V + "check_dev_endpoints")
    campaign_order: ClassVar[Optional[int]] = 5
    headline: ClassVar[tuple[str, ...]] = (
        "single_stream_tpot_ms", "peak_output_tok_s", "saturation_concurrency", "tpot_ms_p50",
        "ttft_ms_p50", "output_tok_s", "goodput_req_s", "valid")
    headline_params: ClassVar[tuple[str, ...]] = ("experiment.load", "server.tp", "experiment.output_tokens")

    name: str = "macro"
    _target_: str = "k25exp.runners.macro.run"
    input_tokens: int = 128  # exact prompt length, counted by the served tokenizer
    output_tokens: int = 128  # max_tokens with ignore_eos
    seed: int = "${seed}"  # type: ignore[assignment]
    warmup: int = 2  # requests sent before anything is measured; never in the figures
    single_stream_requests: int = 8  # one at a time; 0 skips the phase
    concurrency: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128])
    # The sweep's load. closed: `concurrency` workers, each sending its next request when its
    # last one ended (step = concurrency). open: requests arrive at `request_rate` req/s
    # whatever the responses do, gamma gaps of shape `burstiness` (1 = Poisson, vLLM's
    # definition), at most `max_concurrency` in flight (null: 256, the client's own cap: one
    # socket per request in flight); step = rate × 1000 (MLflow steps are integers), the rate
    # itself is the metric target_rate_req_s.
    load: str = "closed"
    request_rate: List[float] = field(default_factory=lambda: [1.0, 2.0, 4.0])
    burstiness: float = 1.0
    max_concurrency: Optional[int] = None
    # open: a level whose client sent more than this fraction off the drawn schedule's rate
    # is flagged invalid (it measured the client's pace).
    max_rate_error: float = 0.05
    # open: scale each level's drawn schedule to realise request_rate exactly (n gaps are
    # otherwise about ±1/√n off the mean); the gaps' shape is kept. Not with duration_s.
    exact_rate: bool = False
    # closed: worker w starts at w × ramp_s / concurrency (0: all at once, rounds in lockstep).
    ramp_s: float = 0.0
    # Shared prefixes: request i's first prefix_tokens tokens are the prefix of group
    # i mod prefix_groups (0: every prompt its own, no shared prefix). The level logs the
    # server's prefix_cache_hit_rate.
    prefix_tokens: int = 0
    prefix_groups: int = 1
    # Goodput (vLLM's --goodput): any of slo.ttft_ms, tpot_ms, e2e_ms; a request is good when
    # it meets every one given (TTFT and E2E from the scheduled send). None set: no goodput.
    slo: SloConfig = field(default_factory=SloConfig)
    # Requests per level: a fixed count (null = max(min_requests, rounds × concurrency)),
    # or, when duration_s is set, as many as the level's workers start in that time.
    requests: Optional[int] = None
    rounds: int = 4
    min_requests: int = 8
    duration_s: Optional[float] = None
    # Each sweep level run this many times back to back (fresh prompts, the prefix cache reset
    # before each when reset_prefix_cache; open loop: the same drawn arrival schedule each
    # time, so the spread is the server's and the client's, not the schedule's): the level's
    # figures pool all repeats' requests;
    # <figure>_rep_min/_rep_max/_rep_spread_pct say how far the repeats' own figures differ.
    repeats: int = 1
    # Measure only the first N concurrency levels (debug=quick); null = all.
    limit_points: Optional[int] = None
    request_timeout_s: float = 300.0
    temperature: float = 0.0
    # POST /reset_prefix_cache before each level so levels don't help each other.
    reset_prefix_cache: bool = True
    # stream_options.continuous_usage_stats: exact token count of every chunk.
    continuous_usage: bool = True
    # Saturation: first level after which throughput grows by less than this fraction.
    saturation_gain: float = 0.1
    # A level is invalid when the client lagged: p99 of its send lag (actual − scheduled send
    # time) or the mean of its event loop's wake-up lag above this, or its CPU above 90 % of
    # a core. Its figures would then measure the client, not the server.
    max_client_lag_ms: float = 20.0
    # A level is also invalid when tokens made on time reached the client late, in a burst
    # (k25exp.serving.stalls): a run of >= stall_min_chunks chunks each within
    # stall_burst_frac x the decode step of the last, after a silence of >= 2 steps and
    # >= stall_min_gap_ms.
    stall_burst_frac: float = 0.1
    stall_min_chunks: int = 3
    stall_min_gap_ms: float = 5.0
    progress: bool = True
    # Client processes sending a level's load as one (k25exp.serving.shards): 0 = auto, enough
    # that each streams at most 8,000 chunks/s of the most the level can stream (C / the single
    # stream's TPOT; open loop: rate x output_tokens; without a single stream: C / 64),
    # at most half the CPUs; N = N (fewer where a level has fewer streams or requests).
    client_processes: int = 0
    # The client's event loop: auto (uvloop when importable, else asyncio), uvloop, asyncio.
    client_event_loop: str = "auto"
    fault: MacroFaultConfig = field(default_factory=MacroFaultConfig)


@experiment
@dataclass
class SpecDecodeConfig(MacroConfig):
    """Speculative decoding measured with the macro client, against its own baseline.

    The server runs with vLLM's --speculative-config built from these fields; the baseline
    is the same server without it (same settings otherwise), measured in the same job.
    """

    checks: ClassVar[tuple[str, ...]] = (_V + "check_spec_decode",)
    campaign_order: ClassVar[Optional[int]] = 7
    headline: ClassVar[tuple[str, ...]] = ("spec_speedup", "level_spec_speedup", "acceptance_rate")
    # n-gram lookup and the model as its own draft (the upper bound) in one process, so both
    # measure against one baseline server
    campaign_sweep: ClassVar[str] = "spec=ngram,self_draft"

    name: str = "spec_decode"
    _target_: str = "k25exp.runners.spec_decode.run"
    concurrency: List[int] = field(default_factory=lambda: [1, 2, 4])
    # vLLM's speculative method: ngram (prompt lookup, no draft model), draft_model, suffix,
    # eagle, eagle3, mtp ... (vLLM checks the name).
    method: str = "ngram"
    num_speculative_tokens: int = 3
    # Model-based methods only: a checkpoint folder (draft model, EAGLE head ...), or, with
    # method=draft_model, "self" = the served checkpoint as its own draft (the upper bound on
    # acceptance at temperature 0). Ignored by ngram/suffix; "self" is ignored by eagle/mtp.
    draft_model: Optional[str] = "self"
    prompt_lookup_min: int = 1  # ngram: shortest n-gram matched
    prompt_lookup_max: int = 4  # ngram: longest n-gram matched
    # Any other --speculative-config keys, passed verbatim (e.g. {rejection_sample_method:
    # synthetic, synthetic_acceptance_length: 2.5}).
    extra: Dict[str, Any] = field(default_factory=dict)
    baseline: bool = True  # also measure the server without speculative decoding


@experiment
@dataclass
class SloSearchConfig(MacroConfig):
    """The highest load whose latencies meet an SLO: probes of one level each (the macro
    measurement, open or closed loop) on one server start, bracketing then bisection.

    A probe meets the SLO when the `percentile` of each metric in `slo` (TTFT and E2E from
    the scheduled send) is at or below its bound, and the level is valid. Each probe is a
    child run; the answer is max_rate_meeting_slo (or max_concurrency_meeting_slo).
    """

    checks: ClassVar[tuple[str, ...]] = (_V + "check_slo_search",)
    headline: ClassVar[tuple[str, ...]] = ("max_rate_meeting_slo", "max_concurrency_meeting_slo")
    campaign_order: ClassVar[Optional[int]] = None  # not a campaign phase (macro's is inherited)

    name: str = "slo_search"
    _target_: str = "k25exp.runners.slo_search.run"
    search_over: str = "rate"  # rate (open loop) | concurrency (closed loop)
    load: str = "open"  # follows search_over (validated)
    percentile: int = 90  # 50 | 90 | 99 of each SLO metric
    start: float = 1.0  # first probe (req/s or concurrency)
    # Bracketing doubles (or halves) from `start` within [lowest, highest].
    lowest: float = 0.125
    highest: float = 256.0
    # Bisection stops when (fail - pass) / pass <= tolerance (rate), or fail - pass <= 1
    # (concurrency).
    tolerance: float = 0.1
    max_probes: int = 12
    min_requests: int = 20  # per probe: enough for the percentile (p90 needs 10)
    single_stream_requests: int = 0
    # every probe at exactly its rate: 20 Poisson arrivals are otherwise ±22 % off it, and a
    # probe at 2 req/s that happened to send at 4 met an SLO one at 3 (sent at 3.7) missed
    exact_rate: bool = True


@experiment
@dataclass
class ProfileConfig(ExperimentBase):
    """Phase 3: a torch.profiler capture of the live server's decode, broken down by kernel.

    warmup = requests before the profile window; requests = decode requests inside it;
    limit_points = analyse only the first N decode steps of each rank.
    """

    checks: ClassVar[tuple[str, ...]] = (_V + "check_profile", _V + "check_dev_endpoints")
    campaign_order: ClassVar[Optional[int]] = 6
    headline: ClassVar[tuple[str, ...]] = ("decode_step_ms", "share_communication", "share_gemm", "share_moe",
                                           "share_attention")
    headline_params: ClassVar[tuple[str, ...]] = ("experiment.concurrency",)
    # spans the macro sweep; one server start (reused across the levels)
    campaign_sweep: ClassVar[str] = "experiment.concurrency=1,8,32"

    name: str = "profile"
    _target_: str = "k25exp.runners.profile.run"
    warmup: int = 2
    requests: int = 4
    concurrency: int = 1  # the batch being profiled (at least this many requests are sent)
    input_tokens: int = 32
    output_tokens: int = 32
    temperature: float = 0.0
    seed: int = "${seed}"  # type: ignore[assignment]
    # /stop_profile blocks while every rank flushes its trace (minutes with stack capture).
    stop_timeout_s: float = 900.0
    # Where the server writes traces: its profiler config's torch_profiler_dir (launched
    # server); for server=endpoint, a folder this machine can read.
    trace_dir: Optional[str] = None
    trace_glob: str = "*.pt.trace.json*"
    rules: Optional[str] = None  # classification rules YAML; null = conf/trace_rules/default.yaml
    top_kernels: int = 30


@experiment
@dataclass
class TraceBreakdownConfig(ExperimentBase):
    """Breakdown of traces someone already has (one file per rank), logged as a run."""

    checks: ClassVar[tuple[str, ...]] = (_V + "check_trace_breakdown",)
    headline: ClassVar[tuple[str, ...]] = ("decode_step_ms", "share_communication", "share_gemm", "share_moe",
                                           "share_attention")

    name: str = "trace_breakdown"
    _target_: str = "k25exp.runners.trace_breakdown.run"
    paths: List[str] = field(default_factory=list)  # files, or folders searched for trace_glob
    trace_glob: str = "*.pt.trace.json*"
    rules: Optional[str] = None
    top_kernels: int = 30


@dataclass
class ExternalBurst:
    """A decode step's collectives measured outside k25exp, quoted as such in the report."""

    ms: float = 6.81
    ops: int = 122
    op_bytes: int = 14336
    source: str = ("the seed campaign's burst: 122 all-reduces of 14,336 B (hidden 7168 x "
                   "bf16, batch 1) in 6.81 ms, torchrun on 8 x RTX PRO 6000, PCIe only, no "
                   "NVLink (an H200 box's NVLink is faster)")
    seed: str = ("the seed campaign served Kimi-K2.5 INT4 at TP 8 on 8 x RTX PRO 6000 PCIe: "
                 "TPOT 12-13 ms at batch 1, throughput plateau ~1,536 tok/s at concurrency 128")


@dataclass
class ScaleOutConfig:
    # The campaign whose nccl_burst runs measured the step's collectives on the N-GPU box
    # (hardware.tp = N, the whole model); null = none: the external burst below is used.
    collectives_campaign: Optional[str] = None
    external: ExternalBurst = field(default_factory=ExternalBurst)


@experiment
@dataclass
class ReportConfig(ExperimentBase):
    """The campaign's synthesis, from the latest finished run of each phase in MLflow."""

    checks: ClassVar[tuple[str, ...]] = (_V + "check_report",)
    campaign_order: ClassVar[Optional[int]] = 8
    headline: ClassVar[tuple[str, ...]] = ("tpot_ms", "comm_share_burst", "comm_share_profile_transport",
                                           "comm_share_diff_pp", "tpot_pred_err_pct_max")
    measures: ClassVar[bool] = False

    name: str = "report"
    _target_: str = "k25exp.runners.report.run"
    # Runs tagged campaign=<this>; null = the most recent campaign in the store.
    campaign: Optional[str] = "${tracking.campaign}"  # type: ignore[assignment]
    # The store to read (null with tracking=none: then set this).
    tracking_uri: Optional[str] = "${tracking.uri}"  # type: ignore[assignment]
    # Where `k25exp ui` (mlflow ui) serves this store: each figure links its run there.
    ui_url: str = "http://127.0.0.1:5000"
    # GEMM kernel whose M=1 latency counts as the step's GEMM time; null = the GEMM run's
    # baseline for an unquantized model, the fastest W4A16 kernel for an INT4 one.
    gemm_kernel: Optional[str] = None
    # Speculative-decoding projection grid: per-token acceptance rates and draft lengths.
    alphas: List[float] = field(default_factory=lambda: [0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    draft_lengths: List[int] = field(default_factory=lambda: [1, 3, 7])
    # A campaign of one TP-N rank (model.tp_rank_of=N): TPOT at TP N predicted from it
    # (k25exp.report.scale_out).
    scale_out: ScaleOutConfig = field(default_factory=ScaleOutConfig)


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
