"""Prompts of exact token lengths, counted by the served tokenizer as vLLM counts them."""

from __future__ import annotations

import pytest

from k25exp.load.prompts import PromptBuilder, count_tokens, load_tokenizer
from k25exp.serving.tiny_model import write_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    write_tokenizer(folder, 4096, seed=0)
    return load_tokenizer(str(folder))


@pytest.mark.parametrize("length", [2, 17, 128, 1000])
def test_every_prompt_has_the_exact_length(tok, length):
    b = PromptBuilder(tok, length, seed=3)
    prompts = [b(i) for i in range(20)]
    assert {count_tokens(tok, p) for p in prompts} == {length}
    assert len(set(prompts)) == 20


def test_prompts_depend_only_on_seed_and_index(tok):
    a, b, c = PromptBuilder(tok, 64, 0), PromptBuilder(tok, 64, 0), PromptBuilder(tok, 64, 1)
    assert [a(i) for i in range(5)] == [b(i) for i in range(5)]
    assert a(0) != c(0) and a(0) != a(1)


def test_a_length_with_no_room_is_an_error(tok):
    with pytest.raises(ValueError, match="no room"):
        PromptBuilder(tok, 1, 0)  # the BOS alone is one token


def test_prompts_of_a_group_share_exactly_their_prefix(tok):
    b = PromptBuilder(tok, 64, seed=2, prefix_tokens=40, prefix_groups=3)
    ids = [tok(b(i), add_special_tokens=True)["input_ids"] for i in range(9)]
    assert {len(x) for x in ids} == {64}
    bos = count_tokens(tok, "")
    for i in range(9):
        for j in range(i + 1, 9):
            common = next((k for k, (a, c) in enumerate(zip(ids[i], ids[j])) if a != c), 64)
            if i % 3 == j % 3:  # same group: the 40 prefix tokens (after the BOS), then apart
                assert 40 + bos <= common < 64
            else:               # other groups: apart right after the BOS (beyond chance)
                assert common <= bos + 1
    with pytest.raises(ValueError, match="no room for a prompt's own part"):
        PromptBuilder(tok, 16, 0, prefix_tokens=15)
