"""The node's file descriptor budget: the soft limit is raised; exhaustion is waited out."""

from __future__ import annotations

import logging
import os
import resource
from collections.abc import Iterator

import pytest
import trio
from fd_exhaustion import exhausted_fds

from tests.waiting import wait_until
from trexo.fd_limit import fd_soft_limit, is_fd_exhaustion, raise_fd_limit, retry_on_fd_exhaustion

TEST_TIMEOUT_S = 10.0


@pytest.fixture
def restored_limit() -> Iterator[tuple[int, int]]:
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield limits
    resource.setrlimit(resource.RLIMIT_NOFILE, limits)


def test_raise_fd_limit_raises_the_soft_limit_to_the_hard_one(
    restored_limit: tuple[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    _, hard = restored_limit
    low = min(256, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    caplog.set_level(logging.INFO, logger="trexo.fd_limit")
    limit = raise_fd_limit(fallback=min(1024, hard))
    assert (limit.before, limit.hard) == (low, hard)
    assert limit.soft == fd_soft_limit() == hard
    assert f"file descriptor limit: {hard} (was {low}" in caplog.text
    # Never lowered: a second call leaves it as it is.
    assert raise_fd_limit().soft == hard


def _open_devnull() -> int:
    return os.open(os.devnull, os.O_RDONLY)


async def test_retry_waits_until_descriptors_are_free(caplog: pytest.LogCaptureFixture) -> None:
    results: list[int] = []

    async def open_patiently() -> None:
        results.append(
            await retry_on_fd_exhaustion(
                _open_devnull, what="test open", attempts=50, interval=0.05
            )
        )

    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            with exhausted_fds():
                nursery.start_soon(open_patiently)
                await wait_until(
                    lambda: "(attempt 3 of 50)" in caplog.text,
                    timeout=5.0,
                    what="the third failed open",
                )
                assert not results  # still out of descriptors: still waiting
    [fd] = results
    os.close(fd)
    warnings = [r for r in caplog.records if "test open: Too many open files" in r.message]
    assert warnings and all(r.exc_info is None for r in warnings)  # lines, not tracebacks


async def test_retry_gives_up_after_its_attempts(caplog: pytest.LogCaptureFixture) -> None:
    with trio.fail_after(TEST_TIMEOUT_S), exhausted_fds(), pytest.raises(OSError) as raised:
        await retry_on_fd_exhaustion(_open_devnull, what="test open", attempts=3, interval=0.01)
    assert is_fd_exhaustion(raised.value)
    assert "giving up after 3 attempts" in caplog.text


async def test_other_errors_are_not_retried() -> None:
    def missing() -> None:
        open("/nonexistent/trexo")  # noqa: SIM115

    with pytest.raises(FileNotFoundError):
        await retry_on_fd_exhaustion(missing, what="x", attempts=5, interval=10.0)
