"""The tests' warm interpreter (tests/warm_python.py) outlives clients killed mid-request: a
wall-clock kill of torchrun can take a rank's client down between its connect and its request,
and the server used to die of it, failing every later job of its pytest worker."""

from __future__ import annotations

import socket
import struct
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, warm_python

pytestmark = pytest.mark.e2e


def test_the_server_outlives_clients_that_leave_mid_request():
    exe = warm_python()
    if not exe.endswith("/python"):
        pytest.skip("K25EXP_TEST_COLD=1: no warm server")
    sock = str(Path(exe).parent / "socket")
    gone = socket.socket(socket.AF_UNIX)  # connects, sends nothing, leaves
    gone.connect(sock)
    gone.close()
    half = socket.socket(socket.AF_UNIX)  # announces 100 bytes, sends 10, leaves
    half.connect(sock)
    socket.send_fds(half, [struct.pack("!I", 100)], [0, 1, 2])
    half.sendall(b'{"argv": [')
    half.close()
    p = subprocess.run([exe, "-m", "platform"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "Linux" in p.stdout, p.stderr[-2000:]
