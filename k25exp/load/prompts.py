"""Prompts of an exact length in tokens, as the served tokenizer counts them.

Length is counted the way vLLM's completions API counts `usage.prompt_tokens`: the text
encoded with special tokens (a BOS the tokenizer prepends counts). A prompt is a run of
whole-word tokens (each decodes to a word that encodes back to that one token), drawn from a
seeded generator per prompt index, so prompt i is the same at every level and in every run
with the same seed, and no two prompts share a prefix beyond chance. The length is checked by
encoding the final text; if joining words merged tokens, words are added or dropped until it
is exact.
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Sequence

MAX_WORDS = 2000


def load_tokenizer(path: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)


def count_tokens(tok, text: str) -> int:
    return len(tok(text, add_special_tokens=True)["input_ids"])


@lru_cache(maxsize=8)
def _word_tokens(tok) -> tuple[str, ...]:
    """Decoded texts of single tokens that are a space plus letters and round-trip alone."""
    special = set(getattr(tok, "all_special_ids", []) or [])
    ids = list(range(len(tok)))
    random.Random(0).shuffle(ids)  # a fixed sample: big vocabularies needn't be scanned whole
    out = []
    for i in ids:
        if len(out) >= MAX_WORDS:
            break
        if i in special:
            continue
        s = tok.decode([i])
        if len(s) < 3 or not s.startswith(" ") or not s[1:].isalpha():
            continue
        if tok(s, add_special_tokens=False)["input_ids"] == [i]:
            out.append(s)
    if len(out) < 50:
        raise ValueError(f"tokenizer has only {len(out)} whole-word tokens; cannot build prompts")
    return tuple(out)


class PromptBuilder:
    """Prompt i: `length` tokens. With prefix_tokens > 0, its first prefix_tokens words are
    the shared prefix of group i mod prefix_groups (the case prefix caching is for), the rest
    its own, so prompts of one group share exactly that prefix."""

    def __init__(self, tok, length: int, seed: int, prefix_tokens: int = 0, prefix_groups: int = 1):
        self.tok, self.length, self.seed = tok, length, seed
        self.prefix_tokens, self.prefix_groups = prefix_tokens, max(prefix_groups, 1)
        self.words = _word_tokens(tok)
        self.overhead = count_tokens(tok, "")  # BOS and friends
        if length <= self.overhead:
            raise ValueError(f"input length {length} leaves no room after {self.overhead} "
                             "special token(s)")
        if prefix_tokens and prefix_tokens >= length - self.overhead:
            raise ValueError(f"prefix of {prefix_tokens} tokens leaves no room for a prompt's own "
                             f"part in {length} tokens")
        self._cache: dict[int, str] = {}

    def __call__(self, index: int) -> str:
        if index not in self._cache:
            self._cache[index] = self._build(index)
        return self._cache[index]

    def _build(self, index: int) -> str:
        rng = random.Random(f"{self.seed}/{index}")
        n = self.length - self.overhead
        shared = random.Random(f"{self.seed}/prefix/{index % self.prefix_groups}")
        prefix = [shared.choice(self.words) for _ in range(self.prefix_tokens)]
        words = prefix + [rng.choice(self.words) for _ in range(n - self.prefix_tokens)]
        for _ in range(4 * n + 20):
            text = "".join(words).lstrip()
            have = count_tokens(self.tok, text)
            if have == self.length:
                return text
            if have > self.length and len(words) > len(prefix):
                words.pop()
            else:
                words.append(rng.choice(self.words))
        raise ValueError(f"could not build a prompt of exactly {self.length} tokens")

    def many(self, indices: Sequence[int]) -> list[str]:
        return [self(i) for i in indices]
