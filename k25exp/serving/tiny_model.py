"""Model folders generated here: a small random-weight checkpoint with Kimi-K2's architecture,
or the config of a quantized model (Kimi-K2.5 INT4) without weights, each with a tokenizer
trained here.

    python -m k25exp make-model [model=tiny_kimi] [seed=0] [--out DIR]
    python -m k25exp make-model model=kimi_k25_int4 model.tp_rank_of=8   # one TP-8 rank

The folder is what vLLM loads as `DeepseekV3ForCausalLM`: MLA (q/kv low-rank projections,
kv_lora_rank + qk_rope_head_dim = 576 as vLLM's CPU MLA needs), a dense first layer, routed +
shared experts, a sigmoid top-k gate with its `e_score_correction_bias` (`noaux_tc`). Its
sizes come from the `model` config group, as one device serves it: with `model.tp_rank_of=N`,
those of one TP-N rank (k25exp.model.tp_rank). An unquantized model (tiny_kimi) gets
weights drawn from a seeded generator, as safetensors. A quantized one (`model.quant.method`
w4a16) gets its compressed-tensors `quantization_config` (k25exp.model.quant_config) and no
weights at all: the folder is meant for `server.load_format=dummy` (vLLM's random weights, no
files read), so Kimi-K2.5's layers run without its ~550 GiB checkpoint. Either way the manifest
records the weight-memory estimate (k25exp.model.weight_bytes), logged when the folder is
made. The BPE tokenizer is trained on a corpus generated from the seed, so one (model config,
seed) always gives the same files. Nothing is downloaded.

The folder is `<cache>/<served model name>-<hash of its config.json and seed>`, written to a
temporary sibling and renamed into place, so concurrent callers never see half a checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
from dataclasses import asdict
from pathlib import Path

from k25exp.config.schema import ModelConfig
from k25exp.model import weight_bytes
from k25exp.model.quant_config import quantization_config
from k25exp.model.tp_rank import rank_model, rank_of
from k25exp.serving.staged import staged_folder

log = logging.getLogger(__name__)

# Bump when the generated files change for the same inputs (invalidates every cache entry).
GENERATOR_VERSION = 1
MANIFEST = "k25exp_model.json"
SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>"]  # ids 0, 1, 2
INIT_STD = 0.02


def _served(m: ModelConfig) -> ModelConfig:
    """`m`, checked to be the model as one device serves it: the functions below take
    `rank_model(model)`, derived once by generate and model_dir, the entry points."""
    if rank_of(m) is not None:
        raise ValueError(f"model {m.name!r} has model.tp_rank_of={m.tp_rank_of}: expected the "
                         "model one device serves, rank_model(model) (tp_rank_of null)")
    return m


def hf_config(served: ModelConfig) -> dict:
    """The checkpoint's config.json (DeepseekV3 field names, as Kimi-K2's own config uses), for
    the model as one device serves it (`rank_model(m)`: one rank's shapes with model.tp_rank_of)."""
    m = _served(served)
    cfg = {
        "architectures": [m.architecture],
        "model_type": "deepseek_v3",
        "vocab_size": m.vocab_size,
        "hidden_size": m.hidden_size,
        "intermediate_size": m.intermediate_size,
        "moe_intermediate_size": m.moe_intermediate_size,
        "num_hidden_layers": m.num_hidden_layers,
        "num_nextn_predict_layers": 0,
        "num_attention_heads": m.num_attention_heads,
        "num_key_value_heads": m.num_key_value_heads,
        "n_shared_experts": m.n_shared_experts,
        "n_routed_experts": m.n_routed_experts,
        "num_experts_per_tok": m.num_experts_per_tok,
        "routed_scaling_factor": m.routed_scaling_factor,
        "topk_method": m.topk_method,
        "scoring_func": m.scoring_func,
        "n_group": m.n_group,
        "topk_group": m.topk_group,
        "norm_topk_prob": True,
        "moe_layer_freq": 1,
        "first_k_dense_replace": m.first_k_dense_replace,
        "q_lora_rank": m.q_lora_rank,
        "kv_lora_rank": m.kv_lora_rank,
        "qk_nope_head_dim": m.qk_nope_head_dim,
        "qk_rope_head_dim": m.qk_rope_head_dim,
        "v_head_dim": m.v_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": m.max_position_embeddings,
        "rope_theta": 50000.0,
        "rope_scaling": None,
        "rms_norm_eps": 1e-6,
        "initializer_range": INIT_STD,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        "torch_dtype": m.dtype,
    }
    quant = quantization_config(m.quant)
    if quant is not None:  # absent for bf16 weights: tiny_kimi's config (and hash) unchanged
        cfg["quantization_config"] = quant
    return cfg


def model_hash(served: ModelConfig, seed: int) -> str:
    """The hash of the served model's config.json and the seed (`served`: rank_model(m))."""
    key = {"config": hf_config(served), "seed": seed, "generator": GENERATOR_VERSION}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def model_dir(m: ModelConfig, seed: int, cache_dir: Path) -> Path:
    """The cached folder of model `m` (the whole model's config) and seed."""
    served = rank_model(m)
    return Path(cache_dir) / f"{served.name}-{model_hash(served, seed)}"


def has_weights(m: ModelConfig) -> bool:
    """Whether the generated folder holds weights: bf16 models yes; a quantized one is config
    only (served with server.load_format=dummy)."""
    return not weight_bytes.quantized(m)


def weight_shapes(served: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint, by the names DeepSeek-V3 / Kimi-K2 checkpoints use
    (`served`: rank_model(m))."""
    m = _served(served)
    h, heads = m.hidden_size, m.num_attention_heads
    qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
    s: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (m.vocab_size, h)}
    for i in range(m.num_hidden_layers):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = (h,)
        s[p + "post_attention_layernorm.weight"] = (h,)
        a = p + "self_attn."
        if m.q_lora_rank:
            s[a + "q_a_proj.weight"] = (m.q_lora_rank, h)
            s[a + "q_a_layernorm.weight"] = (m.q_lora_rank,)
            s[a + "q_b_proj.weight"] = (heads * qk_head, m.q_lora_rank)
        else:
            s[a + "q_proj.weight"] = (heads * qk_head, h)
        s[a + "kv_a_proj_with_mqa.weight"] = (m.kv_lora_rank + m.qk_rope_head_dim, h)
        s[a + "kv_a_layernorm.weight"] = (m.kv_lora_rank,)
        s[a + "kv_b_proj.weight"] = (heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank)
        s[a + "o_proj.weight"] = (h, heads * m.v_head_dim)
        f = p + "mlp."
        if i < m.first_k_dense_replace:
            experts = {"": m.intermediate_size}
        else:
            s[f + "gate.weight"] = (m.n_routed_experts, h)
            s[f + "gate.e_score_correction_bias"] = (m.n_routed_experts,)
            experts = {f"experts.{e}.": m.moe_intermediate_size for e in range(m.n_routed_experts)}
            if m.n_shared_experts:
                experts["shared_experts."] = m.moe_intermediate_size * m.n_shared_experts
        for e, inter in experts.items():
            s[f + e + "gate_proj.weight"] = (inter, h)
            s[f + e + "up_proj.weight"] = (inter, h)
            s[f + e + "down_proj.weight"] = (h, inter)
    s["model.norm.weight"] = (h,)
    s["lm_head.weight"] = (m.vocab_size, h)
    return s


def make_weights(served: ModelConfig, seed: int) -> dict:
    """The checkpoint's tensors, drawn from `seed` (`served`: rank_model(m))."""
    import torch

    dtype = getattr(torch, served.dtype)
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in weight_shapes(served).items():
        if name.endswith("e_score_correction_bias"):
            # Non-zero so the correction actually changes which experts win; fp32 as in Kimi-K2.
            out[name] = torch.randn(shape, generator=g) * 0.01
        elif name.endswith("norm.weight"):
            out[name] = torch.ones(shape, dtype=dtype)
        else:
            out[name] = (torch.randn(shape, generator=g) * INIT_STD).to(dtype)
    return out


def _corpus(seed: int, lines: int = 12000) -> list[str]:
    """Pseudo-text from a seeded syllable grammar: enough distinct words for a few k merges."""
    rng = random.Random(seed)
    onsets = ["", "b", "k", "d", "f", "g", "h", "j", "l", "m", "n", "p", "r", "s", "t", "v", "z",
              "ch", "sh", "th", "st", "tr", "kr", "pl"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ei", "ya"]
    codas = ["", "", "n", "r", "s", "t", "k", "m", "ng"]
    words = ["".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
                     for _ in range(rng.randint(1, 3))) for _ in range(6000)]
    weights = [1.0 / (i + 1) for i in range(len(words))]  # Zipf-like, as real text is
    punct = [".", ",", "?", "!", ";", ":"]
    text = []
    for _ in range(lines):
        ws = rng.choices(words, weights, k=rng.randint(4, 18))
        if rng.random() < 0.3:
            ws.append(str(rng.randint(0, 9999)))
        text.append(" ".join(ws).capitalize() + rng.choice(punct))
    return text


def train_tokenizer(vocab_size: int, seed: int):
    """A byte-level BPE tokenizer (GPT-2 / tiktoken style) that prepends <|bos|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    bos = SPECIAL_TOKENS[0]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, 0)])
    return tok


def write_tokenizer(folder: Path, vocab_size: int, seed: int) -> None:
    from transformers import PreTrainedTokenizerFast

    tok = train_tokenizer(vocab_size, seed)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIAL_TOKENS[0],
                                   eos_token=SPECIAL_TOKENS[1], pad_token=SPECIAL_TOKENS[2],
                                   model_max_length=1 << 20)
    fast.save_pretrained(str(folder))


def is_complete(folder: Path) -> bool:
    return (folder / MANIFEST).is_file()


def generate(m: ModelConfig, seed: int, out: Path) -> Path:
    """Writes config.json, the tokenizer and, for a bf16 model, the weights into `out`
    (replacing it). Returns `out`."""
    served = rank_model(m)  # what every file below describes
    out = Path(out)
    with staged_folder(out) as tmp:
        cfg = hf_config(served)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        (tmp / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}, indent=2) + "\n")
        if has_weights(m):
            from safetensors.torch import save_file

            weights = make_weights(served, seed)
            save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            params = sum(t.numel() for t in weights.values())
        else:
            params = sum(math.prod(s) for s in weight_shapes(served).values())
        # the served vocabulary: the tokenizer never emits an id the model lacks (Kimi's rank:
        # 20,480; the corpus saturates at ~17k tokens, vLLM detokenizes the rest as nothing)
        write_tokenizer(tmp, served.vocab_size, seed)
        est = weight_bytes.estimate(m)
        (tmp / MANIFEST).write_text(json.dumps(
            {"model": asdict(m), "served_model": asdict(served), "seed": seed,
             "hash": model_hash(served, seed), "generator": GENERATOR_VERSION, "parameters": params,
             "weights": "model.safetensors" if has_weights(m)
             else "none: serve with server.load_format=dummy (vLLM's random weights)",
             "weight_bytes": est}, indent=2, default=str) + "\n")
    log.info("model folder %s: %s", out, weight_bytes.describe(est))
    return out


def ensure(m: ModelConfig, seed: int, cache_dir: Path) -> tuple[Path, bool]:
    """The cached checkpoint for (model config, seed), generated if missing. (path, generated)."""
    folder = model_dir(m, seed, cache_dir)
    if is_complete(folder):
        return folder, False
    try:
        generate(m, seed, folder)
    except OSError:
        if is_complete(folder):  # another process renamed its copy into place first
            return folder, False
        raise
    return folder, True
