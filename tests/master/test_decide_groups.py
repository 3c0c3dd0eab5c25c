"""The master's part in a split instance's group: addresses per epoch, rebuild on failure."""

from __future__ import annotations

from trexo.master.decide import decide_local_event
from trexo.state import apply_all
from trexo.types.events import GroupReset, InstanceCreated, RankAddressed, RunnerStatusChanged
from trexo.types.ids import InstanceId, NodeId, RunnerId
from trexo.types.local_events import RankAddressReport, RunnerReport
from trexo.types.models import ModelRef
from trexo.types.runner_status import RunnerFailed, RunnerReady, RunnerStopped
from trexo.types.shard import ShardSpec
from trexo.types.state import Instance, RunnerAssignment, State

A, B = NodeId("a"), NodeId("b")
IID = InstanceId("i")
R0, R1 = RunnerId("r0"), RunnerId("r1")
SPLIT = Instance(
    IID,
    ModelRef("m", "demo:tiny", 1000),
    (
        RunnerAssignment(R0, A, ShardSpec(0, 2, rank=0, world_size=2)),
        RunnerAssignment(R1, B, ShardSpec(2, 4, rank=1, world_size=2)),
    ),
)


def formed(epoch: int = 0) -> State:
    events = [InstanceCreated(SPLIT)]
    if epoch:
        events.append(GroupReset(IID, epoch))  # type: ignore[arg-type]
    state = apply_all(State(), events)
    for runner, address in ((R0, "127.0.0.1:7000"), (R1, "127.0.0.1:7001")):
        report = RankAddressReport(IID, runner, epoch, address)
        state = apply_all(state, decide_local_event(state, report))
    return state


def test_addresses_are_recorded_per_rank_for_the_current_epoch_only() -> None:
    state = apply_all(State(), [InstanceCreated(SPLIT)])
    report = RankAddressReport(IID, R1, 0, "127.0.0.1:7001")
    assert decide_local_event(state, report) == [RankAddressed(IID, 0, 1, "127.0.0.1:7001")]
    state = apply_all(state, decide_local_event(state, report))
    assert decide_local_event(state, report) == []  # the same again changes nothing
    assert decide_local_event(state, RankAddressReport(IID, R1, 3, "127.0.0.1:9")) == []
    assert decide_local_event(state, RankAddressReport(IID, RunnerId("x"), 0, "h:1")) == []
    assert formed().groups[IID].group is not None


def test_a_failed_rank_rebuilds_the_group_once_and_its_peers_failures_do_not_again() -> None:
    state = formed()
    died = RunnerReport(R1, IID, RunnerFailed("SIGKILL"))
    events = decide_local_event(state, died)
    assert events == [
        RunnerStatusChanged(R1, IID, B, RunnerFailed("SIGKILL")),
        GroupReset(IID, 1),
    ]
    state = apply_all(state, events)
    # Rank 0 lost its peer and fails too: the same rebuild, not another one.
    peer = decide_local_event(state, RunnerReport(R0, IID, RunnerFailed("group broken")))
    assert [type(e) for e in peer] == [RunnerStatusChanged]
    # Once the new epoch has formed, a new failure rebuilds again.
    state = apply_all(state, peer)
    for runner, address in ((R0, "127.0.0.1:8000"), (R1, "127.0.0.1:8001")):
        state = apply_all(
            state, decide_local_event(state, RankAddressReport(IID, runner, 1, address))
        )
    again = decide_local_event(state, RunnerReport(R0, IID, RunnerFailed("SIGKILL")))
    assert again[-1] == GroupReset(IID, 2)


def test_a_rank_stopped_on_purpose_or_serving_does_not_rebuild() -> None:
    state = formed()
    for status in (RunnerReady(), RunnerStopped("exit code 0 (clean exit)")):
        events = decide_local_event(state, RunnerReport(R1, IID, status))
        assert all(not isinstance(e, GroupReset) for e in events)
