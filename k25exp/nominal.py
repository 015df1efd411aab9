"""Hardware constants are the config's numbers, not something a run measured.

hardware.link_gbps, mem_bandwidth_gbps and peak_bf16_tflops come from datasheets, a spec's
arithmetic, or a measurement someone once made on some machine; a run divides by them
(% of link, roofline %) without measuring them. hardware.<x>_source says which:
"nominal: ..." or "measured: ..." (nominal when unset, or on a run from before the field).
Every figure divided by one names the constant with its source in its caption and tag.
"""

from __future__ import annotations

from typing import Optional

UNITS = {"link_gbps": "GB/s", "mem_bandwidth_gbps": "GB/s", "peak_bf16_tflops": "TFLOP/s"}
KINDS = ("nominal", "measured")


def source_or_default(name: str, source: Optional[str]) -> str:
    return source or f"nominal (no hardware.{name}_source recorded)"


def kind(source: Optional[str]) -> str:
    """'measured' only when the source says so; anything else is nominal."""
    return "measured" if (source or "").strip().startswith("measured") else "nominal"


def describe(name: str, value: float, source: Optional[str]) -> str:
    """'36 GB/s (nominal: ...)': the constant, its unit and where it comes from."""
    return f"{value:g} {UNITS[name]} ({source_or_default(name, source)})"


def check(name: str, source: str) -> Optional[str]:
    """Why hardware.<name>_source is malformed (None when it is fine)."""
    if source.strip().split(":", 1)[0].strip() in KINDS:
        return None
    return (f"hardware.{name}_source={source!r}: expected 'nominal: ...' or 'measured: ...' "
            "(where the constant comes from; nominal unless measured on the box it describes)")
