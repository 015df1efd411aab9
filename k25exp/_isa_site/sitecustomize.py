"""Put on a vLLM server's PYTHONPATH by k25exp when hardware.vllm_cpu_isa caps the ISA: every
interpreter the server starts (API server, engine core, one per TP rank; spawned, so nothing is
inherited but the environment) caps torch's ISA probes before vLLM loads its kernels. See
k25exp/vllm_kernels.py."""

import os

if os.environ.get("K25EXP_VLLM_CPU_ISA"):
    from k25exp.vllm_kernels import cap_from_env

    cap_from_env()
