"""A model that cannot load is failed for good with its cause, not retried forever.

A real `trexo run` serving a copy of the tiny demo model whose `config.json` no longer
matches its weights (`intermediate_size` doubled: every MLP weight has the wrong shape),
as a hand-edited or half-converted model directory does.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.waiting import NotYet, holds_for, wait_until

from .harness import TrexoProcess, run_trexo

WAIT_S = 60.0
"""Generous: catches hangs only."""
NO_RESTART_S = 4.0
"""A load failure that may pass is retried after 0.5, 1 and 2 s: a restart would show here."""


@pytest.fixture
def mismatched_model(tmp_path: Path, tiny_model: Path) -> Path:
    model = tmp_path / "models" / "mismatched"
    shutil.copytree(tiny_model, model)
    config = json.loads((model / "config.json").read_text())
    config["intermediate_size"] *= 2
    (model / "config.json").write_text(json.dumps(config))
    return model


@pytest.fixture
async def node(tmp_path: Path, mismatched_model: Path) -> AsyncIterator[TrexoProcess]:
    async with run_trexo(tmp_path / "node", "--model", str(mismatched_model)) as node:
        yield node


def runner_failures(node: TrexoProcess) -> list[str]:
    """The node's log lines about a runner that failed (for good or to be restarted)."""
    return [
        line
        for line in node.log_text().splitlines()
        if "failed for good" in line or "restarting in" in line
    ]


async def test_a_model_that_cannot_load_fails_once_with_its_cause(
    node: TrexoProcess, mismatched_model: Path
) -> None:
    async with httpx.AsyncClient(base_url=node.url, timeout=WAIT_S) as http:

        async def failed_for_good() -> dict[str, Any] | NotYet:
            state = (await http.get("/state")).json()
            statuses = [runner["status"] for runner in state["runners"].values()]
            done = [s for s in statuses if s.get("permanent")]
            return done[0] if done else NotYet(statuses)

        status = await wait_until(failed_for_good, timeout=WAIT_S, what="the runner failed")
        assert "ValueError" in status["cause"] and status.get("restart_in") is None
        # Not restarted: one failure in the log, and no runner process comes back.
        await holds_for(
            lambda: len(runner_failures(node)) == 1 and not node.runner_pids(),
            seconds=NO_RESTART_S,
            what="no restart of a load that cannot pass",
        )
        health = (await http.get("/health")).json()
        assert health["status"] == "degraded"
        assert any("not retried" in problem for problem in health["problems"])
        # A chat gets the cause, not "retry shortly".
        chat = await http.post(
            "/v1/chat/completions",
            json={"model": mismatched_model.name, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert chat.status_code == 500, chat.text
        assert chat.json()["error"]["code"] == "model_load_failed"
        assert "ValueError" in chat.json()["error"]["message"]
        assert "retry-after" not in chat.headers
        # Deleting it ends it: nothing left placed, nothing running.
        (instance_id,) = (await http.get("/state")).json()["instances"]
        assert (await http.delete(f"/instances/{instance_id}")).status_code == 200
        await wait_until(
            lambda: not node.runner_pids(), timeout=WAIT_S, what="no runner after the deletion"
        )
    assert node.process.returncode is None  # the node serves on
