"""The collectives of one decode step, in the order vLLM's tensor-parallel model runs them.

For a DeepseekV3-style model (Kimi-K2) at TP = t, with B tokens in the batch and the model
dtype of d bytes, a decode step issues:
  1. the vocab-parallel embedding's all-reduce: hidden × B elements;
  2. per layer, two all-reduces of hidden × B: after attention (o_proj is row-parallel) and
     after the MLP / MoE (the dense down_proj, or the routed + shared experts' sum, reduced
     once);
  3. the logits all-gather (LogitsProcessor._gather_logits; every platform but a few uses
     all-gather, the rest gather): each rank sends vocab / t × B elements.
So 2 × num_hidden_layers + 2 ops. Sizes are nccl-tests' S: the buffer for an all-reduce, the
gathered output (t × the send buffer) for an all-gather. Torch-free: the worker imports it.
"""

from __future__ import annotations

from dataclasses import dataclass

# How vLLM gathers the logits (all_gather on every platform but a few, which gather).
LOGITS_OPS = ("all_gather", "gather")
STEP_OPS = ("all_reduce", *LOGITS_OPS)


@dataclass(frozen=True)
class StepOp:
    index: int
    name: str  # embedding, layer<i>.attn, layer<i>.mlp, logits
    op: str  # all_reduce | all_gather | gather
    numel: int  # elements each rank sends
    nbytes: int  # nccl-tests' S: all-reduce buffer; (all-)gather: the gathered output


def decode_step_ops(hidden_size: int, num_layers: int, vocab_size: int, tp: int, tokens: int,
                    dtype_bytes: int, logits_op: str = "all_gather") -> list[StepOp]:
    if logits_op not in LOGITS_OPS:
        raise ValueError(f"logits_op={logits_op!r}: expected one of {', '.join(LOGITS_OPS)}")
    if vocab_size % tp:
        raise ValueError(f"vocab_size={vocab_size} is not divisible by tp={tp}")
    h = hidden_size * tokens
    names = ["embedding"] + [f"layer{i}.{part}" for i in range(num_layers) for part in ("attn", "mlp")]
    ops = [StepOp(i, n, "all_reduce", h, h * dtype_bytes) for i, n in enumerate(names)]
    per_rank = vocab_size // tp * tokens
    ops.append(StepOp(len(ops), "logits", logits_op, per_rank, per_rank * tp * dtype_bytes))
    return ops


def uniform_ops(n: int, numel: int, dtype_bytes: int) -> list[StepOp]:
    """The seed campaign's burst: n identical all-reduces (experiment.ops_per_step=N)."""
    return [StepOp(i, f"allreduce{i}", "all_reduce", numel, numel * dtype_bytes) for i in range(n)]
