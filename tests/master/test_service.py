"""The master service with a real in-process router and a real state view."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio

from tests.waiting import wait_until
from trexo.config import MasterConfig
from trexo.master.service import Master
from trexo.master.session_store import read_session, session_dir
from trexo.net.router import Envelope, Router
from trexo.net.topics import Topic
from trexo.state import apply_all, carry_over
from trexo.types.commands import (
    CancelTask,
    Command,
    DeleteInstance,
    PlaceInstance,
    RequestReplay,
    SubmitTask,
)
from trexo.types.events import (
    IndexedEvent,
    InstanceCreated,
    NodeUpdated,
    RunnerStatusChanged,
    SessionOpened,
    TaskCreated,
    TaskFinished,
)
from trexo.types.ids import InstanceId, NodeId, RequestId, RunnerId
from trexo.types.local_events import LocalEvent, NodeReport, RunnerReport, TaskReport
from trexo.types.models import ModelRef
from trexo.types.refusal import RefusalKind
from trexo.types.runner_status import RunnerLoading, RunnerReady
from trexo.types.session import Session
from trexo.types.snapshot import StateSnapshot
from trexo.types.state import CommandDone, NodeInfo, State
from trexo.types.stream import CommandReply
from trexo.worker.state_view import StateView

BOUND_S = 10.0
MiB = 1024 * 1024
ME, PEER = NodeId("me"), NodeId("peer")
SESSION = Session(1, ME)
SMALL = ModelRef("trexo-demo-small", "demo:small", 80 * MiB)  # needs 96 MiB


def logged(events_dir: Path, session: Session) -> list[IndexedEvent]:
    """The events of `session` its master's files hold after their last snapshot."""
    return list(read_session(session_dir(events_dir, session), session).events)


def node(node_id: NodeId, available: int) -> NodeInfo:
    return NodeInfo(node_id, f"host-{node_id}", 4 * available, available)


def speaker(state: State, event: LocalEvent) -> NodeId:
    """The node entitled to report `event` (a peer speaks only for itself)."""
    match event:
        case NodeReport(node=info):
            return info.node_id
        case RunnerReport(runner_id=runner_id) if runner_id in state.runners:
            return state.runners[runner_id].node_id
        case TaskReport(task_id=task_id) if task_id in state.tasks:
            instance = state.instances.get(state.tasks[task_id].instance_id)
            return instance.lead.node_id if instance is not None else ME
    return ME


@attrs.define
class Harness:
    router: Router
    master: Master
    view: StateView
    replies: trio.MemoryReceiveChannel[Envelope]
    counter: int = 0

    async def command(self, make: Callable[[str], Command]) -> CommandReply:
        """Send a command (given its id) to the master and wait for the reply to it."""
        self.counter += 1
        cmd = make(f"c{self.counter}")
        await self.router.send(ME, Topic.COMMANDS, cmd)
        async for envelope in self.replies:
            reply = envelope.payload
            if isinstance(reply, CommandReply) and reply.command_id == cmd.command_id:
                return reply
        raise AssertionError("replies ended")

    async def report(self, *events: LocalEvent) -> None:
        """Each event as the node it speaks for sends it (the test plays every node)."""
        for event in events:
            sender = speaker(self.master.state, event)
            await self.router.deliver(Envelope(Topic.LOCAL_EVENTS, sender, event))

    async def converged(self) -> State:
        """Wait until the view has applied everything the master emitted; return it."""
        return await self.view.wait_until(lambda s: s == self.master.state)


@asynccontextmanager
async def running(
    log_dir: Path,
    initial_state: State | None = None,
    *,
    session: Session = SESSION,
    config: MasterConfig | None = None,
) -> AsyncIterator[Harness]:
    router = Router(ME)
    with trio.fail_after(BOUND_S):
        async with trio.open_nursery() as nursery:
            master = Master(router, session, log_dir, initial_state, config=config)
            await nursery.start(master.run)
            view = await nursery.start(StateView(router, session).run)
            with router.subscribe(Topic.STREAM) as replies:
                yield Harness(router, master, view, replies)
            nursery.cancel_scope.cancel()


async def settled(h: Harness) -> None:
    """Once the view has an event and the master answered a command, no request is in flight."""
    await h.report(NodeReport(node(ME, 500 * MiB)))
    await h.view.wait_until(lambda s: bool(s.nodes))
    await h.command(lambda c: CancelTask(c, RequestId("barrier")))


