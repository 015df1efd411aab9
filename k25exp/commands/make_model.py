"""`k25exp make-model`: the model folder the serving experiments generate (tiny_kimi's
weights, or a quantized model's config.json alone)."""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    """`k25exp make-model [overrides] [--out DIR] [--force]`: writes the model folder, prints its
    path (stdout) and the weight-memory estimate (stderr)."""
    import argparse

    p = argparse.ArgumentParser(
        prog="k25exp make-model",
        description="Write the model folder experiment=macro serves when server.model_path is "
                    "null: the random-weight Kimi-shaped checkpoint (model=tiny_kimi), or a "
                    "quantized model's config without weights (model=kimi_k25_int4, for "
                    "server.load_format=dummy), with a locally trained tokenizer.")
    p.add_argument("overrides", nargs="*",
                   help="config overrides, e.g. model=tiny_kimi seed=1 model.num_hidden_layers=4, "
                        "or model=kimi_k25_int4 model.tp_rank_of=8 (one TP-8 rank)")
    p.add_argument("--out", help="folder to write (default: <server.model_cache>/<name>-<hash>)")
    p.add_argument("--force", action="store_true", help="rewrite even if it exists")
    a = p.parse_args(argv)
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from k25exp.config import register_configs
    from k25exp.config.store import conf_dir
    from k25exp.model import weight_bytes
    from k25exp.model.quant_config import quantization_config
    from k25exp.model.tp_rank import rank_model
    from k25exp.serving.tiny_model import ensure, generate, has_weights, is_complete, model_dir

    register_configs()
    overrides = list(a.overrides)
    if not any(o.startswith("model=") for o in overrides):
        overrides.insert(0, "model=tiny_kimi")
    # the model cache is the server group's (server.model_cache), which only the serving
    # experiments compose: add it as they do, unless the command line chose one
    if not any(o.lstrip("+").startswith("server=") for o in overrides):
        overrides.insert(0, "+server=vllm")
    # the package's config tree, as `python -m k25exp` composes it: an installed wheel has no
    # checkout's conf/ beside it
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    m = OmegaConf.to_object(cfg.model)
    seed = int(cfg.seed)
    try:
        est = weight_bytes.estimate(m)  # also checks model.tp_rank_of and the quant scheme
        quantization_config(m.quant)
        if a.out:
            out = Path(a.out)
            if a.force or not is_complete(out):
                generate(m, seed, out)
        elif a.force:
            out = generate(m, seed, model_dir(m, seed, Path(cfg.server.model_cache)))
        else:
            out, _ = ensure(m, seed, Path(cfg.server.model_cache))
    except ValueError as e:
        print(f"k25exp make-model: {e}", file=sys.stderr)
        return 2
    print(f"k25exp make-model: {rank_model(m).name}: {weight_bytes.describe(est)}"
          + ("" if has_weights(m) else "; no weights written: serve with server.load_format=dummy"),
          file=sys.stderr)
    print(out)
    return 0
