"""A small synthetic trace in Mooncake's JSONL form (k25exp.load.trace), seeded: for the tests,
the docs, and a first replay before a real trace is at hand.

    python -m k25exp.load.trace_gen trace.jsonl [--requests 32] [--rate 4] [--seed 0]
        [--groups 4] [--shared-blocks 2] [--input 600:1600] [--output 16:128]
        [--block-tokens 512]

Requests arrive as a Poisson process at `rate` req/s (timestamps in whole ms, the first at 0).
Each belongs to one of `groups` groups (a system prompt, a long document, a session's
history) whose first `shared_blocks` blocks it shares with the rest of its group; its other
blocks are its own. Input lengths are uniform in the `input` range (raised so the shared
blocks fit with one token of its own), output lengths uniform in `output`. Hash ids are
numbered in order of first use, as Mooncake's are.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np


def generate(requests: int = 32, rate: float = 4.0, seed: int = 0, groups: int = 4,
             shared_blocks: int = 2, input_range: tuple[int, int] = (600, 1600),
             output_range: tuple[int, int] = (16, 128), block_tokens: int = 512) -> list[dict]:
    """The trace's lines as dicts (the module docstring says how they are drawn)."""
    if requests < 1 or not rate > 0 or groups < 1 or shared_blocks < 0 or block_tokens < 1:
        raise ValueError("expected requests >= 1, rate > 0, groups >= 1, shared_blocks >= 0, "
                         "block_tokens >= 1")
    (ilo, ihi), (olo, ohi) = input_range, output_range
    if not 1 <= ilo <= ihi or not 1 <= olo <= ohi:
        raise ValueError(f"input {input_range}, output {output_range}: expected 1 <= low <= high")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1e3 / rate, size=requests - 1)
    times = np.rint(np.concatenate([[0.0], np.cumsum(gaps)])).astype(int)
    group = rng.integers(0, groups, size=requests)
    least = shared_blocks * block_tokens + 1
    inputs = np.maximum(rng.integers(ilo, ihi + 1, size=requests), least)
    outputs = rng.integers(olo, ohi + 1, size=requests)
    ids: dict[tuple, int] = {}  # (group, block) or ("own", request, block) -> hash id

    def hid(k: tuple) -> int:
        return ids.setdefault(k, len(ids))

    lines = []
    for i in range(requests):
        n_blocks = math.ceil(int(inputs[i]) / block_tokens)
        hashes = [hid(("group", int(group[i]), b)) for b in range(min(shared_blocks, n_blocks))]
        hashes += [hid(("own", i, b)) for b in range(len(hashes), n_blocks)]
        lines.append({"timestamp": int(times[i]), "input_length": int(inputs[i]),
                      "output_length": int(outputs[i]), "hash_ids": hashes})
    return lines


def write(path: Path, lines: Sequence[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    try:
        return int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LOW:HIGH tokens, e.g. 600:1600") from None


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m k25exp.load.trace_gen",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the trace file to write (JSONL)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--rate", type=float, default=4.0, help="mean arrivals per second")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--groups", type=int, default=4, help="groups sharing their first blocks")
    ap.add_argument("--shared-blocks", type=int, default=2, help="blocks a group shares")
    ap.add_argument("--input", type=_range, default=(600, 1600), help="input lengths LOW:HIGH")
    ap.add_argument("--output", type=_range, default=(16, 128), help="output lengths LOW:HIGH")
    ap.add_argument("--block-tokens", type=int, default=512, help="tokens per hash_ids block")
    a = ap.parse_args(argv)
    try:
        lines = generate(a.requests, a.rate, a.seed, a.groups, a.shared_blocks, a.input,
                         a.output, a.block_tokens)
    except ValueError as e:
        ap.error(str(e))
    write(a.out, lines)
    span = lines[-1]["timestamp"] / 1e3
    print(f"{a.out}: {len(lines)} requests over {span:.1f} s, input "
          f"{min(x['input_length'] for x in lines)}-{max(x['input_length'] for x in lines)}, "
          f"output {min(x['output_length'] for x in lines)}-"
          f"{max(x['output_length'] for x in lines)} tokens, {a.groups} group(s) sharing "
          f"{a.shared_blocks} block(s) of {a.block_tokens}")


if __name__ == "__main__":
    main()
