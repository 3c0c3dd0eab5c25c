"""The test tiers, in one place.

A test is **slow** when it starts a process — a `trexo run` node, a runner, a download
process, `ip` for a lab of hosts, a browser, curl — or uses a fixture that did, or when it
is a long matrix (every zoo architecture split every way: minutes of CPU). Everything
else is **fast**: pure cores, services on `MockClock`, in-process sockets and nodes, the HTTP
layer over `FakeNode`, an engine loaded in the test's own process.

`nox -s tests-fast` runs the fast tier (`-m "not slow"`); `nox -s tests` runs both, in
parallel pytest-xdist workers, but not the tests that load the machine on purpose
(`BUSY_PATHS`, `nox -s tests-busy`). `SLOW_PATHS` is the rule: a file or folder listed there is
slow, everything else fast, and a fast test that starts a process fails, naming this list
(`StartsNoProcess`), so the rule cannot drift from the tree.

Slow tests that share a process through a module- or session-scoped fixture (a shared node,
a module's cluster) run on one worker, grouped by that fixture, so the process starts once;
other tests are spread one by one. Slow tests are collected first: the long ones start
while the fast ones fill the gaps, instead of ending the run on one busy worker.
"""

from __future__ import annotations

import os
import sys
from pathlib import PurePath
from typing import Any

import pytest

SLOW_PATHS = (
    "tests/e2e/",  # `trexo run` nodes and clusters on loopback
    "tests/lab/",  # network namespaces (`ip`), a `trexo run` on each host
    "tests/dashboard/",  # headless Chromium against real nodes
    "tests/runner/test_batching.py",  # runner processes
    "tests/runner/test_rank_child.py",
    "tests/runner/test_rank_group.py",
    "tests/runner/test_runner_child.py",
    "tests/runner/test_runner_process.py",
    "tests/runner/test_runner_spawn_fds.py",
    "tests/hub/test_downloads.py",  # the download process
    "tests/hub/test_progress_view.py",
    "tests/engine/test_blas_setup.py",  # a fresh interpreter per check
    "tests/test_schema_guard.py",  # a JSON schema compiler process per schema
    "tests/zoo/test_zoo_serving.py",  # a `trexo run` per zoo model
    "tests/zoo/test_zoo_pipeline_ranks.py",  # runner processes, one per rank
    "tests/zoo/test_zoo_tensor_ranks.py",  # runner processes, one per rank
    "tests/zoo/test_zoo_cluster.py",  # 3 `trexo run` nodes per architecture
    "tests/zoo/test_zoo_pipeline.py",  # the matrix: every architecture over 2 and 3 ranks
    "tests/test_machine_load.py",  # spinning processes
    "tests/test_progress_processes.py",  # processes that work or sleep
    "tests/busy/",
)
BUSY_PATHS = ("tests/busy/",)
"""Tests that load the machine on purpose (`tests/machine_load.py`): marked `busy`, left out
of `nox -s tests` (they would slow every test beside them) and run alone by
`nox -s tests-busy`."""

SHARED_SCOPES = ("module", "package", "session")

SPAWN_EVENTS = ("subprocess.Popen", "os.posix_spawn", "os.fork", "os.exec", "os.system")
"""The audit events (PEP 578) by which Python starts a process."""

INCIDENTAL_PROGRAMS = frozenset({"ldconfig", "gcc", "cc", "ld", "objdump", "uname", "file"})
"""What the standard library runs to answer a question: `ctypes.util.find_library` (trio asks
on first use of a thread) and `platform` (the official clients describe the machine in a
header). Over in milliseconds, and not what the tier rule is about."""


def is_slow_path(path: str) -> bool:
    """Whether a test file (or a fixture's base id) under the rootdir is in the slow tier."""
    posix = PurePath(path).as_posix()
    return any(posix == p.rstrip("/") or posix.startswith(p) for p in SLOW_PATHS)


def shared_process_fixture(item: pytest.Item) -> str | None:
    """The widest-scoped fixture of a slow path that `item` uses, as `baseid::name`: tests
    sharing it must share a worker, or each worker starts its own copy of the process."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for name in info.names_closure:
        for definition in info.name2fixturedefs.get(name, ()):
            if definition.scope in SHARED_SCOPES and is_slow_path(definition.baseid + "/"):
                return f"{definition.baseid}::{name}"
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if any(_relative(config, item).startswith(p) for p in BUSY_PATHS):
            item.add_marker(pytest.mark.busy)
        if is_slow_path(_relative(config, item)):
            item.add_marker(pytest.mark.slow)
            group = shared_process_fixture(item)
            if group is not None:
                item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def _relative(config: pytest.Config, item: pytest.Item) -> str:
    return PurePath(os.path.relpath(item.path, config.rootpath)).as_posix()


class StartsNoProcess:
    """Records every process a fast test starts (an audit hook cannot be removed, so one
    is installed for the session and asks which test is running)."""

    def __init__(self) -> None:
        self.running: pytest.Item | None = None
        self.started: list[str] = []
        sys.addaudithook(self._audit)

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if self.running is None or event not in SPAWN_EVENTS:
            return
        program = _program(event, args)
        if PurePath(program).name not in INCIDENTAL_PROGRAMS:
            self.started.append(program)

    def watch(self, item: pytest.Item) -> None:
        """From `item`'s setup on: record what it starts, unless it is slow."""
        self.running = None if item.get_closest_marker("slow") else item
        self.started = []

    def verdict(self) -> None:
        """Fail the fast test that started a process (called at its teardown)."""
        started, self.running, self.started = self.started, None, []
        if started:
            pytest.fail(
                f"a fast test started a process ({', '.join(started)}): list its file in "
                "SLOW_PATHS (tests/tiers.py), or keep it in-process",
                pytrace=False,
            )


def _program(event: str, args: tuple[Any, ...]) -> str:
    """The program an audit event starts, as best the event says."""
    if event == "subprocess.Popen" and len(args) > 1:
        argv = args[1]
        first = argv if isinstance(argv, str | bytes) else next(iter(argv), "")
        return os.fsdecode(args[0] or first)
    if event in ("os.posix_spawn", "os.exec") and args:
        return os.fsdecode(args[0])
    return event
