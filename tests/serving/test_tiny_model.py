"""The embedded checkpoint: Kimi-K2's architecture at a small size, deterministic, local."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest
from omegaconf import OmegaConf
from safetensors import safe_open

from k25exp.serving import tiny_model
from k25exp.load.prompts import load_tokenizer
from tests.conftest import ROOT, compose_cfg, warm_python

SMALL = ["model=tiny_kimi", "model.num_hidden_layers=2", "model.n_routed_experts=4",
         "model.num_experts_per_tok=2", "model.vocab_size=1024"]


def small_model(*extra):
    return OmegaConf.to_object(compose_cfg(*SMALL, *extra).model)


def digests(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_same_config_and_seed_give_the_same_files(tmp_path):
    m = small_model()
    a = tiny_model.generate(m, 0, tmp_path / "a")
    b = tiny_model.generate(m, 0, tmp_path / "b")
    assert digests(a) == digests(b)
    w0, w1 = tiny_model.make_weights(m, 0), tiny_model.make_weights(m, 1)
    assert not w0["lm_head.weight"].equal(w1["lm_head.weight"])
    assert tiny_model.model_hash(m, 0) != tiny_model.model_hash(m, 1)


def test_checkpoint_is_kimi_shaped(tmp_path):
    m = small_model()
    folder = tiny_model.generate(m, 0, tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"] and cfg["model_type"] == "deepseek_v3"
    assert cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"] == 576  # vLLM's CPU MLA
    assert (cfg["topk_method"], cfg["scoring_func"]) == ("noaux_tc", "sigmoid")
    assert cfg["n_shared_experts"] == 1 and cfg["first_k_dense_replace"] == 1
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        bias = f.get_tensor("model.layers.1.mlp.gate.e_score_correction_bias")
    assert keys == set(tiny_model.weight_shapes(m))
    assert "model.layers.0.mlp.gate_proj.weight" in keys  # the dense first layer
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in keys
    assert "model.layers.1.mlp.shared_experts.up_proj.weight" in keys
    assert "model.layers.1.self_attn.kv_a_proj_with_mqa.weight" in keys
    assert bias.abs().sum() > 0  # the correction bias changes routing
    tok = load_tokenizer(str(folder))  # transformers' AutoTokenizer, from the folder alone
    assert len(tok) <= m.vocab_size
    ids = tok("Sha kou tren lai.")["input_ids"]
    assert ids[0] == tok.bos_token_id == cfg["bos_token_id"] and tok.eos_token_id == cfg["eos_token_id"]
    assert tok.decode(ids, skip_special_tokens=True) == "Sha kou tren lai."


@pytest.mark.e2e
def test_ensure_reuses_the_cache_and_the_cli_prints_the_folder(tmp_path):
    m = small_model()
    path, made = tiny_model.ensure(m, 0, tmp_path)
    assert made and path.name == f"tiny_kimi-{tiny_model.model_hash(m, 0)}"
    assert tiny_model.ensure(m, 0, tmp_path) == (path, False)
    r = subprocess.run([warm_python(), "-m", "k25exp", "make-model", *SMALL,
                        f"server.model_cache={tmp_path}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(path)  # same config and seed: the cached folder