async def place(h: Harness, node_id: NodeId | None = None) -> CommandReply:
    return await h.command(lambda c: PlaceInstance(c, SMALL, (node_id,) if node_id else ()))


# --- tests ---------------------------------------------------------------------------------


async def test_view_converges_with_the_master(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        await h.report(NodeReport(node(ME, 500 * MiB)), NodeReport(node(PEER, 200 * MiB)))
        await h.view.wait_until(lambda s: len(s.nodes) == 2)
        placed = await place(h)
        assert placed.error is None
        iid = InstanceId(placed.result_id or "")
        instance = h.master.state.instances[iid]
        assert instance.node_ids == (ME,)
        runner = instance.lead.runner_id

        await h.report(
            RunnerReport(runner, iid, RunnerLoading(0.5)), RunnerReport(runner, iid, RunnerReady())
        )
        submitted = await h.command(lambda c: SubmitTask(c, SMALL.model_id, ME, RequestId("q1")))
        assert submitted.result_id == "q1"
        await h.command(lambda c: SubmitTask(c, SMALL.model_id, ME, RequestId("q2")))
        await h.report(
            TaskReport(RequestId("q1"), "running"),
            TaskReport(RequestId("q2"), finish_reason="stop"),
        )
        cancelled = await h.command(lambda c: CancelTask(c, RequestId("q1")))
        assert cancelled.result_id == "q1"
        await h.command(lambda c: SubmitTask(c, SMALL.model_id, ME, RequestId("q3")))

        state = await h.converged()
        assert state.runners[runner].status == RunnerReady()
        assert set(state.tasks) == {"q3"}
        assert state.tasks[RequestId("q3")].instance_id == iid

        deleted = await h.command(lambda c: DeleteInstance(c, iid))
        assert deleted.result_id == iid
        state = await h.converged()
        assert state.instances == {}
        assert state.tasks == {}
        assert state.runners == {}
        assert set(state.nodes) == {ME, PEER}


async def test_indices_are_contiguous_from_zero_and_logged_before_broadcast(
    tmp_path: Path,
) -> None:
    seen: list[IndexedEvent] = []
    router = Router(ME)
    with trio.fail_after(BOUND_S), router.subscribe(Topic.GLOBAL_EVENTS) as broadcast:
        async with trio.open_nursery() as nursery:
            await nursery.start(Master(router, SESSION, tmp_path).run)
            for k in range(5):
                await router.publish(Topic.LOCAL_EVENTS, NodeReport(node(ME, (k + 1) * MiB)))
            async for envelope in broadcast:
                event = envelope.payload
                assert envelope.sender == ME
                # The record is on disk (flushed) before anyone hears of the event.
                assert logged(tmp_path, SESSION)[event.index] == event
                seen.append(event)
                if len(seen) == 5:
                    break
            nursery.cancel_scope.cancel()
    assert [e.index for e in seen] == [0, 1, 2, 3, 4]
    assert all(e.session == SESSION for e in seen)


async def test_place_refused_names_required_and_available_memory(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        await h.report(NodeReport(node(NodeId("abc"), 50 * MiB)))
        await h.view.wait_until(lambda s: bool(s.nodes))
        reply = await place(h, NodeId("abc"))
        assert reply.error_kind == RefusalKind.INSUFFICIENT_MEMORY
        assert (
            reply.error == "model trexo-demo-small needs 96.0 MiB, node abc has 50.0 MiB available"
        )
        assert reply.result_id is None
        assert h.master.state.instances == {}


async def test_memory_reserved_by_a_placement_is_not_given_twice(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        await h.report(NodeReport(node(ME, 150 * MiB)))
        await h.view.wait_until(lambda s: bool(s.nodes))
        assert (await place(h)).error is None
        second = await place(h)
        assert second.error_kind == RefusalKind.INSUFFICIENT_MEMORY
        assert "54.0 MiB available" in (second.error or "")


async def test_unknown_ids_are_refused_as_not_found(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        assert (
            await h.command(lambda c: DeleteInstance(c, InstanceId("x")))
        ).error_kind == RefusalKind.INSTANCE_NOT_FOUND
        cancel = await h.command(lambda c: CancelTask(c, RequestId("x")))
        assert cancel.error_kind == RefusalKind.TASK_NOT_FOUND
        submit = await h.command(lambda c: SubmitTask(c, "nope", ME, RequestId("q")))
        assert submit.error_kind == RefusalKind.MODEL_NOT_FOUND
        assert (await place(h, NodeId("ghost"))).error_kind == RefusalKind.NODE_NOT_FOUND
        bad = await h.command(lambda c: RequestReplay(c, -1))
        assert bad.error_kind == RefusalKind.INVALID
        stats = h.master.statistics()
        assert stats.commands_refused == 5
        assert stats.events_emitted == 1  # SessionOpened only


async def test_log_on_disk_reads_back_into_the_same_state(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        await h.report(NodeReport(node(ME, 500 * MiB)))
        await h.view.wait_until(lambda s: bool(s.nodes))
        iid = InstanceId((await place(h)).result_id or "")
        await h.command(lambda c: SubmitTask(c, SMALL.model_id, ME, RequestId("q1")))
        await h.report(TaskReport(RequestId("q1"), "running"))
        state = await h.view.wait_until(
            lambda s: bool(s.tasks) and s.tasks[RequestId("q1")].status == "running"
        )
        assert iid in state.instances
        final = h.master.state
    in_log = logged(tmp_path, SESSION)
    assert [e.index for e in in_log] == list(range(len(in_log)))
    assert apply_all(State(), in_log) == final


async def test_replay_sends_the_sender_every_event_from_the_index(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        await h.report(*(NodeReport(node(ME, k * MiB)) for k in range(1, 5)))
        await h.view.wait_until(lambda s: s.last_index == 4)  # 0 is SessionOpened
        with h.router.subscribe(Topic.GLOBAL_EVENTS) as events:
            reply = await h.command(lambda c: RequestReplay(c, 3))
            assert reply.error is None
            got = [events.receive_nowait().payload for _ in range(2)]
            with pytest.raises(trio.WouldBlock):
                events.receive_nowait()
        assert [e.index for e in got] == [3, 4]
        assert h.master.statistics().replays_served >= 1


async def test_a_replay_from_the_start_is_one_snapshot_of_the_head(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        await h.report(*(NodeReport(node(ME, k * MiB)) for k in range(1, 5)))
        await h.view.wait_until(lambda s: s.last_index == 4)
        with h.router.subscribe(Topic.GLOBAL_EVENTS) as events:
            reply = await h.command(lambda c: RequestReplay(c, 0))
            assert reply.error is None
            got = events.receive_nowait().payload
            with pytest.raises(trio.WouldBlock):
                events.receive_nowait()
        # Not the events one by one: a view applying them would show old states as current.
        assert isinstance(got, StateSnapshot)
        assert got.index == 4
        assert got.state == h.master.state


async def test_unknown_runner_and_task_reports_are_ignored(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        await h.report(
            RunnerReport(RunnerId("ghost"), InstanceId("nope"), RunnerReady()),
            TaskReport(RequestId("ghost"), finish_reason="stop"),
            NodeReport(node(ME, MiB)),
        )
        state = await h.view.wait_until(lambda s: bool(s.nodes))
        assert state.last_index == 1  # after SessionOpened, only the node report made one
        assert h.master.statistics().local_events_handled == 3


async def test_malformed_payloads_are_dropped_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trexo.master.service")
    async with running(tmp_path) as h:
        await h.router.publish(Topic.COMMANDS, {"type": "PlaceInstance"})
        await h.router.publish(Topic.LOCAL_EVENTS, "garbage")
        await h.router.publish(Topic.LOCAL_EVENTS, NodeReport(node(ME, MiB)))
        await h.view.wait_until(lambda s: bool(s.nodes))
        assert (
            await h.command(lambda c: CancelTask(c, RequestId("x")))
        ).error_kind == RefusalKind.TASK_NOT_FOUND
        assert h.master.statistics().payloads_dropped == 2
    messages = [r.getMessage() for r in caplog.records]
    assert any("dropped a dict payload on commands" in m for m in messages)
    assert any("dropped a str payload on local_events" in m for m in messages)


async def test_a_reply_to_a_vanished_sender_is_not_a_crash(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        await settled(h)
        before = h.master.commands_seen
        envelope = Envelope(Topic.COMMANDS, NodeId("gone"), CancelTask("c-gone", RequestId("x")))
        await h.router.deliver(envelope)
        await h.router.deliver(Envelope(Topic.COMMANDS, NodeId("gone"), RequestReplay("r", 0)))
        assert (
            await h.command(lambda c: CancelTask(c, RequestId("y")))
        ).error_kind == RefusalKind.TASK_NOT_FOUND
        assert h.master.commands_seen == before + 3


async def test_commands_seen_counts_every_command(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        await settled(h)
        before = h.master.commands_seen
        assert before >= 2  # the view's replay request from 0 is a command too
        await h.command(lambda c: RequestReplay(c, 0))
        await h.command(lambda c: DeleteInstance(c, InstanceId("x")))
        assert h.master.commands_seen == before + 2
        assert h.master.statistics().commands_handled == h.master.commands_seen


async def test_a_restarted_master_resumes_its_session_log(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        await h.report(NodeReport(node(ME, 500 * MiB)))
        await h.view.wait_until(lambda s: bool(s.nodes))
        first = await place(h)
        before = await h.converged()
    async with running(tmp_path) as h:
        assert h.master.state == before
        # The first placement's id again (a client's resend) is answered from what was done.
        again = await place(h)
        assert (again.command_id, again.result_id) == (first.command_id, first.result_id)
        second = await place(h)
        state = await h.converged()
        assert set(state.instances) == {first.result_id, second.result_id}
        assert state.last_index == before.last_index + 1
    in_log = logged(tmp_path, SESSION)
    assert [e.index for e in in_log] == list(range(state.last_index + 1))


async def test_a_new_session_rebuilds_the_previous_state_in_its_log(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        await h.report(NodeReport(node(ME, 500 * MiB)))
        await h.view.wait_until(lambda s: bool(s.nodes))
        iid = InstanceId((await place(h)).result_id or "")
        runner = h.master.state.instances[iid].lead.runner_id
        await h.report(RunnerReport(runner, iid, RunnerReady()))
        await h.command(lambda c: SubmitTask(c, SMALL.model_id, ME, RequestId("q1")))
        old = await h.converged()
    new_session = Session(2, ME)
    assert old.tasks
    assert old.runners[runner].status == RunnerReady()
    async with running(tmp_path, old, session=new_session) as h:
        state = await h.converged()
        # Everything carries over: runners belong to nodes and outlive sessions.
        assert state.nodes == old.nodes
        assert state.instances == old.instances
        assert state.runners == old.runners
        assert state.runners[runner].status == RunnerReady()
        assert state.tasks == old.tasks
        assert state.opened
        events = logged(tmp_path, new_session)
        assert [type(e.event) for e in events] == [
            NodeUpdated,
            InstanceCreated,
            RunnerStatusChanged,
            TaskCreated,
            CommandDone,  # what the last session did, to answer its resent commands
            SessionOpened,
        ]
        assert apply_all(State(), events) == state
        assert state.commands == old.commands and len(state.commands) == 1


async def test_cancel_emits_task_finished_cancelled(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        await h.report(NodeReport(node(ME, 500 * MiB)))
        await h.view.wait_until(lambda s: bool(s.nodes))
        await place(h)
        submitted = await h.command(lambda c: SubmitTask(c, SMALL.model_id, ME, RequestId("q1")))
        assert submitted.lead_node == ME  # where the origin sends the request itself
        await h.command(lambda c: CancelTask(c, RequestId("q1")))
        await h.converged()
    last = logged(tmp_path, SESSION)[-1].event
    assert last == TaskFinished(RequestId("q1"), "cancelled")


async def test_fsync_every_event_policy_works_end_to_end(tmp_path: Path) -> None:
    router = Router(ME)
    master = Master(router, SESSION, tmp_path, config=MasterConfig(fsync_interval=0))
    with trio.fail_after(BOUND_S), router.subscribe(Topic.GLOBAL_EVENTS) as broadcast:
        async with trio.open_nursery() as nursery:
            await nursery.start(master.run)
            await router.publish(Topic.LOCAL_EVENTS, NodeReport(node(ME, MiB)))
            assert (await broadcast.receive()).payload.index == 0
            nursery.cancel_scope.cancel()
    assert len(logged(tmp_path, SESSION)) == 1


async def test_a_resent_command_is_decided_once_and_answered_again(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        await settled(h)
        command = PlaceInstance("resent", SMALL)
        replies = []
        for _ in range(2):
            await h.router.send(ME, Topic.COMMANDS, command)
            async for envelope in h.replies:
                if (
                    isinstance(envelope.payload, CommandReply)
                    and envelope.payload.command_id == "resent"
                ):
                    replies.append(envelope.payload)
                    break
        state = await h.converged()
    assert replies[0] == replies[1]
    assert replies[0].error is None
    assert list(state.instances) == [replies[0].result_id]


async def test_a_node_that_leaves_takes_its_instances_with_it(tmp_path: Path) -> None:
    class NullLink:
        local_host = "127.0.0.1"

        async def send_envelope(self, envelope: Envelope) -> None:
            pass

    async with running(tmp_path) as h:
        link = NullLink()
        h.router.attach_link(PEER, link)
        await h.report(NodeReport(node(ME, 500 * MiB)), NodeReport(node(PEER, 500 * MiB)))
        await h.view.wait_until(lambda s: len(s.nodes) == 2)
        placed = await place(h, PEER)
        assert placed.error is None
        h.router.detach_link(PEER, link)
        # The instance goes with its node, then the model is placed again on the survivor.
        state = await h.view.wait_until(lambda s: PEER not in s.nodes and bool(s.instances))
    assert placed.result_id not in state.instances
    assert [i.node_ids for i in state.instances.values()] == [(ME,)]
    assert set(state.nodes) == {ME}


async def test_snapshots_bound_the_history_in_memory_and_on_disk(tmp_path: Path) -> None:
    config = MasterConfig(snapshot_every_events=5)
    async with running(tmp_path, config=config) as h:
        await h.report(*(NodeReport(NodeInfo(ME, f"h{k}", 100, k)) for k in range(23)))
        before = await h.view.wait_until(lambda s: s.last_index == 23)  # 0 is SessionOpened
        stats = h.master.statistics()
        assert (stats.events_emitted, stats.snapshot_index, stats.events_in_memory) == (24, 19, 4)
        assert stats.snapshots_taken == 4
        directory = session_dir(tmp_path, SESSION)
        assert sorted(p.name for p in directory.iterdir()) == [
            "events-20.jsonl",
            "snapshot-19.json",
        ]
        assert stats.log_bytes == sum(p.stat().st_size for p in directory.iterdir())
    # The same session's master, restarted, resumes from the snapshot and the tail.
    async with running(tmp_path, config=config) as h:
        assert h.master.state == before
        await h.report(NodeReport(NodeInfo(ME, "again", 100, 0)))
        after = await h.view.wait_until(lambda s: s.last_index == 24)
        assert after.nodes[ME].hostname == "again"


async def test_old_sessions_are_pruned_to_the_retention(tmp_path: Path) -> None:
    for clock in range(1, 5):
        old = session_dir(tmp_path, Session(clock, PEER))
        old.mkdir(parents=True)
        (old / "events-0.jsonl").write_bytes(b"")
    current = Session(9, ME)
    async with running(tmp_path, session=current, config=MasterConfig(retained_sessions=2)) as h:
        await settled(h)
        # Pruning follows the session's opening, off the failover's path.
        kept = ["session-4-peer", "session-9-me"]
        await wait_until(
            lambda: sorted(p.name for p in tmp_path.iterdir()) == kept,
            timeout=10,
            what="old sessions pruned",
        )


async def test_a_command_resent_to_the_next_master_is_answered_from_what_was_done(
    tmp_path: Path,
) -> None:
    # The first master placed it, and its reply was lost with it: the client resends the
    # command to the next master, which must not place a second instance.
    async with running(tmp_path) as h:
        await h.report(NodeReport(node(ME, 500 * MiB)))
        await h.view.wait_until(lambda s: bool(s.nodes))
        first = await h.command(lambda _: PlaceInstance("keyed", SMALL))
        old = await h.converged()
    async with running(tmp_path, carry_over(old), session=Session(2, ME)) as h:
        again = await h.command(lambda _: PlaceInstance("keyed", SMALL))
        state = await h.converged()
    assert first.error is None and again == first
    assert list(state.instances) == [first.result_id]


async def test_a_command_id_reused_for_another_request_is_refused(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        await h.report(NodeReport(node(ME, 500 * MiB)))
        await h.view.wait_until(lambda s: bool(s.nodes))
        first = await h.command(lambda _: PlaceInstance("keyed", SMALL))
        other = attrs.evolve(SMALL, model_id="another-model")
        reused = await h.command(lambda _: PlaceInstance("keyed", other))
        state = await h.converged()
    assert first.error is None
    assert reused.error_kind is RefusalKind.KEY_REUSED
    assert list(state.instances) == [first.result_id]
