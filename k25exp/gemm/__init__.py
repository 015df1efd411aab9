"""GEMM micro-benchmark core: W4A16 vs BF16 at a model's tensor-parallel shapes.

Pure torch on purpose (no Hydra, OmegaConf or MLflow), so it runs on a bare GPU node:
``shapes`` derives the GEMMs from a model config, ``quant`` makes W4A16 weights,
``kernels`` holds the implementations a config names by ``_target_``, ``timing`` measures.
"""
