"""The client's event loop: asyncio's own or uvloop (experiment.client_event_loop).

uvloop runs the same coroutines with its socket and timer handling in C: measured here
(benchmarks.client_capacity) it takes 10-20 % less client CPU per streamed chunk than
asyncio's loop. `auto` picks it when it is importable (vLLM installs it), asyncio otherwise;
`which()` says what a run actually got, for its tag.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Awaitable, TypeVar

T = TypeVar("T")
CHOICES = ("auto", "asyncio", "uvloop")


def which(name: str) -> str:
    """The loop `name` resolves to here: 'uvloop' or 'asyncio'. Asking for uvloop where it
    is missing is an error, not a silent fallback: the figures would be another client's."""
    if name not in CHOICES:
        raise ValueError(f"client event loop {name!r}: expected one of {', '.join(CHOICES)}")
    if name == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if name == "uvloop":
            raise ValueError("experiment.client_event_loop=uvloop, but uvloop is not installed "
                             "(pip install uvloop, or choose auto / asyncio)") from None
        return "asyncio"
    return "uvloop"


def new_event_loop(name: str) -> asyncio.AbstractEventLoop:
    if which(name) == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(main: Awaitable[T], name: str) -> T:
    """asyncio.run on the chosen loop (the same cleanup: pending tasks cancelled, async
    generators closed)."""
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=lambda: new_event_loop(name)) as runner:
            return runner.run(main)
    if which(name) == "uvloop":  # Python 3.10: no Runner; uvloop's policy for asyncio.run
        import uvloop

        uvloop.install()
    return asyncio.run(main)


def version(name: str) -> str:
    """'uvloop 0.21.0' or 'asyncio': for the run's tag."""
    if which(name) == "uvloop":
        import uvloop

        return f"uvloop {uvloop.__version__}"
    return "asyncio"
