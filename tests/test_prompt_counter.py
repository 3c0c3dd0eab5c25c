"""The API node counts prompts with the model's own tokenizer, only when it can do so right."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import trio

from tests.hostile_templates import LOOPS, RAISES_ON_SYSTEM
from trexo.catalog import local_model_ref
from trexo.errors import GenerationRejected
from trexo.hub.cache import RepoCache
from trexo.prompt_counter import PromptCounter
from trexo.types.generation import ChatMessage, GenerationRequest
from trexo.types.ids import RequestId
from trexo.types.models import HubRevision, ModelRef

REQUEST = GenerationRequest(RequestId("r"), messages=(ChatMessage("user", "How long is this?"),))
COMMIT = "c" * 40


async def test_a_local_model_is_counted_with_its_chat_template(
    tmp_path: Path, tiny_model: Path
) -> None:
    from mlx_lm.utils import load_tokenizer

    from trexo.engine.prompt import encode_prompt

    counter = PromptCounter(tmp_path / "models", tmp_path / "hub")
    budget = await counter.budget(local_model_ref(tiny_model), REQUEST)
    assert budget is not None
    assert budget.prompt_tokens == len(encode_prompt(load_tokenizer(tiny_model), REQUEST))
    assert budget.context == 4096


async def test_a_hub_snapshot_is_used_only_once_its_tokenizer_is_whole(
    tmp_path: Path, tiny_model: Path
) -> None:
    hub = tmp_path / "hub"
    snapshot = RepoCache(hub, "org/m").snapshot(COMMIT)
    snapshot.mkdir(parents=True)
    for path in tiny_model.iterdir():
        if path.name != "tokenizer_config.json":
            shutil.copy(path, snapshot / path.name)
    model = ModelRef("org/m", HubRevision("org/m", COMMIT).source, 1)
    counter = PromptCounter(tmp_path / "models", hub)
    # A download under way: the tokenizer's config (and chat template) is not there yet.
    assert await counter.budget(model, REQUEST) is None
    shutil.copy(tiny_model / "tokenizer_config.json", snapshot)
    budget = await counter.budget(model, REQUEST)
    assert budget is not None and budget.prompt_tokens > 0


async def test_a_prompt_it_cannot_count_is_left_to_the_runner(
    tmp_path: Path, tiny_model: Path
) -> None:
    no_template = tmp_path / "no-template"
    shutil.copytree(tiny_model, no_template)
    config_path = no_template / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    (no_template / "chat_template.jinja").unlink(missing_ok=True)
    counter = PromptCounter(tmp_path / "models", tmp_path / "hub")
    model = local_model_ref(no_template)
    assert await counter.budget(model, REQUEST) is None  # not a 500: the runner decides
    assert await counter.budget(model, REQUEST) is None


def with_template(tmp_path: Path, tiny_model: Path, template: str) -> Path:
    """A copy of the tiny model whose chat template is `template`."""
    model = tmp_path / f"template-{abs(hash(template))}"
    shutil.copytree(tiny_model, model)
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config))
    return model


async def test_a_template_that_raises_on_the_request_is_its_400(
    tmp_path: Path, tiny_model: Path
) -> None:
    model = local_model_ref(with_template(tmp_path, tiny_model, RAISES_ON_SYSTEM))
    counter = PromptCounter(tmp_path / "models", tmp_path / "hub")
    system = GenerationRequest(
        RequestId("r"), messages=(ChatMessage("system", "Be terse."), ChatMessage("user", "hi"))
    )
    with pytest.raises(GenerationRejected, match="System role not supported"):
        await counter.budget(model, system)
    assert await counter.budget(model, REQUEST) is not None  # others are counted as ever


async def test_a_template_that_loops_is_a_400_within_its_budget(
    tmp_path: Path, tiny_model: Path
) -> None:
    model = local_model_ref(with_template(tmp_path, tiny_model, LOOPS))
    counter = PromptCounter(tmp_path / "models", tmp_path / "hub", render_timeout=0.2)
    with trio.fail_after(60):  # bounds a hang: without the budget this takes hours
        with pytest.raises(GenerationRejected, match=r"more than 0\.2 s of CPU time"):
            await counter.budget(model, REQUEST)
