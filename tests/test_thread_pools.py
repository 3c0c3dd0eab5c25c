"""Blocking work that outsiders can prolong never takes the threads of the master's log.

Forty-one requests used to wedge a master: each held one of trio's 40 default threads (a
hub dripping its answer, a chat template that loops), and the event log's next write, and
its last fsync when the node was told to stop, waited for a thread forever.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
import trio

from tests.waiting import NotYet, wait_until
from trexo.catalog import local_model_ref
from trexo.cluster_client import resolve_on_hub
from trexo.errors import GenerationRejected, HubUnreachable
from trexo.master.event_log import open_event_log, read_log
from trexo.prompt_counter import PromptCounter
from trexo.thread_pools import SIZES, limiter
from trexo.types.events import IndexedEvent, NodeUpdated
from trexo.types.generation import ChatMessage, GenerationRequest
from trexo.types.ids import NodeId, RequestId
from trexo.types.models import ModelRef
from trexo.types.session import Session
from trexo.types.state import NodeInfo

SESSION = Session(4, NodeId("master"))
EVENT = IndexedEvent(SESSION, 0, NodeUpdated(NodeInfo(NodeId("n0"), "h", 100, 1)))
FLOOD = 45
"""More than trio's 40 default threads."""
BOUND_S = 30.0
"""Generous: catches hangs only."""
HOLD_S = 3.0
"""How long each looping template holds its thread."""
LOOPS = (
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
)
"""Ten billion empty iterations: a template that never ends in practice."""
REQUEST = GenerationRequest(RequestId("r"), messages=(ChatMessage("user", "hi"),))


@pytest.fixture
def looping_model(tmp_path: Path, tiny_model: Path) -> ModelRef:
    model = tmp_path / "loops"
    shutil.copytree(tiny_model, model)
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = LOOPS
    config_path.write_text(json.dumps(config))
    return local_model_ref(model)


async def test_stuck_hub_look_ups_and_looping_templates_leave_the_log_its_threads(
    tmp_path: Path, looping_model: ModelRef
) -> None:
    # Each count holds its thread this long; the flood queued behind keeps every one busy.
    counter = PromptCounter(tmp_path / "models", tmp_path / "hub", render_timeout=HOLD_S)
    await counter.warm_up()  # the imports, out of the way
    hub_answers = threading.Event()

    def dripping_hub(repo_id: str) -> ModelRef:
        hub_answers.wait(BOUND_S)
        raise HubUnreachable("the test is over")

    async def count() -> None:
        with pytest.raises(GenerationRejected):
            await counter.budget(looping_model, REQUEST)

    async def look_up() -> None:
        with pytest.raises(HubUnreachable):
            await resolve_on_hub(dripping_hub, "org/model", bound=BOUND_S)

    def flooded() -> bool | NotYet:
        busy = {kind: limiter(kind).borrowed_tokens for kind in ("prompts", "hub")}
        return busy == {"prompts": SIZES["prompts"], "hub": SIZES["hub"]} or NotYet(busy)

    path = tmp_path / "log.jsonl"
    try:
        with trio.fail_after(BOUND_S * 3):
            async with (
                open_event_log(path, fsync_interval=0.01) as event_log,
                trio.open_nursery() as nursery,
            ):
                for _ in range(FLOOD):
                    nursery.start_soon(count)
                    nursery.start_soon(look_up)
                await wait_until(flooded, timeout=BOUND_S, what="every worker thread busy")
                with trio.fail_after(BOUND_S / 3):
                    await event_log.append(EVENT)  # written, flushed and fsynced
                nursery.cancel_scope.cancel()
            assert read_log(path) == [EVENT]
    finally:
        hub_answers.set()


async def test_a_hub_that_does_not_answer_is_a_503_within_the_bound() -> None:
    release = threading.Event()

    def silent_hub(repo_id: str) -> ModelRef:
        release.wait(BOUND_S)
        raise HubUnreachable("the test is over")

    try:
        with trio.fail_after(BOUND_S):
            with pytest.raises(HubUnreachable, match="did not answer about org/model within"):
                await resolve_on_hub(silent_hub, "org/model", bound=0.2)
    finally:
        release.set()
