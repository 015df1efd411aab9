"""The report (phase 5): the campaign's synthesis from its MLflow runs."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Dict, List, Optional

from omegaconf import MISSING

from k25exp import nominal
from k25exp.config.experiments.base import ExperimentBase, experiment
from k25exp.config.schema import HardwareConfig

if TYPE_CHECKING:
    from k25exp.config.schema import K25Config


@dataclass
class ExternalBurst:
    """A decode step's collectives measured outside k25exp, quoted as such in the report."""

    ms: float = 6.81  # the burst's time
    ops: int = 122  # all-reduces in it
    op_bytes: int = 14336  # bytes per all-reduce
    # Where the figure comes from, quoted beside it.
    source: str = ("the seed campaign's burst: 122 all-reduces of 14,336 B (hidden 7168 x "
                   "bf16, batch 1) in 6.81 ms, torchrun on 8 x RTX PRO 6000, PCIe only, no "
                   "NVLink (an H200 box's NVLink is faster)")
    # The seed campaign's own serving figures, quoted as such.
    seed: str = ("the seed campaign served Kimi-K2.5 INT4 at TP 8 on 8 x RTX PRO 6000 PCIe: "
                 "TPOT 12-13 ms at batch 1, throughput plateau ~1,536 tok/s at concurrency 128")
    # The same figures by concurrency, shown beside the prediction at that level: TPOT in ms
    # (low, high) and output tokens per second.
    seed_tpot_ms: Dict[int, List[float]] = field(default_factory=lambda: {1: [12.0, 13.0]})
    seed_tok_s: Dict[int, float] = field(default_factory=lambda: {128: 1536.0})  # tok/s by concurrency
    # The box the burst was measured on (a conf/hardware group; report.yaml composes
    # rtx_pro_6000_x8_pcie, the seed's): its link rate (hardware.link_gbps, nominal unless its
    # link_gbps_source says measured) is the collectives' β where no all-reduce sweep was
    # measured on the N-GPU box. null = no link rate: the burst's time per op at every batch.
    hardware: Optional[HardwareConfig] = None


@dataclass
class ScaleOutConfig:
    # The campaign whose nccl_burst runs measured the step's collectives on the N-GPU box
    # (hardware.tp = N, the whole model), or whose allreduce_sweep measured its bus bandwidth
    # (β of the modelled collectives); null = none: the external burst below, priced per
    # level at its box's link rate.
    collectives_campaign: Optional[str] = None
    external: ExternalBurst = field(default_factory=ExternalBurst)


@experiment
@dataclass
class ReportConfig(ExperimentBase):
    """The campaign's synthesis, from the latest finished run of each phase in MLflow."""

    no_recovery: ClassVar[str] = ("report: derived from other runs; run experiment=report again "
                                  "(it measured nothing that could be lost)")
    no_samples: ClassVar[str] = "no samples (derived from other runs)"

    campaign_order: ClassVar[Optional[int]] = 8
    headline: ClassVar[tuple[str, ...]] = ("tpot_ms", "comm_share_burst", "comm_share_profile_transport",
                                           "comm_share_diff_pp", "tpot_pred_err_pct_max")
    measures: ClassVar[bool] = False

    name: str = "report"
    _target_: str = "k25exp.runners.campaign_report.run"
    # Runs tagged campaign=<this>; null = the most recent campaign in the store.
    campaign: Optional[str] = MISSING  # report.yaml: tracking.campaign
    # The store to read (null with tracking=none: then set this).
    tracking_uri: Optional[str] = MISSING  # report.yaml: tracking.uri
    # Where `k25exp ui` (mlflow ui) serves this store: each figure links its run there.
    ui_url: str = "http://127.0.0.1:5000"
    # GEMM kernel whose M=1 latency counts as the step's GEMM time; null = the GEMM run's
    # baseline for an unquantized model, the fastest W4A16 kernel for an INT4 one.
    gemm_kernel: Optional[str] = None
    # The acceptance axis of the speculative speedup surface (per-token α, fitted step model).
    alphas: List[float] = field(default_factory=lambda: [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    # A campaign of one TP-N rank (model.tp_rank_of=N): TPOT at TP N predicted from it
    # (k25exp.report.scale_out).
    scale_out: ScaleOutConfig = field(default_factory=ScaleOutConfig)
    # Code states declared to measure what the campaign's code measures (a change beside the
    # timed path): the first 8+ hex characters of their code_sha256. Their runs are kept, not
    # refused, and the report's header names them (k25exp.report.provenance).
    same_code: List[str] = field(default_factory=list)

    def check(self, cfg: K25Config, problems: list[str]) -> None:
        """The store it reads and the speculative surface's axis."""
        super().check(cfg, problems)
        if not self.tracking_uri:
            problems.append("experiment.tracking_uri: no MLflow store to read the campaign from (tracking="
                            f"{cfg.tracking.backend} has no uri); set experiment.tracking_uri=sqlite:///<path> "
                            "or http://host:5000")
        if any(not 0.0 <= a <= 1.0 for a in self.alphas):
            problems.append(f"experiment.alphas={self.alphas}: acceptance rates must lie in [0, 1]")
        for i, h in enumerate(self.same_code):
            if not re.fullmatch(r"[0-9a-f]{8,64}", str(h)):
                problems.append(f"experiment.same_code[{i}]={h!r}: expected the first 8 to 64 "
                                "lowercase hex characters of a run's code_sha256 (the report's "
                                "'refused: code_sha256=…' line gives it)")
        box = self.scale_out.external.hardware
        if box is not None:  # β of the modelled collectives at TP N (k25exp.report.scale_out)
            key = "experiment.scale_out.external.hardware"
            if not box.link_gbps > 0:
                problems.append(f"{key}.link_gbps={box.link_gbps}: expected a link rate > 0 GB/s")
            why = nominal.check("link_gbps", box.link_gbps_source)
            if why:
                problems.append(why.replace("hardware.", f"{key}.", 1))

