"""Which node may say what to the master: a peer speaks only for itself (pure functions).

A link proves which node sent a message (the handshake authenticated it, every message is
sealed), so the master checks what a message claims against its sender:

- facts (`local_events`) only about the sender's own node, its own runners, and the tasks
  its runners lead: no node can report a phantom node with a petabyte free, fail another
  node's runner, or end another node's generation;
- a generation only for the sender's own user (`SubmitTask.origin_node` is the sender), and
  its cancellation only by that node: the id every node learns from the log is no licence
  to end someone else's stream.

Commands that act on the cluster as a whole (placing and deleting instances, asking for a
replay) stay open to every node: each node's API takes them from its users.

Each function answers why the message is refused, or None to go on.
"""

from __future__ import annotations

from trexo.types.commands import CancelTask, Command, SubmitTask
from trexo.types.ids import InstanceId, NodeId, RunnerId
from trexo.types.local_events import (
    DownloadReport,
    LocalEvent,
    NodeReport,
    RankAddressReport,
    RunnerReport,
    TaskInFlight,
    TaskReport,
)
from trexo.types.state import State


def fact_refusal(state: State, sender: NodeId, fact: LocalEvent) -> str | None:
    """Why `sender` may not report `fact`, if it may not. A fact naming what the state does
    not know passes: the master's decision ignores it anyway."""
    match fact:
        case NodeReport(node=node):
            return _not_itself(sender, node.node_id, "node")
        case DownloadReport(node_id=node_id):
            return _not_itself(sender, node_id, "node")
        case RunnerReport(runner_id=runner_id):
            return _not_its_runner(state, sender, runner_id)
        case RankAddressReport(runner_id=runner_id, instance_id=instance_id):
            return _not_its_runner(state, sender, runner_id) or _not_its_rank(
                state, sender, instance_id, runner_id
            )
        case TaskReport(task_id=task_id):
            task = state.tasks.get(task_id)
            return _not_its_lead(state, sender, task.instance_id) if task is not None else None
        case TaskInFlight(task=task):
            return _not_its_lead(state, sender, task.instance_id)
    return None


def command_refusal(state: State, sender: NodeId, command: Command) -> str | None:
    """Why `sender` may not give `command`, if it may not."""
    match command:
        case SubmitTask(origin_node=origin):
            if origin != sender:
                return f"a generation for node {origin}'s user can only come from {origin}"
        case CancelTask(task_id=task_id):
            task = state.tasks.get(task_id)
            if task is not None and task.origin_node != sender:
                return (
                    f"generation {task_id} was asked for through node {task.origin_node}: "
                    "only that node can cancel it"
                )
    return None


def _not_itself(sender: NodeId, subject: NodeId, what: str) -> str | None:
    if subject != sender:
        return f"it is about {what} {subject}, not the sender"
    return None


def _not_its_runner(state: State, sender: NodeId, runner_id: RunnerId) -> str | None:
    record = state.runners.get(runner_id)
    if record is not None and record.node_id != sender:
        return f"runner {runner_id} runs on node {record.node_id}"
    return None


def _not_its_rank(
    state: State, sender: NodeId, instance_id: InstanceId, runner_id: RunnerId
) -> str | None:
    instance = state.instances.get(instance_id)
    if instance is None:
        return None
    for assignment in instance.assignments:
        if assignment.runner_id == runner_id and assignment.node_id != sender:
            return f"runner {runner_id} of instance {instance_id} runs on {assignment.node_id}"
    return None


def _not_its_lead(state: State, sender: NodeId, instance_id: InstanceId) -> str | None:
    instance = state.instances.get(instance_id)
    if instance is not None and instance.lead.node_id != sender:
        return f"instance {instance_id} is led by node {instance.lead.node_id}"
    return None
