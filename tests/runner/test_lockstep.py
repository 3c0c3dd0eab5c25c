"""The lockstep pieces that need no group: steps on the wire, the stall watch, exit codes."""

from __future__ import annotations

import pytest

from trexo.runner.compute import ComputeThread
from trexo.runner.exit_codes import (
    EXIT_GROUP_BROKEN,
    EXIT_GROUP_STALLED,
    EXIT_RANK_FAILED,
    describe_exit,
)
from trexo.runner.lockstep import (
    IDLE_STEP_BYTES,
    GroupStep,
    StallWatch,
    StepUndecodable,
    decode_step,
    encode_step,
)
from trexo.types.ids import RequestId
from trexo.types.ipc import FromRunner, LoadModel, RequestFailed
from trexo.types.shard import RankGroup, ShardSpec

from .helpers import chat_request


def test_an_idle_step_travels_as_nothing() -> None:
    assert encode_step(GroupStep()) == IDLE_STEP_BYTES == b""
    assert decode_step(b"") == GroupStep()


@pytest.mark.parametrize(
    "step",
    [
        GroupStep(start=(chat_request("hi", request_id="r1", max_tokens=3, seed=5),)),
        GroupStep(start=(chat_request("a", request_id="a"), chat_request("b", request_id="b"))),
    ],
)
def test_steps_survive_the_trip(step: GroupStep) -> None:
    assert decode_step(encode_step(step)) == step


def test_an_undecodable_step_is_a_clear_error() -> None:
    with pytest.raises(StepUndecodable, match="invalid GroupStep"):
        decode_step(b'{"start": 3}')


def test_the_stall_watch_counts_from_the_first_wait_to_the_last_news() -> None:
    watch = StallWatch()
    assert watch.waited() == 0.0
    watch.waiting()
    since = watch.waited(0.0) * -1  # the monotonic time it started at
    watch.waiting()  # a wait within the same stretch does not restart the clock
    assert watch.waited(since + 2.0) == pytest.approx(2.0)
    watch.heard()
    assert watch.waited(since + 2.0) < 2.0
    watch.rest()
    assert watch.waited() == 0.0


def test_group_exit_codes_say_what_happened() -> None:
    assert describe_exit(EXIT_GROUP_BROKEN) == "exit code 5 (group broken: a peer rank left)"
    assert describe_exit(EXIT_GROUP_STALLED) == (
        "exit code 6 (group stalled: a peer rank stopped responding)"
    )
    assert describe_exit(EXIT_RANK_FAILED).startswith("exit code 7 (rank failed")


def rank_load(rank: int, stall_timeout: float = 3.0) -> LoadModel:
    group = RankGroup(0, ("127.0.0.1:1", "127.0.0.1:2"))
    shard = ShardSpec(2 * rank, 2 * rank + 2, rank, 2)
    return LoadModel("model", shard, group=group, group_stall_timeout=stall_timeout)


def test_a_rank_above_0_refuses_requests_at_once() -> None:
    posted: list[FromRunner] = []
    compute = ComputeThread(posted.append)  # never started: the refusal needs no thread
    compute.submit_load(rank_load(1))
    compute.submit_generate(chat_request(request_id="r1"))
    assert posted == [RequestFailed(RequestId("r1"), "rank 1 does not take requests")]


def test_a_rank_is_stalled_once_it_waited_longer_than_its_timeout() -> None:
    compute = ComputeThread(lambda _: None)
    compute.submit_load(rank_load(0, stall_timeout=3.0))
    compute.watch.waiting()
    started = -compute.watch.waited(0.0)
    assert compute.stalled_for(started + 2.9) is None
    assert compute.stalled_for(started + 3.5) == pytest.approx(3.5)
    compute.watch.rest()
    assert compute.stalled_for() is None


def test_a_whole_model_runner_is_never_stalled() -> None:
    compute = ComputeThread(lambda _: None)
    compute.watch.waiting()
    assert compute.stalled_for(1e12) is None
