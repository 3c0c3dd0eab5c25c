"""nox sessions: tests, lint and benchmarks. They run in the current environment."""

from __future__ import annotations

import logging
import os
import sys

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["tests", "lint"]

# `session.run("python")` would find whatever `python` is on PATH, not this interpreter.
PYTHON = sys.executable

# nox looks for uv even when sessions make no virtualenv, and says it did not find it on
# every run; with `venv_backend="none"` that line only misleads.
UV_NOT_FOUND = "uv binary not found."
logging.getLogger("nox").addFilter(lambda record: record.getMessage() != UV_NOT_FOUND)


WORKERS_ENV = "TREXO_TEST_WORKERS"
SUITE_WORKERS = "4"
"""pytest-xdist workers for the whole suite. Real-process tests spend most of their time
waiting on other processes, so more workers than cores overlap those waits; measured on a
2-core machine, the suite took 570 s in one process, ~330 s with 4 workers, and more workers
only slowed the CPU-bound part (see docs/development.md)."""
FAST_WORKERS = "2"
"""The fast tier computes rather than waits: one worker per core."""


def _workers(default: str) -> str:
    return os.environ.get(WORKERS_ENV, default)


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite, both tiers, in parallel workers (what CI runs); not the tests that
    load the machine on purpose (`tests-busy`)."""
    workers = _workers(SUITE_WORKERS)
    session.run(
        PYTHON,
        "-m",
        "pytest",
        "-m",
        "not busy",
        "-n",
        workers,
        "--dist",
        "loadgroup",
        *session.posargs,
    )


@nox.session(name="tests-busy")
def tests_busy(session: nox.Session) -> None:
    """The tests that load the machine on purpose (4 spinning processes per core), alone,
    one at a time: failure detection and deadlines on a busy machine."""
    session.run(PYTHON, "-m", "pytest", "-m", "busy", "-p", "no:xdist", "-s", *session.posargs)


@nox.session(name="tests-fast")
def tests_fast(session: nox.Session) -> None:
    """The fast tier: every test that starts no process (tests/tiers.py has the rule)."""
    workers = _workers(FAST_WORKERS)
    session.run(PYTHON, "-m", "pytest", "-m", "not slow", "-n", workers, *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (style, imports, ASYNC rules) and mypy (strict) on the package."""
    session.run(PYTHON, "-m", "ruff", "check", "trexo", "tests", "bench", "noxfile.py")
    session.run(PYTHON, "-m", "ruff", "format", "--check", "trexo", "tests", "bench", "noxfile.py")
    session.run(PYTHON, "-m", "mypy", "trexo")


@nox.session(name="bench-runner")
def bench_runner(session: nox.Session) -> None:
    """Runner spawn-to-ready, graceful stop, and orphan exit after a parent SIGKILL."""
    session.run(PYTHON, "bench/bench_runner.py", *session.posargs)


@nox.session(name="bench-serving")
def bench_serving(session: nox.Session) -> None:
    """Serving overhead: in-process mlx-lm versus a real `trexo run` (TTFT, decode, aggregate)."""
    session.run(PYTHON, "bench/bench_serving.py", *session.posargs)


@nox.session(name="bench-election")
def bench_election(session: nox.Session) -> None:
    """Re-election after a master SIGKILL / SIGSTOP, N in {2, 3, 5}: detection to API ready."""
    session.run(PYTHON, "bench/bench_election.py", *session.posargs)


@nox.session(name="bench-sampling")
def bench_sampling(session: nox.Session) -> None:
    """A request with a top_p / min_p value never seen before, against a seen one."""
    session.run(PYTHON, "bench/bench_sampling.py", *session.posargs)


@nox.session(name="bench-failover")
def bench_failover(session: nox.Session) -> None:
    """A master SIGKILL with a loaded model: first token of a new chat, in-flight streams."""
    session.run(PYTHON, "bench/bench_failover.py", *session.posargs)


@nox.session(name="bench-sharding")
def bench_sharding(session: nox.Session) -> None:
    """One model split over 2-3 nodes: time per token and TTFT against one node; teardown."""
    session.run(PYTHON, "bench/bench_sharding.py", *session.posargs)


@nox.session(name="bench-download")
def bench_download(session: nox.Session) -> None:
    """Model download from a local fake hub: trexo against huggingface_hub; place to first token."""
    session.run(PYTHON, "bench/bench_download.py", *session.posargs)


@nox.session(name="bench-private-links")
def bench_private_links(session: nox.Session) -> None:
    """Encrypted peer links against the plain ones of the commit before (link-up, decode across
    a link, failover, and the crypto per message)."""
    session.run(PYTHON, "bench/bench_private_links.py", *session.posargs)


@nox.session(name="bench-soak")
def bench_soak(session: nox.Session) -> None:
    """100,000 short chats on one node, then three: master RSS, history, disk, joiner catch-up."""
    session.run(PYTHON, "bench/bench_soak.py", *session.posargs)
