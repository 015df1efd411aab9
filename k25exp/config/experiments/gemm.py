"""The GEMM experiment (phase 2a): every weight GEMM of a decode step at the model's shapes and
the routed experts as one fused MoE call, per kernel candidate."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Dict, List, Optional

from omegaconf import MISSING

from k25exp.config.experiments.base import ExperimentBase, experiment, positive

if TYPE_CHECKING:
    from k25exp.config.schema import K25Config


@experiment
@dataclass
class GemmConfig(ExperimentBase):
    """Weight GEMMs of a decode step at the model's shapes, per kernel candidate.

    limit_points keeps the first N values of the M sweep.
    """

    recover: ClassVar[Optional[str]] = "k25exp.runners.gemm_results.recover"
    samples: ClassVar[Optional[str]] = "k25exp.compare.samples.gemm_folder"
    sample_artifacts: ClassVar[tuple[str, ...]] = ("samples.jsonl",)

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
    # line; check() below checks the entries.
    extra_shapes: Dict[str, Any] = field(default_factory=dict)
    # "tp": each rank's shard at hardware.tp; "full": the unsharded weight.
    shards: List[str] = field(default_factory=lambda: ["tp"])
    tp: int = MISSING  # gemm.yaml: hardware.tp (each weight's TP shard: 1/tp of it)
    m_values: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])  # tokens (M) swept
    # Concurrencies whose average tokens per routed expert (batch × top_k / n_experts) are
    # added to the M sweep and tabulated (moe_regime.csv).
    moe_concurrency: List[int] = field(default_factory=lambda: [1, 8, 32, 128])
    # Kernel candidates by name (see `registry`) and the baseline for speedup_vs_bf16.
    kernels: List[str] = field(default_factory=lambda: ["torch_bf16", "vllm_linear", "w4a16_reference",
                                                        "torch_int4", "marlin"])
    baseline: str = "torch_bf16"
    # Kernel factories by name ({name: {_target_: module.factory}}), gemm.yaml's.
    registry: Dict[str, Any] = field(default_factory=dict)
    group_size: int = MISSING  # gemm.yaml: model.quant.group_size (W4A16 kernels)
    rtol: float = 2e-2  # correctness gate, max|y - y_ref| / max|y_ref|
    device: str = MISSING  # gemm.yaml: hardware.device (cpu | cuda)
    flush_l2: bool = True  # CUDA only: 256 MiB zeroed before every timed call
    graph: bool = False  # CUDA only: time a CUDA-graph replay (no launch overhead)
    # CUDA only: also time each figure as the server's CUDA graph runs it, at least
    # instream_calls calls back to back in one graph over rotating weight copies larger than
    # twice the L2 (the MoE layer: a fresh routing draw per call), divided by the calls:
    # <figure>/latency_us_instream beside the isolated latency_us. The report budgets with it.
    instream: bool = True
    instream_calls: int = 32
    # CPU: torch.set_num_threads. Default: the CPUs one TP rank of the CPU-build server gets
    # (this process's CPUs / hardware.tp), so the GEMMs and the MoE layer are timed on the
    # threads a rank runs them on; null = torch's default (every core).
    threads: Optional[int] = MISSING
    seed: int = MISSING  # gemm.yaml: the root's; the random weights and inputs
    # One MoE layer's routed experts as one fused call (k25exp.gemm.moe) at a batch of c
    # tokens: vLLM's own fused MoE op, and a plain-torch grouped reference. [] skips it.
    moe_kernels: List[str] = field(default_factory=lambda: ["vllm_fused_moe", "vllm_marlin_moe",
                                                            "reference_grouped_moe"])
    moe_batches: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])  # tokens c of the MoE layer
    moe_max_weight_gib: float = 8.0  # skip (with the reason) a layer whose weights exceed it

    def check(self, cfg: K25Config, problems: list[str]) -> None:
        """Shapes, kernels and the MoE candidates it can time."""
        super().check(cfg, problems)
        from k25exp.gemm.shapes import model_gemm_shapes  # torch-free, cheap

        positive(self, "experiment", ["calls", "tp", "rtol", "instream_calls"], problems)
        if self.device not in ("cpu", "cuda"):
            problems.append(f"experiment.device={self.device!r}: expected 'cpu' or 'cuda'")
        for key in ("m_values", "moe_concurrency"):
            bad = [v for v in getattr(self, key) if v <= 0]
            if bad or (key == "m_values" and not self.m_values):
                problems.append(f"experiment.{key}={getattr(self, key)}: expected a non-empty list of positive integers")
        for s in self.shards:
            if s not in ("tp", "full"):
                problems.append(f"experiment.shards contains {s!r}: expected 'tp' or 'full'")
        try:
            known = [s.name for s in model_gemm_shapes(cfg.model, max(self.tp, 1), self.include_lm_head)]
        except ValueError as e:
            problems.append(f"experiment.tp={self.tp} cannot shard model {cfg.model.name}: {e}")
            known = []
        if self.shapes != ["all"]:
            for s in self.shapes:
                if known and s not in known:
                    problems.append(f"experiment.shapes contains unknown shape {s!r}; expected 'all' or "
                                    f"names from {known} (or add it under experiment.extra_shapes)")
        for name, spec in self.extra_shapes.items():
            n, k = (spec.get(x) if isinstance(spec, dict) else None for x in ("n", "k"))
            if not (isinstance(n, int) and isinstance(k, int) and n > 0 and k > 0) or set(spec) - {"n", "k"}:
                problems.append(f"experiment.extra_shapes.{name}={spec}: expected {{n: N, k: K}} with "
                                "positive integers (weight [n × k])")
        for k in [self.baseline, *self.kernels]:
            if k not in self.registry:
                problems.append(f"experiment.kernels: unknown kernel {k!r}; expected one of {sorted(self.registry)} "
                                f"(add it under experiment.registry with a _target_)")
            elif "_target_" not in self.registry[k]:
                problems.append(f"experiment.registry.{k}: expected a `_target_: module.function` key")
        if not self.shapes and not self.extra_shapes:
            problems.append("experiment.shapes=[] and no experiment.extra_shapes: expected something to time")
        if not self.kernels:
            problems.append("experiment.kernels=[]: expected at least one kernel")
        from k25exp.gemm.moe import CANDIDATES

        for k in self.moe_kernels:
            if k not in CANDIDATES:
                problems.append(f"experiment.moe_kernels: unknown candidate {k!r}; expected some of "
                                f"{sorted(CANDIDATES)}")
        if any(c <= 0 for c in self.moe_batches):
            problems.append(f"experiment.moe_batches={self.moe_batches}: expected positive token counts")

