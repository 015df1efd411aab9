"""Checks that need more than one field, run before anything is measured.

Hydra already rejects unknown keys, wrong types and unknown group options at compose time;
this module catches values that are well-typed but impossible (TP not dividing the world,
a dtype the backend cannot reduce, NCCL without GPUs). Every problem is reported at once,
each naming its key, the value and what was expected. Here: the model and the hardware, and
`+key` additions Hydra would drop; the tracking group's rule (config.tracking_checks) and the
server group's (config.server_checks, for every experiment that has the group); each
experiment checks itself (its schema's `check`, k25exp.config.experiments).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from k25exp import nominal, vllm_kernels
from k25exp.config.experiments import EXPERIMENT_SCHEMAS
from k25exp.config.experiments.base import positive
from k25exp.config.schema import K25Config
from k25exp.config.server_checks import server_problems
from k25exp.config.tracking_checks import tracking_problems
from k25exp.dtypes import BACKEND_DTYPES
from k25exp.model import routing
from k25exp.model.quant_config import is_quantized, quantization_config
from k25exp.model.tp_rank import rank_model, rank_problems


class ConfigError(ValueError):
    """A config that composes but cannot be run. The message names every bad key."""


def local_gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # no torch or a broken driver: no usable GPUs
        return 0


def _check_hardware(c: K25Config, p: list[str], gpu_count: Callable[[], int]) -> None:
    hw = c.hardware
    positive(hw, "hardware", ["nproc_per_node", "nnodes", "world_size", "tp", "link_gbps",
                               "mem_bandwidth_gbps", "peak_bf16_tflops"], p)
    for name in nominal.UNITS:
        if why := nominal.check(name, getattr(hw, f"{name}_source")):
            p.append(why)
    if hw.device not in ("cpu", "cuda"):
        p.append(f"hardware.device={hw.device!r}: expected 'cpu' or 'cuda'")
    if hw.backend not in BACKEND_DTYPES:
        p.append(f"hardware.backend={hw.backend!r}: expected one of {sorted(BACKEND_DTYPES)}")
    if hw.backend == "nccl" and hw.device != "cuda":
        p.append(f"hardware.backend='nccl' needs hardware.device='cuda', got {hw.device!r}")
    if not hw.nccl_p2p and hw.backend != "nccl":
        p.append(f"hardware.nccl_p2p=false turns off NCCL's peer-to-peer transport; "
                 f"hardware.backend={hw.backend!r} is not NCCL")
    if "NCCL_P2P_DISABLE" in hw.env:
        p.append("hardware.env.NCCL_P2P_DISABLE: set hardware.nccl_p2p=false instead (one "
                 "logged param, the same for every experiment)")
    if hw.vllm_cpu_isa is not None:
        if hw.device != "cpu":
            p.append(f"hardware.vllm_cpu_isa={hw.vllm_cpu_isa!r} caps the CPU build's kernel "
                     f"choice; hardware.device={hw.device!r} is not cpu (set it to null)")
        elif why := vllm_kernels.check_level(hw.vllm_cpu_isa, vllm_kernels.native_level()):
            p.append(f"hardware.vllm_cpu_isa: {why}")
    if hw.tp > 0 and hw.world_size > 0 and hw.world_size % hw.tp:
        p.append(f"hardware.tp={hw.tp} must divide hardware.world_size={hw.world_size} "
                 f"(nnodes {hw.nnodes} × nproc_per_node {hw.nproc_per_node})")
    if not 0 <= hw.node_rank < max(hw.nnodes, 1):
        p.append(f"hardware.node_rank={hw.node_rank}: expected 0 ≤ node_rank < nnodes={hw.nnodes}")
    if hw.nnodes > 1:
        host, _, port = (hw.rdzv_endpoint or "").rpartition(":")
        if not host or not port.isdigit():
            p.append(f"hardware.rdzv_endpoint={hw.rdzv_endpoint!r}: hardware.nnodes={hw.nnodes} > 1 "
                     "needs host:port of node 0 (e.g. node0:29500)")
    if hw.backend == "nccl" and hw.device == "cuda" and hw.nproc_per_node > 0:
        have = gpu_count()
        if have < hw.nproc_per_node:
            p.append(f"hardware.backend='nccl' with hardware.nproc_per_node={hw.nproc_per_node} "
                     f"needs {hw.nproc_per_node} GPUs on this node, found {have}")


def _check_model(c: K25Config, p: list[str]) -> None:
    m = c.model
    positive(m, "model", ["hidden_size", "num_hidden_layers", "n_routed_experts",
                           "num_experts_per_tok", "moe_intermediate_size", "intermediate_size",
                           "num_attention_heads", "vocab_size", "dtype_bytes"], p)
    if m.num_experts_per_tok > m.n_routed_experts:
        p.append(f"model.num_experts_per_tok={m.num_experts_per_tok} exceeds "
                 f"model.n_routed_experts={m.n_routed_experts}")
    if not 0 <= m.first_k_dense_replace <= m.num_hidden_layers:
        p.append(f"model.first_k_dense_replace={m.first_k_dense_replace}: expected 0..num_hidden_layers")
    if why := routing.check(m.routing):
        p.append(why)
    rank = rank_problems(m)
    p += rank
    if not is_quantized(m.quant):
        return
    try:
        quantization_config(m.quant)
    except ValueError as e:
        p.append(str(e))
        return
    if rank:
        return
    served = rank_model(m)
    # pack-quantized groups run along each expert GEMM's K: gate_up's hidden, down's
    # intermediate (one rank's, with tp_rank_of)
    g = m.quant.group_size
    for key, v in (("hidden_size", served.hidden_size),
                   ("moe_intermediate_size", served.moe_intermediate_size)):
        if v % g:
            what = f"model.{key}={v}" if v == getattr(m, key) else \
                f"model.{key}/model.tp_rank_of = {v}"
            p.append(f"{what} is not a multiple of model.quant.group_size={g} (the routed "
                     "experts' weights are quantized in groups along it)")


def validate(c: K25Config, gpu_count: Optional[Callable[[], int]] = None) -> None:
    problems: list[str] = []
    _check_model(c, problems)
    _check_hardware(c, problems, gpu_count or local_gpu_count)
    problems += tracking_problems(c.tracking)
    if c.server is not None:  # whichever experiment composed the group, checked once
        server_problems(c, problems)
    c.experiment.check(c, problems)  # the schema's own checks (and its parents')
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))


def _unknown_keys(node: DictConfig, path: str) -> list[str]:
    """Keys added with `+key=...` to a schema node: OmegaConf would drop them silently."""
    problems = []
    schema = OmegaConf.get_type(node)
    if dataclasses.is_dataclass(schema):
        known = {f.name for f in dataclasses.fields(schema)}
        for k in node.keys():
            if k not in known:
                problems.append(f"{path}{k}: unknown key for {schema.__name__}; expected one of "
                                f"{sorted(known)}")
    for k in node.keys():
        child = node._get_node(k)
        if isinstance(child, DictConfig) and not child._is_none():
            problems += _unknown_keys(child, f"{path}{k}.")
    return problems


def to_typed(cfg: DictConfig, gpu_count: Optional[Callable[[], int]] = None) -> K25Config:
    """The composed DictConfig as typed dataclasses, validated. Raises ConfigError."""
    if cfg.get("experiment") is None:
        raise ConfigError("no experiment selected: add experiment=NAME, one of "
                          f"{sorted(EXPERIMENT_SCHEMAS)}")
    extra = _unknown_keys(cfg, "")
    if extra:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(extra))
    try:
        typed = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:  # missing values, failed interpolations, bad types
        raise ConfigError(f"invalid config: {e}") from None
    assert isinstance(typed, K25Config)
    validate(typed, gpu_count)
    return typed


def typed_from_folder(out: Path) -> K25Config:
    """The job's typed config from its config.resolved.yaml (what it ran with)."""
    resolved = OmegaConf.load(out / "config.resolved.yaml")
    name = resolved.experiment.name
    if name not in EXPERIMENT_SCHEMAS:
        raise KeyError(f"experiment.name={name!r} in {out / 'config.resolved.yaml'}: not one of "
                       f"{sorted(EXPERIMENT_SCHEMAS)}")
    base = OmegaConf.structured(K25Config)
    base.experiment = OmegaConf.structured(EXPERIMENT_SCHEMAS[name])
    return to_typed(OmegaConf.merge(base, resolved))
