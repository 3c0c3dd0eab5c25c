"""A snapshot: the state a session's events produce up to an index, standing for them."""

from __future__ import annotations

import attrs

from trexo.types.events import IndexedEvent
from trexo.types.session import Session
from trexo.types.state import State


@attrs.frozen
class StateSnapshot:
    """`state` is what applying session `session`'s events 0..`index` to `State()` gives.

    The master keeps only the newest snapshot and the events after it; a replay from before
    `index` is answered with this followed by those events. On disk it is the file a
    session's log is rolled at.
    """

    session: Session
    index: int
    state: State


GlobalItem = IndexedEvent | StateSnapshot
"""What travels on `global_events`: the session's events, and snapshots answering replays."""
