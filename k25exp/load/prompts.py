"""Prompts of an exact length in tokens, as the served tokenizer counts them.

Length is counted the way vLLM's completions API counts `usage.prompt_tokens`: the text
encoded with special tokens (a BOS the tokenizer prepends counts). A prompt is a run of
whole-word tokens (each decodes to a word that encodes back to that one token), drawn from a
seeded generator per prompt index, so prompt i is the same at every level and in every run
with the same seed, and no two prompts share a prefix beyond chance. The length is checked by
encoding the final text; if joining words merged tokens, words are added or dropped at its end
until it is exact. What prompts share is at their start: a group's prefix (prefix_tokens), or
a trace's blocks (hash_ids: block h is the same words in every prompt that names it, so
prompts naming the same first blocks share those tokens, as a prefix cache sees them).
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
    """Prompt i: `length` tokens (or the length `build` is given). With prefix_tokens > 0, its
    first prefix_tokens words are the shared prefix of group i mod prefix_groups (the case
    prefix caching is for), the rest its own, so prompts of one group share exactly that
    prefix. `build` with blocks: the prompt starts with those blocks' words instead."""

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
        self._cache: dict[tuple, str] = {}
        self._blocks: dict[tuple[int, int], list[str]] = {}

    def least(self) -> int:
        """The shortest prompt it can build: the special tokens, the shared prefix, one word."""
        return self.overhead + self.prefix_tokens + 1

    def __call__(self, index: int) -> str:
        return self.build(index, self.length)

    def build(self, index: int, length: int, blocks: Sequence[int] = (),
              block_tokens: int = 512) -> str:
        """Prompt `index` of exactly `length` tokens; with `blocks` (a trace's hash_ids), its
        words are those blocks' words in order (the last one cut where the length ends), then
        its own."""
        key = (index, length, tuple(blocks), block_tokens if blocks else 0)
        if key not in self._cache:
            if length < (self.overhead + 1 if blocks else self.least()):
                raise ValueError(f"input length {length} leaves no room after {self.overhead} "
                                 "special token(s)" + (f" and the {self.prefix_tokens}-token "
                                                       "shared prefix" if self.prefix_tokens and
                                                       not blocks else ""))
            self._cache[key] = self._build(index, length, blocks, block_tokens)
        return self._cache[key]

    def _block(self, h: int, block_tokens: int) -> list[str]:
        """Block h's words: the same in every prompt that names it."""
        if (h, block_tokens) not in self._blocks:
            shared = random.Random(f"{self.seed}/block/{h}")
            self._blocks[h, block_tokens] = [shared.choice(self.words) for _ in range(block_tokens)]
        return self._blocks[h, block_tokens]

    def _build(self, index: int, length: int, blocks: Sequence[int], block_tokens: int) -> str:
        rng = random.Random(f"{self.seed}/{index}")
        n = length - self.overhead
        if blocks:  # whole blocks are kept; a cut last block's words may be dropped at the end
            fixed, tail = [], []
            for h in blocks:
                room = n - len(fixed) - len(tail)
                words = self._block(h, block_tokens)[:room]
                (fixed if len(words) == block_tokens and not tail else tail).extend(words)
        else:
            shared = random.Random(f"{self.seed}/prefix/{index % self.prefix_groups}")
            fixed, tail = [shared.choice(self.words) for _ in range(self.prefix_tokens)], []
        words = fixed + tail
        words += [rng.choice(self.words) for _ in range(n - len(words))]
        # what may be dropped when the text counts long (its first word, stripped of its space,
        # can split in two): its own words, and with a trace's blocks the last block's end too
        # (blocks that fill the prompt leave no own words); a shared prefix stays whole
        floor = 1 if blocks else len(fixed)
        for _ in range(4 * n + 20):
            text = "".join(words).lstrip()
            have = count_tokens(self.tok, text)
            if have == length:
                return text
            if have > length and len(words) > floor:
                words.pop()
            else:
                words.append(rng.choice(self.words))
        raise ValueError(f"could not build a prompt of exactly {length} tokens")

    def many(self, indices: Sequence[int]) -> list[str]:
        return [self(i) for i in indices]
