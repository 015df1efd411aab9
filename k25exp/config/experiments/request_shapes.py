"""What the macro's requests look like: the length of each prompt and output (a distribution
around experiment.input_tokens / output_tokens), the trace a `load=trace` sweep replays and the
multi-turn sessions a `load=sessions` sweep runs.

Only the keys and the checks a config can make without reading files; drawing the lengths and
reading the files (checked line by line before the server starts) is k25exp.load.lengths and
k25exp.load.trace, running the sessions k25exp.load.sessions. The names follow vLLM's `bench
serve` (--random-range-ratio) and NVIDIA AIPerf (--synthetic-input-tokens-stddev, Mooncake
trace replay, multi-turn conversations with a turn delay).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

DISTS = ("fixed", "uniform", "normal", "lognormal", "empirical")


@dataclass
class LengthConfig:
    """One request's length in tokens (its prompt, or the output it is asked for), drawn per
    request around experiment.input_tokens (output_tokens), the distribution's mean, from the
    experiment's seed; rounded to an integer and clipped to [min, max]."""

    # fixed: every request exactly input_tokens (output_tokens) long, as before this key
    # existed; uniform: an integer in [floor(n (1 - range_ratio)), ceil(n (1 + range_ratio))],
    # vLLM's random dataset; normal: n + stddev x N(0, 1); lognormal: mean n, sigma the
    # standard deviation of the length's log; empirical: a length drawn from the file `path`
    dist: str = "fixed"
    range_ratio: float = 0.0  # uniform: the half-width as a fraction of the mean, 0 <= x < 1
    stddev: float = 0.0  # normal: the standard deviation, tokens
    sigma: float = 0.0  # lognormal: the standard deviation of ln(length)
    path: Optional[str] = None  # empirical: a file of lengths, one positive integer a line
    # A length drawn below min is raised to it (a prompt also to what its shared prefix and
    # the tokenizer's special tokens need: the prompt builder's least).
    min: int = 1
    # A length drawn above max is lowered to it; null: no bound (normal, lognormal and
    # empirical then cannot be held against a launched server's max_model_len: set it).
    max: Optional[int] = None

    def upper(self, mean: int) -> Optional[int]:
        """The largest length this can draw; None where only `max` could bound it."""
        top = {"fixed": mean, "uniform": math.ceil(mean * (1 + self.range_ratio))}.get(self.dist)
        if top is None:
            return self.max
        return top if self.max is None else min(top, self.max)

    def problems(self, key: str, mean_key: str, mean: int, problems: list[str]) -> None:
        """Its values against each other and the mean (`mean_key`: the key holding it)."""
        if self.dist not in DISTS:
            problems.append(f"{key}.dist={self.dist!r}: expected one of {', '.join(DISTS)}")
            return
        if self.dist == "uniform" and not 0 <= self.range_ratio < 1:
            problems.append(f"{key}.range_ratio={self.range_ratio}: expected 0 <= x < 1 (lengths "
                            f"in [{mean_key} x (1 - x), {mean_key} x (1 + x)])")
        if self.dist == "normal" and not self.stddev >= 0:
            problems.append(f"{key}.stddev={self.stddev}: expected >= 0 tokens")
        if self.dist == "lognormal" and not self.sigma >= 0:
            problems.append(f"{key}.sigma={self.sigma}: expected >= 0 (of ln(length))")
        if self.dist == "empirical":
            if not self.path:
                problems.append(f"{key}.path=null with {key}.dist=empirical: expected a file of "
                                "lengths, one positive integer a line")
            elif not Path(self.path).is_file():
                problems.append(f"{key}.path={self.path!r}: no such file")
        if self.min < 1:
            problems.append(f"{key}.min={self.min}: expected >= 1")
        if self.max is not None and self.max < max(self.min, 1):
            problems.append(f"{key}.max={self.max}: expected >= {key}.min={self.min} (or null)")


@dataclass
class TraceConfig:
    """experiment.load=trace: each request of a timestamped trace sent at its own time (or
    faster), open loop, whatever the responses do. The trace is Mooncake's JSONL form, one
    request a line: timestamp (ms since the trace began), input_length and output_length
    (tokens), hash_ids (optional: the ids of its prompt's blocks of block_tokens tokens;
    requests sharing an id share that block, so the server's prefix cache sees them)."""

    path: Optional[str] = None  # the trace (JSONL); every line is checked before anything is sent
    # The sweep's levels: the trace replayed with its gaps divided by each (2 = twice as
    # fast); step = speedup x 1000 (MLflow steps are integers).
    speedup: List[float] = field(default_factory=lambda: [1.0])
    block_tokens: int = 512  # tokens per hash_ids block (Mooncake's traces: 512)

    def problems(self, problems: list[str]) -> None:
        if not self.path:
            problems.append("experiment.trace.path=null with experiment.load=trace: expected a trace "
                            "file (JSONL: timestamp, input_length, output_length, hash_ids), e.g. "
                            "one made by python -m k25exp.load.trace_gen")
        elif not Path(self.path).is_file():
            problems.append(f"experiment.trace.path={self.path!r}: no such file")
        if not self.speedup or any(not s > 0 for s in self.speedup):
            problems.append(f"experiment.trace.speedup={self.speedup}: expected a non-empty list of "
                            "factors > 0 (1 = the trace's own times)")
        elif len(set(self.speedup)) != len(self.speedup):
            problems.append(f"experiment.trace.speedup={self.speedup}: factors must be distinct "
                            "(each is a step)")
        if self.block_tokens < 1:
            problems.append(f"experiment.trace.block_tokens={self.block_tokens}: expected >= 1")


THINK_DISTS = ("fixed", "exponential")


@dataclass
class SessionConfig:
    """experiment.load=sessions: multi-turn conversations, `concurrency` of them in flight
    (closed loop). Each turn's prompt is the session's history (its earlier prompts and the
    server's answers) plus a new message of a length drawn from experiment.input_len; each
    answer is experiment.output_len long. The pause before a turn after the first is the
    user's think time."""

    turns: int = 3  # turns (requests) per session
    # the pause before each turn after the first, from the end of the answer before it: s
    # (exponential: the mean)
    think_time_s: float = 0.0
    # fixed: exactly think_time_s; exponential: drawn per session from the seed, mean think_time_s
    think_dist: str = "fixed"
    # sessions a level runs; null: max(concurrency, ceil(the level's requests / turns)), about
    # as many requests as a closed-loop level of `rounds` rounds
    count: Optional[int] = None

    def per_level(self, concurrency: int, requests: int) -> int:
        """Sessions a level of `concurrency` runs (`requests`: what a closed loop would send)."""
        return self.count if self.count is not None else max(concurrency, math.ceil(requests / self.turns))

    def longest(self, message: int, answer: int) -> int:
        """A session's last prompt and its answer at most: every turn's message and answer."""
        return self.turns * (message + answer)

    def problems(self, problems: list[str]) -> None:
        if self.turns < 1:
            problems.append(f"experiment.sessions.turns={self.turns}: expected >= 1")
        if not self.think_time_s >= 0:
            problems.append(f"experiment.sessions.think_time_s={self.think_time_s}: expected >= 0 seconds")
        if self.think_dist not in THINK_DISTS:
            problems.append(f"experiment.sessions.think_dist={self.think_dist!r}: expected fixed or "
                            "exponential")
        if self.count is not None and self.count < 1:
            problems.append(f"experiment.sessions.count={self.count}: expected >= 1 or null")
