"""One tensor-parallel rank of a model, as a model of its own: `model.tp_rank_of=N`.

`model.*` always describes the whole checkpoint. With `model.tp_rank_of=N`, what runs on one
device is one of N tensor-parallel ranks: `rank_model(m)` is the model config whose every layer
has exactly the shapes that rank runs in vLLM, so serving it at TP 1 on one GPU runs one TP-N
rank's compute (and its weight memory), without N GPUs. This pure function is the one place
the derivation lives; its users:

- the generated model folder (k25exp.serving.tiny_model writes `rank_model(m)`'s config.json);
- the GEMM shapes (k25exp.gemm.shapes.model_gemm_shapes derives first, so experiment=gemm and
  the report's GEMM budget time and count the rank's shapes, at `experiment.tp` = 1: the rank
  is already a shard and is never divided again by hardware.tp);
- the weight-memory estimate (k25exp.model.weight_bytes).

The collectives (nccl_burst) keep the whole model at hardware.tp: they are the collectives of
all N ranks together, which a single rank cannot run.

What vLLM shards under TP N and what it replicates (vllm/model_executor/models/deepseek_v2.py):
- divided by N: attention heads (q_b_proj, kv_b_proj, o_proj; num_key_value_heads follows),
  the routed experts' and the shared experts' intermediate size (FusedMoE keeps every expert
  on every rank and shards 2·I), the dense MLP's intermediate size, the vocabulary
  (VocabParallelEmbedding and the lm_head);
- whole on every rank: hidden size, MLA's low-rank projections (q_a_proj and
  kv_a_proj_with_mqa are ReplicatedLinear: q_lora_rank, kv_lora_rank, the rope/nope/v head
  dims), the router (n_routed_experts, top-k, groups), every layer.

Torch-free and OmegaConf-free (the GEMM code imports it on GPU nodes with torch alone).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, TypeVar

M = TypeVar("M")

# config key -> what it is; each is divided by N (vLLM shards it over the TP ranks)
DIVIDED = ("num_attention_heads", "num_key_value_heads", "moe_intermediate_size",
           "intermediate_size", "vocab_size")


def rank_of(model: Any) -> Optional[int]:
    """N of `model.tp_rank_of`, or None (the whole model). Accepts what run params hold too
    (the report rebuilds a model from MLflow params, where null is the string "null")."""
    n = getattr(model, "tp_rank_of", None)
    if n is None or (isinstance(n, str) and n.strip().lower() in ("", "null", "none")):
        return None
    return int(n)


def rank_problems(model: Any, key_prefix: str = "model.") -> list[str]:
    """Why `model.tp_rank_of` cannot be derived (each naming its key), [] when it can."""
    n = rank_of(model)
    if n is None:
        return []
    if n < 1:
        return [f"{key_prefix}tp_rank_of={n}: expected a TP degree >= 1 (or null: the whole model)"]
    out = []
    for key in DIVIDED:
        v = getattr(model, key)
        if v % n:
            out.append(f"{key_prefix}tp_rank_of={n}: {key_prefix}{key}={v} is not divisible by {n} "
                       "(vLLM shards it over the TP ranks and refuses a remainder)")
    return out


def rank_model(model: M) -> M:
    """The config of one rank of `model.tp_rank_of` ranks (the model itself when it is null).

    The result has tp_rank_of = None, so deriving twice never divides twice, and its name says
    which rank it is (`<name>-tp<N>rank`). Raises ValueError naming the key when a divided
    size is not a multiple of N. Same type as given: a ModelConfig stays one.
    """
    n = rank_of(model)
    if n is None:
        return model
    problems = rank_problems(model)
    if problems:
        raise ValueError("; ".join(problems))
    changes = {key: getattr(model, key) // n for key in DIVIDED}
    changes.update(tp_rank_of=None, name=f"{getattr(model, 'name', 'model')}-tp{n}rank")
    if dataclasses.is_dataclass(model) and not isinstance(model, type):
        return dataclasses.replace(model, **changes)
    return _Overlay(model, changes)  # type: ignore[return-value]


class _Overlay:
    """Any config object (a namespace from run params, a DictConfig) with some keys replaced."""

    def __init__(self, base: Any, changes: dict[str, Any]) -> None:
        self.__dict__.update(_base=base, **changes)

    def __getattr__(self, key: str) -> Any:  # only for keys not replaced
        return getattr(self.__dict__["_base"], key)
