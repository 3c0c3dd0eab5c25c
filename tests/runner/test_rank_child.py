"""A rank's runner child on its own: what bounds it when nothing else can."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from trexo import wire
from trexo.runner.compute import INIT_GIVE_UP_MARGIN_S
from trexo.types.ipc import LoadModel, StatusReport, ToRunner
from trexo.types.runner_status import RunnerLoading
from trexo.types.shard import ShardSpec

from .group_helpers import loopback_group
from .helpers import TEST_TIMEOUT_S
from .test_runner_child import read_message, runner_child

INIT_TIMEOUT_S = 0.5


def test_a_rank_stuck_joining_its_group_ends_itself_if_nobody_stops_it(tmp_path: Path) -> None:
    # No peer ever comes. `mx.distributed.init` holds the GIL meanwhile, so the runner could
    # not even see its parent leave: only its own timer ends it (the parent just waits here).
    load = LoadModel(
        str(tmp_path / "model"),  # never read: the rank does not get past joining
        ShardSpec(0, 2, 0, 2),
        group=loopback_group(2),
        group_init_timeout=INIT_TIMEOUT_S,
    )
    with runner_child(tmp_path) as (proc, sock):
        sock.sendall(wire.encode_frame(wire.to_json(load, ToRunner)))
        sock.settimeout(TEST_TIMEOUT_S)
        assert read_message(sock) == StatusReport(RunnerLoading(0.0))  # sent just before init
        started = time.monotonic()
        returncode = proc.wait(TEST_TIMEOUT_S)
        elapsed = time.monotonic() - started
    assert returncode == -signal.SIGALRM
    assert elapsed < INIT_TIMEOUT_S + INIT_GIVE_UP_MARGIN_S + 1.0
    assert "rank 0 of 2: joining group epoch 0" in (tmp_path / "runner.err").read_text()
