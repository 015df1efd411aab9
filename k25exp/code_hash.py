"""What code a figure was measured with: a hash of the files that can change a measurement,
not the commit (a commit that touches only the report, the docs or the tests measures the
same; an uncommitted edit of a runner does not).

The scope: every file git tracks or would track (not ignored) under k25exp/ and conf/, and
pyproject.toml (the dependency pins), less the modules that only read runs (READERS). Each
file enters as its path and its git blob id (sha1 of "blob <size>\\0" + content), so the hash of a
working tree and the hash of a commit's tree (`git ls-tree`) are one function of the same
contents: a run logged before runs carried the hash is given its commit's (the report's
provenance, k25exp.report.provenance), when the commit is in the local repository and the run's
tree was clean. Symlinks (k25exp/conf → conf) are left out: their targets are in scope.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Iterable, Optional

SCOPE = ("k25exp/", "conf/", "pyproject.toml")
# modules that read runs and never run a measurement: editing them changes no figure
READERS = ("k25exp/report/", "k25exp/compare/", "k25exp/commands/",
           "k25exp/tracking/read.py", "k25exp/tracking/ui_links.py",  # the store read back
           "k25exp/runners/campaign_report.py", "k25exp/config/experiments/report.py",
           "conf/experiment/report.yaml")
DESCRIPTION = ("sha256 over path + git blob id of k25exp/, conf/ and pyproject.toml, less the "
               "report, compare and command modules and tracking's read side (k25exp.code_hash)")


def in_scope(path: str) -> bool:
    return path.startswith(SCOPE) and not path.startswith(READERS)


def blob_id(data: bytes) -> str:
    """git's object id of a file's content (`git hash-object`)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tree_hash(entries: Iterable[tuple[str, str]]) -> str:
    """sha256 over the sorted (path, blob id) pairs in scope."""
    h = hashlib.sha256()
    for path, blob in sorted(e for e in entries if in_scope(e[0])):
        h.update(f"{path}\0{blob}\n".encode())
    return h.hexdigest()


def _git(root: Path, *args: str) -> Optional[str]:
    try:
        r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                           timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def working_tree_hash(root: Path) -> Optional[str]:
    """The hash of the files as they are now (committed or not); None outside a git checkout."""
    listed = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    if listed is None:
        return None
    entries = []
    for path in dict.fromkeys(p for p in listed.split("\0") if p and in_scope(p)):
        f = root / path
        if f.is_symlink() or not f.is_file():  # a link (its target is in scope), a deleted file
            continue
        entries.append((path, blob_id(f.read_bytes())))
    return tree_hash(entries)


def commit_hash(root: Path, commit: str) -> Optional[str]:
    """The hash of a commit's tree; None when the repository does not have the commit."""
    listed = _git(root, "ls-tree", "-r", "-z", commit)
    if listed is None:
        return None
    entries = []
    for line in filter(None, listed.split("\0")):
        meta, path = line.split("\t", 1)
        mode, kind, blob = meta.split()
        if kind == "blob" and mode != "120000":  # symlinks left out, as in the working tree
            entries.append((path, blob))
    return tree_hash(entries)
