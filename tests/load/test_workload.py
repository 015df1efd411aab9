"""What a macro job sends (k25exp.load.workload): files read and checked before anything
starts, each prompt exactly the length drawn for it, a trace's prompts sharing its blocks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from k25exp.config.validate import ConfigError, to_typed
from k25exp.load.lengths import BLOCK
from k25exp.load.prompts import count_tokens, load_tokenizer
from k25exp.load.workload import Workload
from k25exp.serving.tiny_model import write_tokenizer
from tests.conftest import compose_cfg


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    write_tokenizer(folder, 4096, seed=0)
    return load_tokenizer(str(folder))


def typed(*overrides):
    return to_typed(compose_cfg("experiment=macro", *overrides), gpu_count=lambda: 0)


def test_each_prompt_is_exactly_its_drawn_length_and_asks_for_its_drawn_output(tok):
    c = typed("experiment.input_tokens=40", "experiment.input_len.dist=uniform",
              "experiment.input_len.range_ratio=0.5", "experiment.output_tokens=12",
              "experiment.output_len.dist=uniform", "experiment.output_len.range_ratio=0.5")
    shaped, trace = Workload(c.experiment, c.server).prompts(tok)
    assert trace is None
    seed = c.experiment.seed
    ins = np.random.default_rng([seed, 0, 0]).integers(20, 61, size=BLOCK)  # [floor 20, ceil 60]
    outs = np.random.default_rng([seed, 1, 0]).integers(6, 19, size=BLOCK)  # [6, 18]
    for i in range(12):
        text, n_in, n_out = shaped(i)
        assert (n_in, n_out) == (ins[i], outs[i])
        assert count_tokens(tok, text) == n_in


def test_a_fixed_shape_sends_the_prompts_it_always_sent(tok):
    from k25exp.load.prompts import PromptBuilder

    c = typed("experiment.input_tokens=32", "experiment.output_tokens=8")
    shaped, _ = Workload(c.experiment, c.server).prompts(tok)
    old = PromptBuilder(tok, 32, c.experiment.seed)
    assert [shaped(i) for i in range(5)] == [(old(i), 32, 8) for i in range(5)]


def test_bad_files_are_named_before_anything_starts(tmp_path):
    lengths = tmp_path / "in.txt"
    lengths.write_text("10\nten\n")
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 4}\n'
                     '{"timestamp": 1, "input_length": -3, "output_length": 4}\n')
    c = typed("experiment.input_len.dist=empirical", f"experiment.input_len.path={lengths}",
              "experiment.load=trace", f"experiment.trace.path={trace}")
    with pytest.raises(ConfigError) as e:
        Workload(c.experiment, c.server)
    msg = str(e.value)
    assert f"experiment.input_len.path={str(lengths)!r}: {lengths}:2: 'ten': expected a positive integer" in msg
    assert f"{trace}:2: input_length=-3: expected a positive integer" in msg


def test_what_cannot_fit_the_launched_server_is_named(tmp_path):
    lengths = tmp_path / "out.txt"
    lengths.write_text("10\n400\n")
    c = typed("server.max_model_len=512", "experiment.output_len.dist=empirical",
              f"experiment.output_len.path={lengths}", "experiment.input_len.dist=normal",
              "experiment.input_len.stddev=10")
    with pytest.raises(ConfigError, match=r"experiment.input_len.dist=normal has no upper bound: set "
                                          r"experiment.input_len.max .* server.max_model_len=512"):
        Workload(c.experiment, c.server)
    c = typed("server.max_model_len=512", "experiment.output_len.dist=empirical",
              f"experiment.output_len.path={lengths}")
    with pytest.raises(ConfigError, match=r"128 \+ 400 = 528, exceeds server.max_model_len=512"):
        Workload(c.experiment, c.server)
    Workload(c.experiment, None)  # an endpoint's length is its own business: nothing to hold it to
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 8}) + "\n"
                             for t, n in ((0, 100), (5, 600), (9, 505))))
    c = typed("server.max_model_len=512", "experiment.load=trace", f"experiment.trace.path={trace}")
    with pytest.raises(ConfigError) as e:
        Workload(c.experiment, c.server)
    assert f"{trace}:2: input_length + output_length = 608" in str(e.value)
    assert f"{trace}:3: input_length + output_length = 513" in str(e.value)
    c = typed("server.max_model_len=512", "experiment.load=trace", f"experiment.trace.path={trace}",
              "experiment.requests=1")
    assert len(Workload(c.experiment, c.server).trace) == 3  # only the first line is sent: it fits


def test_a_traces_prompts_share_their_blocks_and_a_line_too_short_is_named(tok, tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 40, "output_length": 5, "hash_ids": [0, 1, 2]}\n'
                     '{"timestamp": 7, "input_length": 50, "output_length": 6, "hash_ids": [0, 1, 3, 4]}\n'
                     '{"timestamp": 9, "input_length": 30, "output_length": 7, "hash_ids": [5, 6]}\n'
                     '{"timestamp": 9, "input_length": 1, "output_length": 7}\n')
    c = typed("experiment.load=trace", f"experiment.trace.path={trace}", "experiment.trace.block_tokens=16")
    _, tp = Workload(c.experiment, c.server).prompts(tok)
    ids = []
    for i, (n_in, n_out) in enumerate(((40, 5), (50, 6), (30, 7))):
        text, a, b = tp(i)
        assert (a, b) == (n_in, n_out) and count_tokens(tok, text) == n_in
        ids.append(tok(text, add_special_tokens=True)["input_ids"])
        assert tp(i + 4) == (text, a, b)  # a repeat replays the same line (i mod 4)
    bos = count_tokens(tok, "")
    assert ids[0][:bos + 32] == ids[1][:bos + 32]  # blocks 0 and 1, shared
    assert ids[0][bos + 32:bos + 34] != ids[1][bos + 32:bos + 34]  # then blocks 2 and 3
    assert ids[2][bos:bos + 2] != ids[0][bos:bos + 2]
    with pytest.raises(ConfigError, match=rf"{trace}:4: input_length=1: .*expected at least {bos + 1}"):
        tp(3)


def test_the_tags_say_what_the_lengths_were_drawn_from(tmp_path):
    f = tmp_path / "in.txt"
    f.write_text("5\n7\n")
    c = typed("experiment.input_len.dist=empirical", f"experiment.input_len.path={f}",
              "experiment.output_len.dist=lognormal", "experiment.output_len.sigma=0.4",
              "experiment.output_len.max=100")
    tags = Workload(c.experiment, c.server).describe()
    assert tags["macro.input_len"].startswith(f"empirical, 2 lengths from {f} (sha256 ")
    assert tags["macro.output_len"] == "lognormal, mean 64, sigma 0.4, clipped to [1, 100]"
    c = typed()
    assert Workload(c.experiment, c.server).describe() == {"macro.input_len": "fixed 128",
                                                           "macro.output_len": "fixed 64"}


def test_a_sessions_history_from_a_lengths_file_is_held_against_the_context(tok, tmp_path):
    lengths = tmp_path / "in.txt"
    lengths.write_text("10\n50\n")
    # 3 turns × (the longest message 50 + answer 64) = 342 tokens > 300; one turn's 114 would fit
    c = typed("server.max_model_len=300", "experiment.load=sessions", "experiment.input_len.dist=empirical",
              f"experiment.input_len.path={lengths}")
    with pytest.raises(ConfigError, match=r"experiment.sessions.turns=3 × \(the longest message \+ answer "
                                          r".*50 \+ 64\) = 342 tokens exceeds server.max_model_len=300"):
        Workload(c.experiment, c.server)
    c = typed("server.max_model_len=342", "experiment.load=sessions", "experiment.input_len.dist=empirical",
              f"experiment.input_len.path={lengths}", "experiment.sessions.think_time_s=0.5",
              "experiment.sessions.think_dist=exponential", "experiment.input_tokens=24")
    work = Workload(c.experiment, c.server)
    assert work.describe()["macro.sessions"] == (
        "3 turns a session, max(c, ceil(the level's requests / turns)) sessions a level; each "
        "turn's prompt the session's history as token ids (its first prompt, each answer, each new "
        "message) + a new message of input_len; think time before each later turn exponential, "
        "mean 0.5 s (seeded per session)")
    plan = work.sessions(tok)  # its messages' lengths are the file's
    assert {len(plan.message(s, t)) for s in range(4) for t in (1, 2, 3)} <= {10, 50}
    assert Workload(typed().experiment, None).sessions(tok) is None  # only with load=sessions
