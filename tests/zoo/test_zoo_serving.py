"""Zoo models served by a real `trexo run --model PATH`: a greedy chat completion answers as
mlx-lm does in this process, token for token. One node per model, each shared by the module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import mlx_lm
import pytest

from tests.e2e.shared_node import SharedNode, launch, shared_node, stop_process, wait_ready_url
from tests.waiting import wait_until_sync
from trexo.cli import main

from .models import LONG_QUESTION, ZooModels, greedy

MAX_TOKENS = 32
TIMEOUT_S = 60.0
"""Generous: catches hangs only."""
SERVED = (
    pytest.param(("gemma3_text", False), id="gemma3_text"),  # sliding-window layers
    pytest.param(("qwen3_moe", True), id="qwen3_moe-4bit"),  # experts, quantized
    pytest.param(("deepseek_v3", False), id="deepseek_v3"),  # MLA
)


@attrs.frozen
class Served:
    path: Path
    node: SharedNode


@pytest.fixture(scope="module", params=SERVED)
def served(
    request: pytest.FixtureRequest,
    zoo_models: ZooModels,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    arch, quantized = request.param
    path = zoo_models(arch, quantized=quantized)
    data_dir = tmp_path_factory.mktemp(f"node-{path.name}")
    with shared_node(data_dir, path.name, "--model", str(path), "-q") as node:
        yield Served(path, node)


def test_a_served_zoo_model_answers_a_greedy_chat_as_mlx_lm_does(served: Served) -> None:
    model, tokenizer = mlx_lm.load(str(served.path))
    expected = greedy(model, tokenizer, LONG_QUESTION, MAX_TOKENS)
    response = httpx.post(
        f"{served.node.url}/v1/chat/completions",
        json={
            "model": served.node.model,
            "messages": [{"role": "user", "content": LONG_QUESTION}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
        },
        timeout=TIMEOUT_S,
    )
    assert response.status_code == 200, response.text
    reply = response.json()
    assert reply["usage"]["completion_tokens"] == len(expected.tokens) == MAX_TOKENS
    assert reply["choices"][0]["message"]["content"] == expected.text


def test_a_zoo_model_built_into_the_models_folder_is_listed_and_placed_by_name(
    zoo_models: ZooModels, tmp_path: Path
) -> None:
    # As a user would: `trexo demo-model --arch NAME`, then `trexo run`, no --model.
    data_dir = tmp_path / "node"
    assert main(["demo-model", "--arch", "qwen3", "--data-dir", str(data_dir)]) == 0
    (path,) = (data_dir / "models").glob("trexo-zoo-qwen3*")
    model, tokenizer = mlx_lm.load(str(path))
    expected = greedy(model, tokenizer, LONG_QUESTION, MAX_TOKENS)
    process = launch(data_dir, "--no-model", "-q")
    try:
        url = wait_ready_url(process, data_dir)
        listed = httpx.get(f"{url}/v1/models", timeout=TIMEOUT_S).json()["data"]
        assert path.name in {m["id"] for m in listed}
        placed = httpx.post(f"{url}/instances", json={"model": path.name}, timeout=TIMEOUT_S)
        assert placed.status_code == 201, placed.text

        def answered() -> dict[str, Any] | None:
            response = httpx.post(
                f"{url}/v1/chat/completions",
                json={
                    "model": path.name,
                    "messages": [{"role": "user", "content": LONG_QUESTION}],
                    "max_tokens": MAX_TOKENS,
                    "temperature": 0,
                },
                timeout=TIMEOUT_S,
            )
            assert response.status_code in (200, 503), response.text  # 503: still loading
            return response.json() if response.status_code == 200 else None

        reply = wait_until_sync(answered, timeout=TIMEOUT_S, what="a chat with the zoo model")
        assert reply["choices"][0]["message"]["content"] == expected.text
    finally:
        stop_process(process)
