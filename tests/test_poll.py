"""k25exp.poll: the one wait/retry loop (deadline, attempt budget, errors retried or not)."""

from __future__ import annotations

import asyncio
import time

import pytest

from k25exp.poll import PollTimeout, await_until, wait_until


def test_returns_the_first_truthy_value():
    seen = []
    assert wait_until(lambda: seen.append(1) or (len(seen) >= 3 and "ok"), 5, 0.01) == "ok"
    assert len(seen) == 3


def test_timeout_names_what_was_awaited_and_the_last_error():
    def boom():
        raise ConnectionError("refused")

    t = time.monotonic()
    with pytest.raises(PollTimeout, match=r"the thing: not done after 0.2 s; last try: "
                                          r"ConnectionError: refused"):
        wait_until(boom, 0.2, 0.05, "the thing", retry_on=(ConnectionError,))
    assert time.monotonic() - t >= 0.19  # it waited its limit (how much longer: the scheduler's)


def test_other_errors_end_the_wait_at_once():
    with pytest.raises(KeyError):
        wait_until(lambda: {}["x"], 5, 0.01, retry_on=(ConnectionError,))


def test_attempt_budget_and_quiet_timeout():
    n = []
    with pytest.raises(PollTimeout, match="after 3 tries"):
        wait_until(lambda: n.append(1), None, 0, "x", attempts=3)
    assert len(n) == 3
    assert wait_until(lambda: 0, 0.05, 0.01, raise_timeout=False) == 0


def test_async_variant_sleeps_on_the_loop():
    n = []

    async def probe():
        n.append(1)
        return len(n) == 2

    assert asyncio.run(await_until(probe, 5, 0.01)) is True
    assert asyncio.run(await_until(lambda: asyncio.sleep(0, 0), 0.05, 0.01,
                                   raise_timeout=False)) == 0
