"""A simulated cluster of election cores: links, in-flight messages, membership, time.

Each ordered pair of linked nodes has a FIFO of messages in flight (a websocket keeps order
on one link; nothing orders two links). Everything that can happen next is an *action*:
deliver the head of one FIFO, tell one node that its set of linked peers changed (each side
of a link learns it separately, as with two transports), or fire one node's due timer. A
scheduler picks the next action: the first one (deterministic tests) or a random one
(property tests). Time moves only when nothing else can happen, to the earliest deadline:
delivery is instant next to the election's windows.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence

import attrs

from trexo.config import ElectionConfig
from trexo.election.core import ElectionCore
from trexo.election.outputs import Note, Outputs
from trexo.types.election import ElectionMessage
from trexo.types.ids import NodeId
from trexo.types.session import Session

CONFIG = ElectionConfig(boot_grace=0.3, campaign_window=0.5)
MAX_ACTIONS = 20_000


@attrs.frozen
class Deliver:
    src: NodeId
    dst: NodeId


@attrs.frozen
class Notify:
    node: NodeId


@attrs.frozen
class Fire:
    node: NodeId


Action = Deliver | Notify | Fire
Scheduler = Callable[[Sequence[Action]], Action]


def first(actions: Sequence[Action]) -> Action:
    return actions[0]


def randomly(rng: random.Random) -> Scheduler:
    return lambda actions: rng.choice(list(actions))


class SimCluster:
    def __init__(self, config: ElectionConfig = CONFIG) -> None:
        self.config = config
        self.now = 0.0
        self.cores: dict[NodeId, ElectionCore] = {}
        self.links: set[frozenset[NodeId]] = set()
        self.in_flight: dict[tuple[NodeId, NodeId], deque[ElectionMessage]] = {}
        self.stale_views: list[NodeId] = []  # nodes whose core has not seen a link change yet
        self.sent: list[tuple[NodeId, NodeId, ElectionMessage]] = []  # every message queued
        self.notes: dict[NodeId, list[Note]] = {}
        self.decided: dict[NodeId, list[Session]] = {}  # sessions each node handed on
        self.persisted: dict[NodeId, int] = {}

    # --- nodes and links ---------------------------------------------------------------------

    def add(
        self,
        name: str,
        *,
        clock: int = 0,
        commands_seen: int = 0,
        force_master: bool = False,
    ) -> ElectionCore:
        node = NodeId(name)
        self.cores[node] = ElectionCore(
            node,
            clock=clock,
            config=self.config,
            commands_seen=lambda: commands_seen,
            force_master=force_master,
        )
        self.notes[node] = []
        self.decided[node] = []
        self.persisted[node] = clock
        return self.cores[node]

    def start(self, *names: str) -> None:
        for name in names:
            node = NodeId(name)
            self._apply(node, self.cores[node].start(self.now, self.linked_to(node)))

    def link(self, a: str, b: str) -> None:
        self.links.add(frozenset({NodeId(a), NodeId(b)}))
        self._stale(NodeId(a), NodeId(b))

    def unlink(self, a: str, b: str) -> None:
        x, y = NodeId(a), NodeId(b)
        self.links.discard(frozenset({x, y}))
        self.in_flight.pop((x, y), None)
        self.in_flight.pop((y, x), None)
        self._stale(x, y)

    def mesh(self, *names: str) -> None:
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                self.link(a, b)

    def crash(self, name: str) -> None:
        node = NodeId(name)
        for other in self.linked_to(node):
            self.unlink(name, other)
        del self.cores[node]
        if node in self.stale_views:
            self.stale_views.remove(node)

    def linked_to(self, node: NodeId) -> frozenset[NodeId]:
        return frozenset(other for link in self.links if node in link for other in link - {node})

    def _stale(self, *nodes: NodeId) -> None:
        for node in nodes:
            if node in self.cores and node not in self.stale_views:
                self.stale_views.append(node)

    # --- running -----------------------------------------------------------------------------

    def actions(self) -> list[Action]:
        """What can happen now; in the order a deterministic run takes them."""
        ready: list[Action] = [Notify(node) for node in self.stale_views]
        ready += [Deliver(src, dst) for (src, dst), queue in self.in_flight.items() if queue]
        ready += [
            Fire(node)
            for node, core in self.cores.items()
            if core.deadline is not None and core.deadline <= self.now
        ]
        return ready

    def step(self, action: Action) -> None:
        match action:
            case Notify(node=node):
                self.stale_views.remove(node)
                core = self.cores[node]
                self._apply(node, core.peers_changed(self.now, self.linked_to(node)))
            case Deliver(src=src, dst=dst):
                message = self.in_flight[(src, dst)].popleft()
                self._apply(dst, self.cores[dst].receive(self.now, src, message))
            case Fire(node=node):
                self._apply(node, self.cores[node].timer(self.now))

    def settle(self, schedule: Scheduler = first, *, max_time: float = 60.0) -> None:
        """Run until nothing is in flight and no timer is due, moving time as needed."""
        for _ in range(MAX_ACTIONS):
            ready = self.actions()
            if ready:
                self.step(schedule(ready))
                continue
            deadlines = [c.deadline for c in self.cores.values() if c.deadline is not None]
            if not deadlines:
                return
            self.now = max(self.now, min(deadlines))
            assert self.now <= max_time, "the election never settles"
        raise AssertionError(f"no quiescence after {MAX_ACTIONS} actions")

    def deliver_all(self, schedule: Scheduler = first) -> None:
        """Run without moving time (what happens "at once")."""
        for _ in range(MAX_ACTIONS):
            ready = self.actions()
            if not ready:
                return
            self.step(schedule(ready))
        raise AssertionError(f"no quiescence after {MAX_ACTIONS} actions")

    def advance(self, seconds: float, schedule: Scheduler = first) -> None:
        """Let `seconds` pass, firing every timer due on the way."""
        end = self.now + seconds
        while True:
            self.deliver_all(schedule)
            deadlines = [c.deadline for c in self.cores.values() if c.deadline is not None]
            due = [d for d in deadlines if d <= end]
            if not due:
                self.now = end
                return
            self.now = max(self.now, min(due))

    def _apply(self, node: NodeId, outputs: Outputs) -> None:
        for outgoing in outputs.messages:
            targets = self.linked_to(node) if outgoing.to is None else {outgoing.to}
            for target in sorted(targets):
                if frozenset({node, target}) in self.links:
                    self.in_flight.setdefault((node, target), deque()).append(outgoing.message)
                    self.sent.append((node, target, outgoing.message))
        if outputs.clock is not None:
            self.persisted[node] = outputs.clock
        if outputs.session is not None:
            self.decided[node].append(outputs.session)
        self.notes[node].extend(outputs.notes)

    # --- looking -----------------------------------------------------------------------------

    def session(self, name: str) -> Session | None:
        return self.cores[NodeId(name)].session

    def sessions(self) -> set[Session | None]:
        return {core.session for core in self.cores.values()}

    def masters(self) -> list[NodeId]:
        """The nodes that believe they are master."""
        return sorted(node for node, core in self.cores.items() if core.is_master)

    def converged(self) -> Session:
        """The one session every node holds (asserting there is one, with one master)."""
        sessions = self.sessions()
        assert len(sessions) == 1, f"nodes disagree: {self.describe()}"
        (session,) = sessions
        assert session is not None, "no session"
        assert self.masters() == [session.master_id], self.describe()
        return session

    def describe(self) -> str:
        return ", ".join(f"{n}: {c.session}" for n, c in sorted(self.cores.items()))
