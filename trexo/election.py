"""The election: decides the session (master id + clock), DESIGN §2.3.

This node's clock is persisted in the data directory, so a restarted node never campaigns
with a stale clock. Each decided `Session` is sent on `sessions` for the session supervisor.
A node alone elects itself at once: a campaign ends as soon as every connected peer has
answered, and with no peers that is immediately.
"""

from __future__ import annotations

import logging
from pathlib import Path

import trio

from trexo.net.router import Router
from trexo.types.ids import NodeId
from trexo.types.session import Session

log = logging.getLogger(__name__)

CLOCK_FILE = "election_clock"


def load_clock(data_dir: Path) -> int:
    try:
        return int((data_dir / CLOCK_FILE).read_text().strip())
    except (FileNotFoundError, ValueError):
        return 0


def store_clock(data_dir: Path, clock: int) -> None:
    """Write atomically: a crash mid-write must not lose the clock."""
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = data_dir / f"{CLOCK_FILE}.tmp"
    tmp.write_text(f"{clock}\n")
    tmp.replace(data_dir / CLOCK_FILE)


class Election:
    def __init__(
        self,
        router: Router,
        data_dir: Path,
        sessions: trio.MemorySendChannel[Session],
    ) -> None:
        self._router = router
        self._data_dir = data_dir
        self._sessions = sessions
        self.node_id: NodeId = router.node_id
        self.session: Session | None = None

    async def run(
        self, *, task_status: trio.TaskStatus[Election] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with self._sessions:
            clock = await trio.to_thread.run_sync(load_clock, self._data_dir) + 1
            await trio.to_thread.run_sync(store_clock, self._data_dir, clock)
            task_status.started(self)
            await self._decide(Session(clock, self.node_id))
            await trio.sleep_forever()

    async def _decide(self, session: Session) -> None:
        log.info("session %d: master is %s", session.clock, session.master_id)
        self.session = session
        await self._sessions.send(session)
