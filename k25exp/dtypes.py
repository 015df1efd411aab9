"""Dtype names as they appear in configs, and what each backend can reduce.

Kept free of torch so configs validate without importing it.
"""

from __future__ import annotations

_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int8": 1, "uint8": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
}

# gloo has no fp8 kernels ("Invalid scalar type", checked with torch 2.13); NCCL reduces fp8
# from 2.24 on. bool is left out on purpose: a boolean "sum" is not a measurement anyone wants.
BACKEND_DTYPES = {
    "gloo": {"float64", "float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8"},
    "nccl": set(_BYTES),
}


def dtype_bytes(name: str) -> int:
    try:
        return _BYTES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(_BYTES)}") from None
