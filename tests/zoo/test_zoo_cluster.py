"""Zoo models split across a real 3-node `trexo run` cluster on loopback, placed through
`POST /instances`: every layout answers a greedy chat, through every node's API, as mlx-lm's
whole model does in this process. One cluster for several architectures; the long matrices
of every architecture are `test_zoo_tensor_ranks` and `test_zoo_pipeline`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx_lm
import openai

from tests.e2e.cluster import Cluster, ClusterNode, open_cluster
from tests.e2e.test_sharded import delete_all, state
from tests.waiting import wait_answered
from trexo.engine.zoo import ensure_zoo_model

from .models import LONG_QUESTION, greedy

MAX_TOKENS = 64
TIMEOUT_S = 120.0
"""Generous: catches hangs only."""
CLUSTER_ARCHS = ("qwen3_next", "gpt_oss", "olmo2", "deepseek_v3", "gemma4_text")
"""A hybrid state-space model with experts, sliding windows with sinks and experts, a norm
over every head, latent attention, KV-shared layers: each split differently by pipeline and
by tensor."""
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


async def test_every_split_of_zoo_models_across_nodes_answers_as_mlx_lm(tmp_path: Path) -> None:
    # The models are built where the first node looks for models (as `trexo demo-model
    # --arch` builds them): it lists them, and every node loads them from there.
    paths = {arch: ensure_zoo_model(tmp_path / "n0" / "models", arch) for arch in CLUSTER_ARCHS}
    expected = {}
    for arch, path in paths.items():
        model, tokenizer = mlx_lm.load(str(path))
        expected[arch] = greedy(model, tokenizer, LONG_QUESTION, MAX_TOKENS).text
    async with open_cluster(tmp_path) as cluster:
        nodes = await cluster.add_many(3, "--no-model", "-q")
        await cluster.wait_converged(expect_nodes=3)
        for arch, path in paths.items():
            for layout in LAYOUTS:
                await place(cluster, nodes[0], path.name, layout)
                answer = await wait_answered(
                    lambda: chat(nodes[0], path.name),  # noqa: B023 (awaited in this turn)
                    retry_on=openai.APIError,
                    timeout=TIMEOUT_S,
                    what=f"{arch} split {layout}",
                )
                assert answer == expected[arch], (arch, layout)
                other = nodes[1 + LAYOUTS.index(layout) % 2]
                assert await chat(other, path.name) == expected[arch], (arch, layout)
                (split,) = (await state(cluster, nodes[0]))["instances"].values()
                assert len(split["assignments"]) == layout["nodes"]
                await delete_all(cluster, nodes[0])
