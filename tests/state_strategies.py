"""Hypothesis strategies for cluster state: random events over a few ids, so that
sequences collide (the same node, instance or task named again) and exercise `apply`."""

from __future__ import annotations

from hypothesis import strategies as st

from trexo.types.downloads import DownloadPhase, DownloadProgress
from trexo.types.events import (
    DownloadUpdated,
    Event,
    GroupReset,
    InstanceCreated,
    InstanceDeleted,
    NodeRemoved,
    NodeUpdated,
    RankAddressed,
    RunnerStatusChanged,
    TaskCreated,
    TaskFinished,
    TaskStatusChanged,
)
from trexo.types.ids import InstanceId, NodeId, RequestId, RunnerId
from trexo.types.models import ModelRef
from trexo.types.runner_status import (
    RunnerDownloading,
    RunnerFailed,
    RunnerIdle,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    RunnerStopped,
)
from trexo.types.shard import ShardSpec
from trexo.types.state import CommandDone, Instance, NodeInfo, RunnerAssignment, Task

MODEL = ModelRef("m", "demo:tiny", 1000)

node_ids = st.sampled_from([NodeId("n1"), NodeId("n2"), NodeId("n3")])
instance_ids = st.sampled_from([InstanceId(f"i{k}") for k in range(3)])
task_ids = st.sampled_from([RequestId(f"t{k}") for k in range(4)])
statuses = st.one_of(
    st.just(RunnerIdle()),
    st.just(RunnerDownloading()),
    st.builds(RunnerLoading, st.floats(0, 1)),
    st.just(RunnerReady()),
    st.builds(RunnerRunning, st.integers(1, 8)),
    st.builds(RunnerFailed, st.text(max_size=10)),
    st.builds(RunnerStopped, st.text(max_size=10)),
)
command_records = st.builds(
    CommandDone,
    st.sampled_from([f"c{k}" for k in range(4)]),
    st.sampled_from(["f1", "f2"]),
    st.none() | instance_ids,
)
nodes = st.builds(
    NodeInfo,
    node_id=node_ids,
    hostname=st.text(max_size=8),
    memory_total=st.integers(0, 2**40),
    memory_available=st.integers(0, 2**40),
)


def _runner_of(iid: InstanceId, k: int) -> RunnerId:
    # Runner ids are unique per instance, as the master's random ids are.
    return RunnerId(f"{iid}-r{k}")


download_progress = st.builds(
    DownloadProgress,
    model_id=st.sampled_from(["org/a", "org/b"]),
    phase=st.sampled_from(DownloadPhase),
    done_bytes=st.integers(0, 2**40),
    total_bytes=st.integers(0, 2**40),
    bytes_per_s=st.floats(0, 1e12),
    eta_s=st.none() | st.floats(0, 1e6),
    error=st.none() | st.text(max_size=10),
    retry_in=st.none() | st.floats(0, 60),
)


@st.composite
def instances(draw: st.DrawFn) -> Instance:
    iid = draw(instance_ids)
    hosts = draw(st.lists(node_ids, min_size=1, max_size=3))
    world = len(hosts)
    assignments = tuple(
        RunnerAssignment(_runner_of(iid, k), host, ShardSpec(rank=k, world_size=world))
        for k, host in enumerate(hosts)
    )
    return Instance(iid, MODEL, assignments)


@st.composite
def runner_changes(draw: st.DrawFn) -> RunnerStatusChanged:
    iid = draw(instance_ids)
    return RunnerStatusChanged(
        _runner_of(iid, draw(st.integers(0, 3))), iid, draw(node_ids), draw(statuses)
    )


tasks = st.builds(
    Task,
    task_ids,
    instance_ids,
    node_ids,
    st.sampled_from(["pending", "running"]),
)
events: st.SearchStrategy[Event] = st.one_of(
    st.builds(NodeUpdated, nodes),
    st.builds(NodeRemoved, node_ids),
    st.builds(InstanceCreated, instances(), st.none() | command_records),
    st.builds(InstanceDeleted, instance_ids, st.none() | command_records),
    command_records,
    runner_changes(),
    st.builds(TaskCreated, tasks),
    st.builds(TaskStatusChanged, task_ids, st.sampled_from(["pending", "running"])),
    st.builds(TaskFinished, task_ids, st.sampled_from(["stop", "length", "cancelled", "error"])),
    st.builds(
        RankAddressed,
        instance_ids,
        st.integers(0, 2),
        st.integers(0, 3),
        st.sampled_from(["127.0.0.1:5000", "127.0.0.2:5001"]),
    ),
    st.builds(GroupReset, instance_ids, st.integers(0, 3)),
    st.builds(DownloadUpdated, node_ids, download_progress),
)
event_lists = st.lists(events, max_size=40)
