"""The trace files `k25exp analyze` reads from the paths it is given."""

from __future__ import annotations

import pytest

from k25exp.traces.files import trace_files


def test_files_as_given_and_folders_searched(tmp_path):
    (tmp_path / "run" / "sub").mkdir(parents=True)
    for name in ("run/w.rank1.pt.trace.json.gz", "run/sub/w.rank0.pt.trace.json",
                 "run/x.async_llm.pt.trace.json.gz", "run/notes.txt"):
        (tmp_path / name).write_text("{}")
    given = tmp_path / "run" / "notes.txt"
    assert trace_files([tmp_path / "run", given]) == [
        tmp_path / "run/sub/w.rank0.pt.trace.json", tmp_path / "run/w.rank1.pt.trace.json.gz",
        given]


def test_a_missing_path_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'nope'} does not exist"):
        trace_files([tmp_path / "nope"])
