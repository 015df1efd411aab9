"""The one poll / retry loop of k25exp: try until a condition holds, a deadline passes or the
attempts run out, with a fixed pause between tries.

`wait_until` for plain code, `await_until` for an event loop (the same schedule, an asyncio
sleep between tries). A try that raises one of `retry_on` counts as a failed try (its error is
named when time runs out); any other exception ends the wait at once.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, Iterator, Optional, TypeVar

T = TypeVar("T")


class PollTimeout(TimeoutError):
    """The condition did not hold in time; `last` is the last try's value or error."""

    def __init__(self, message: str, last: object = None):
        super().__init__(message)
        self.last = last


def _pauses(timeout_s: Optional[float], interval_s: float, attempts: Optional[int]) -> Iterator[float]:
    """The pause before each next try; ends when the deadline or the attempt budget is spent
    (the first try is always made)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    n = 1
    while attempts is None or n < attempts:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return
        n += 1
        yield interval_s if left is None else min(interval_s, left)


class _Poll:
    """One wait's state: what counts as a failed try, when to stop, what to answer."""

    def __init__(self, what, timeout_s, interval_s, attempts, retry_on, raise_timeout):
        self.what, self.timeout_s, self.attempts = what, timeout_s, attempts
        self.retry_on, self.raise_timeout = retry_on, raise_timeout
        self.pauses = _pauses(timeout_s, interval_s, attempts)
        self.result = None

    def attempt(self, fn):
        try:
            return fn(), None
        except self.retry_on as e:
            return None, e

    async def attempt_async(self, fn):
        try:
            return await fn(), None
        except self.retry_on as e:
            return None, e

    def after(self, value, error) -> Optional[float]:
        """The pause before the next try; None when done (the answer is in `result`)."""
        self.result = value
        if value:
            return None
        pause = next(self.pauses, None)
        if pause is None and self.raise_timeout:
            limit = (f"after {self.timeout_s:g} s" if self.timeout_s is not None
                     else f"after {self.attempts} tries")
            last = f"; last try: {type(error).__name__}: {error}" if error is not None else ""
            raise PollTimeout(f"{self.what}: not done {limit}{last}",
                              error if error is not None else value)
        return pause


def wait_until(fn: Callable[[], T], timeout_s: Optional[float] = None, interval_s: float = 0.5,
               what: str = "condition", *, attempts: Optional[int] = None,
               retry_on: tuple[type[BaseException], ...] = (),
               raise_timeout: bool = True) -> T:
    """fn()'s first truthy value. Out of time or tries: PollTimeout naming `what`, or with
    raise_timeout=False the last (falsy) value."""
    poll = _Poll(what, timeout_s, interval_s, attempts, retry_on, raise_timeout)
    while (pause := poll.after(*poll.attempt(fn))) is not None:
        time.sleep(pause)
    return poll.result


async def await_until(fn: Callable[[], Awaitable[T]], timeout_s: Optional[float] = None,
                      interval_s: float = 0.5, what: str = "condition", *,
                      attempts: Optional[int] = None,
                      retry_on: tuple[type[BaseException], ...] = (),
                      raise_timeout: bool = True) -> T:
    """wait_until for coroutines: `await fn()`, asyncio sleeps between tries."""
    poll = _Poll(what, timeout_s, interval_s, attempts, retry_on, raise_timeout)
    while (pause := poll.after(*await poll.attempt_async(fn))) is not None:
        await asyncio.sleep(pause)
    return poll.result
