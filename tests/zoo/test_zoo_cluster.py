"""Zoo models split across a real 3-node `trexo run` cluster on loopback, placed through
`POST /instances`: every layout answers a greedy chat, through every node's API, as mlx-lm's
whole model does in this process. One cluster per architecture; the long matrices of every
architecture are `test_zoo_tensor_ranks` and `test_zoo_pipeline`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx_lm
import openai
import pytest

from tests.e2e.cluster import Cluster, ClusterNode, open_cluster
from tests.e2e.test_sharded import delete_all, state
from tests.waiting import wait_answered

from .models import LONG_QUESTION, ZooModels, greedy

MAX_TOKENS = 64
TIMEOUT_S = 120.0
"""Generous: catches hangs only."""
CLUSTER_ARCHS = ("qwen3_next", "gpt_oss", "olmo2")
"""A hybrid state-space model with experts, sliding windows with sinks and experts, a norm
over every head: each split differently by pipeline and by tensor."""
LAYOUTS = (
    {"sharding": "tensor", "nodes": 2},
    {"sharding": "tensor", "nodes": 3},
    {"sharding": "pipeline", "nodes": 3},
)


async def chat(node: ClusterNode, model: str) -> str:
    client = openai.AsyncOpenAI(base_url=f"{node.url}/v1", api_key="x", max_retries=0)
    reply = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": LONG_QUESTION}],
        max_tokens=MAX_TOKENS,
        temperature=0.0,
    )
    return reply.choices[0].message.content or ""


async def place(cluster: Cluster, via: ClusterNode, model: str, body: dict[str, Any]) -> None:
    response = await cluster.http.post(f"{via.url}/instances", json={"model": model, **body})
    assert response.status_code == 201, response.text


@pytest.mark.parametrize("arch", CLUSTER_ARCHS)
async def test_every_split_of_a_zoo_model_across_nodes_answers_as_mlx_lm(
    tmp_path: Path, zoo_models: ZooModels, arch: str
) -> None:
    path = zoo_models(arch)
    model, tokenizer = mlx_lm.load(str(path))
    expected = greedy(model, tokenizer, LONG_QUESTION, MAX_TOKENS).text
    async with open_cluster(tmp_path) as cluster:
        nodes = await cluster.add_many(3, "--model", str(path), "-q")
        await cluster.wait_converged(expect_nodes=3)
        for layout in LAYOUTS:
            await delete_all(cluster, nodes[0])
            await place(cluster, nodes[0], path.name, layout)
            answer = await wait_answered(
                lambda: chat(nodes[0], path.name),
                retry_on=openai.APIError,
                timeout=TIMEOUT_S,
                what=f"{arch} split {layout}",
            )
            assert answer == expected, layout
            for node in nodes[1:]:  # through every node's API
                assert await chat(node, path.name) == expected, layout
            (split,) = (await state(cluster, nodes[0]))["instances"].values()
            assert len(split["assignments"]) == layout["nodes"]
