"""Who performs a collective inside a torchrun rank: PyTorch's c10d, or vLLM's communicator.

`TorchComm` calls torch.distributed directly (gloo on CPU, NCCL on GPUs). `VllmComm` sets up
vLLM's distributed state in the rank (its world and TP groups, as a vLLM worker does) and
calls the TP group's all_reduce / all_gather, so the path timed is the one vLLM's server
runs: on the CPU build the shared-memory all-reduce (`_C::shm_allreduce`), on CUDA whichever
of quick / custom all-reduce, symmetric memory or pynccl vLLM picks for the message.
`describe()` names that choice; it is logged with the run.

Imports torch alone; vLLM only when VllmComm is built.
"""

from __future__ import annotations

import contextlib
import os
from typing import Optional

import torch
import torch.distributed as dist

from k25exp.collectives.spec import COMMUNICATORS


class TorchComm:
    name = "torch"
    synchronous = False  # gloo/NCCL work handles: an op's end is not seen on the host

    def run(self, op: str, send: torch.Tensor, recv: Optional[torch.Tensor], async_op: bool):
        """Issues one op; returns (work handle or None, the op's output tensor)."""
        if op == "all_reduce":
            return dist.all_reduce(send, async_op=async_op), send
        if op == "all_gather":
            return dist.all_gather_into_tensor(recv, send, async_op=async_op), recv
        if op == "all_to_all":
            return dist.all_to_all_single(recv, send, async_op=async_op), recv
        raise ValueError(f"torch communicator: unknown op {op!r}")

    def graph_context(self, device):
        return contextlib.nullcontext()

    def describe(self, sizes: list[tuple[str, torch.Tensor]]) -> dict:
        return {"communicator": "torch", "impl": f"torch.distributed ({dist.get_backend()})"}


# What describe() says of vLLM's CPU shared-memory all-reduce (the AVX-512 builds' only).
SHM_IMPL = "shm (vLLM _CPUSHMDistributed, _C::shm_allreduce)"


class VllmComm:
    """vLLM's TP group over all ranks of this torchrun (TP = world size)."""

    name = "vllm"
    # On CPU an op returns when it is done (shm or gloo, waited inside vLLM), so its host start
    # and end bound it; on CUDA they bound only the launch (the worker asks for a CPU device).
    synchronous = True

    def __init__(self, rank: int, world: int, local_rank: int, backend: str):
        # vLLM's CPU worker names its shared-memory segment after VLLM_DIST_IDENT; every rank
        # of one run must agree on it and no other run may (the run id torchrun gives them).
        os.environ.setdefault("VLLM_DIST_IDENT", "k25exp-" + os.environ.get(
            "TORCHELASTIC_RUN_ID", os.environ.get("MASTER_PORT", "0")))
        from k25exp import vllm_kernels

        # vLLM's own pick of its kernel build (never `import vllm._C`: the AVX-512 one, which
        # dies with SIGILL on an AVX2-only CPU); registers torch.ops._C, the CPU shm ops.
        self.cpu_isa = vllm_kernels.load()
        from vllm.config import VllmConfig, set_current_vllm_config
        from vllm.distributed import init_distributed_environment, initialize_model_parallel
        from vllm.distributed.parallel_state import get_tp_group

        with set_current_vllm_config(VllmConfig()):
            init_distributed_environment(world, rank, "env://", local_rank, backend)
            initialize_model_parallel(tensor_model_parallel_size=world)
        self.tp = get_tp_group()

    def run(self, op: str, send: torch.Tensor, recv: Optional[torch.Tensor], async_op: bool):
        # vLLM's ops are synchronous on the host (CPU) or stream-ordered (CUDA): no handles.
        if op == "all_reduce":
            return None, self.tp.all_reduce(send)  # out of place for some CUDA paths
        if op == "all_gather":
            return None, self.tp.all_gather(send.view(1, -1), dim=-1).view(-1)
        raise ValueError(f"vllm communicator: {op!r} is not timed through vLLM (its expert-"
                         "parallel all2all manager dispatches tokens, not all_to_all_single); "
                         "use experiment.communicator=torch")

    def graph_context(self, device):
        from vllm.distributed.parallel_state import graph_capture

        return graph_capture(device)  # registers custom all-reduce buffers for the capture

    def describe(self, sizes: list[tuple[str, torch.Tensor]]) -> dict:
        dc = self.tp.device_communicator
        out = {"communicator": "vllm", "device_communicator": type(dc).__name__}
        if hasattr(dc, "dist_module"):  # CPU build
            dm = type(dc.dist_module).__name__
            out["impl"] = (SHM_IMPL if dm == "_CPUSHMDistributed"  # else the AVX2 build's path
                           else f"torch.distributed ({dist.get_backend(self.tp.device_group)}) via vLLM")
            return out
        out["impl"] = ", ".join(f"{label}: {_cuda_pick(dc, t)}" for label, t in sizes)
        return out


def _cuda_pick(dc, t: torch.Tensor) -> str:
    """Which all-reduce vLLM's CudaCommunicator uses for `t`, in its own order of preference."""
    try:
        checks = [("quick_allreduce", "qr_comm", "should_quick_allreduce"),
                  ("custom_allreduce", "ca_comm", "should_custom_ar"),
                  ("symm_mem", "symm_mem_comm", "should_use_symm_mem")]
        for label, attr, fn in checks:
            c = getattr(dc, attr, None)
            if c is not None and not getattr(c, "disabled", False) and getattr(c, fn)(t):
                return label
        return "pynccl" if getattr(dc, "pynccl_comm", None) is not None else "torch.distributed"
    except Exception as e:  # a vLLM version whose internals differ: say so, don't fail
        return f"unknown ({type(e).__name__})"


def make_comm(name: str, rank: int, world: int, local_rank: int, backend: str):
    if name == "torch":
        return TorchComm()
    if name == "vllm":
        return VllmComm(rank, world, local_rank, backend)
    raise ValueError(f"communicator={name!r}: expected one of {', '.join(COMMUNICATORS)}")
