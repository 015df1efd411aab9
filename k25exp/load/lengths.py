"""Each request's prompt and output length, drawn from experiment.input_len / output_len
(k25exp.config.experiments.request_shapes), and the figures a level logs of them.

Request i's length depends only on the seed, the stream (input or output) and i: indices are
drawn in blocks of BLOCK, block b from its own generator numpy.random.default_rng([seed,
stream, b]), so prompt i is the same length at every level and in every run with the same
seed (as its text is: k25exp.load.prompts), however many requests a phase draws. The
distributions, around the mean n (experiment.input_tokens / output_tokens):
    fixed      n
    uniform    rng.integers(floor(n (1 - r)), ceil(n (1 + r)) + 1): vLLM's random dataset
               (`bench serve --random-range-ratio r`)
    normal     round(rng.normal(n, stddev))
    lognormal  round(rng.lognormal(ln n - sigma² / 2, sigma)): mean n before rounding
    empirical  rng.choice(the file's lengths): each line of the file equally likely
then clipped to [low, max], low being the shape's min raised to what the caller needs (a
prompt: its shared prefix and the tokenizer's special tokens plus one token of its own).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from k25exp.config.experiments.request_shapes import LengthConfig

BLOCK = 256  # request indices per generator
STREAMS = {"input": 0, "output": 1}


class LengthFileError(ValueError):
    """A lengths file that cannot be used; the message names the key, the file and the line."""


def read_lengths(path: str, key: str) -> np.ndarray:
    """The lengths of an empirical distribution's file: one positive integer a line (blank
    lines skipped). Every bad line is named, with its number (`key`: the config key that
    names the file, for the message)."""
    p = Path(path)
    if not p.is_file():
        raise LengthFileError(f"{key}={path!r}: no such file")
    values, bad = [], []
    for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
        s = line.strip()
        if not s:
            continue
        try:
            v = int(s)
        except ValueError:
            v = None
        if v is None or v < 1:
            bad.append(f"{path}:{n}: {s[:40]!r}: expected a positive integer (a length in tokens)")
        else:
            values.append(v)
    if bad:
        more = f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""
        raise LengthFileError(f"{key}={path!r}: " + "; ".join(bad[:10]) + more)
    if not values:
        raise LengthFileError(f"{key}={path!r}: no lengths in the file (expected one positive "
                              "integer a line)")
    return np.asarray(values, dtype=np.int64)


class Lengths:
    """Request i's length (`__call__`), drawn as the module docstring says. `values`: an
    empirical shape's lengths (read_lengths). Picklable: client processes draw alike."""

    def __init__(self, shape: LengthConfig, mean: int, seed: int, stream: str, low: int = 1,
                 values: Optional[np.ndarray] = None):
        self.shape, self.mean, self.seed, self.stream = shape, mean, seed, STREAMS[stream]
        self.low = max(low, shape.min)
        self.high = shape.max
        if self.high is not None and self.high < self.low:
            raise ValueError(f"lengths clipped to [{self.low}, {self.high}]: nothing fits (raise max)")
        if shape.dist == "empirical" and values is None:
            raise ValueError("an empirical shape needs the file's lengths (read_lengths)")
        self.values = values
        self._blocks: dict[int, np.ndarray] = {}

    @property
    def fixed(self) -> bool:
        return self.shape.dist == "fixed"

    def __call__(self, i: int) -> int:
        if self.fixed:  # exactly the mean, as before shapes existed: too short is the builder's error
            return self.mean
        b = i // BLOCK
        if b not in self._blocks:
            self._blocks[b] = self._clip(self.draw(np.random.default_rng([self.seed, self.stream, b]),
                                                   BLOCK))
        return int(self._blocks[b][i % BLOCK])

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """`size` unclipped lengths from `rng`."""
        s, n = self.shape, self.mean
        if s.dist == "uniform":
            return rng.integers(math.floor(n * (1 - s.range_ratio)),
                                math.ceil(n * (1 + s.range_ratio)) + 1, size=size)
        if s.dist == "normal":
            return np.rint(rng.normal(n, s.stddev, size=size))
        if s.dist == "lognormal":
            return np.rint(rng.lognormal(math.log(n) - s.sigma ** 2 / 2, s.sigma, size=size))
        if s.dist == "empirical":
            return rng.choice(self.values, size=size)
        return np.full(size, n)

    def _clip(self, xs: np.ndarray) -> np.ndarray:
        return np.clip(xs, self.low, self.high if self.high is not None else None).astype(np.int64)

    def upper(self) -> Optional[int]:
        """The longest length it can give; None: unbounded."""
        if self.fixed:
            return self.mean
        top = self.shape.upper(self.mean)
        if self.shape.dist == "empirical":
            top = int(self.values.max()) if top is None else min(top, int(self.values.max()))
        return None if top is None else max(top, self.low)


def shape_figures(records: Sequence[dict]) -> dict[str, float]:
    """The lengths the level's requests were drawn with (every request sent, failed ones
    too): input_len_{mean,std,min,max} of prompt_tokens_target, output_len_* of max_tokens
    (std: over the level's requests themselves, ddof 0; a fixed shape's is 0)."""
    out: dict[str, float] = {}
    for name, field in (("input_len", "prompt_tokens_target"), ("output_len", "max_tokens")):
        xs = np.asarray([r[field] for r in records if r.get(field) is not None], dtype=float)
        if len(xs):
            out.update({f"{name}_mean": float(xs.mean()), f"{name}_std": float(xs.std()),
                        f"{name}_min": float(xs.min()), f"{name}_max": float(xs.max())})
    return out
