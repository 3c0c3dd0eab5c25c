"""The scripted thinking model (`trexo.engine.thinking_model`) under mlx-lm and through the
real engine: its reasoning comes apart from its answer, the thinking switch reaches its
chat template, and stops, `max_tokens` and usage work in the reasoning as in the answer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from mlx_lm.utils import get_total_parameters, load_tokenizer

from trexo.catalog import demo_model_ref
from trexo.engine.demo_model import DEMO_MODEL_SPECS, THINKING_DEMO_SIZE, build_demo_model
from trexo.engine.engine import Engine
from trexo.engine.output import opens_thinking
from trexo.engine.prompt import PromptError
from trexo.engine.thinking_model import (
    SCRIPTED_ANSWER,
    SCRIPTED_REASONING,
    SCRIPTED_THINKING_OUTPUT,
    THINK_END,
    THINK_START,
    THINKING_CHAT_TEMPLATE,
)
from trexo.types.chunks import Chunk
from trexo.types.generation import ChatMessage, GenerationRequest, SamplingParams
from trexo.types.ids import RequestId

RID = RequestId("think-1")
HI = ChatMessage("user", "Hi")
OFF = json.dumps({"enable_thinking": False})
GENERATION_PROMPT = "<|im_start|>assistant\n"
R1_STYLE = THINKING_CHAT_TEMPLATE.replace(
    "{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n<think>' }}"
)
"""The template opening the think block itself, as DeepSeek-R1's does."""


@pytest.fixture(scope="module")
def engine(thinking_model: Path) -> Engine:
    return Engine.load(thinking_model)


def run(engine: Engine, *messages: ChatMessage, **fields: Any) -> list[Chunk]:
    request = GenerationRequest(RID, messages=messages or (HI,), **fields)
    chunks = list(engine.generate(request, lambda: False))
    assert [c.finish_reason is not None for c in chunks].count(True) == 1
    return chunks


def said(chunks: list[Chunk]) -> tuple[str, str]:
    """(reasoning, answer)"""
    return "".join(c.reasoning for c in chunks), "".join(c.text for c in chunks)


def rendered(engine: Engine, *messages: ChatMessage, **fields: Any) -> str:
    request = GenerationRequest(RID, messages=messages or (HI,), **fields)
    text: str = engine.tokenizer.decode(engine.encode_prompt(request))
    return text


# --- the model -----------------------------------------------------------------------------------


def test_builds_are_byte_identical_and_listed(tmp_path: Path, thinking_model: Path) -> None:
    built = build_demo_model(tmp_path / "again", THINKING_DEMO_SIZE)
    files = sorted(p.name for p in thinking_model.iterdir())
    assert files == sorted(p.name for p in built.iterdir())
    for name in files:
        assert (built / name).read_bytes() == (thinking_model / name).read_bytes(), name
    ref = demo_model_ref(THINKING_DEMO_SIZE)
    assert thinking_model.name == ref.model_id == "trexo-demo-thinking"


def test_mlx_lm_finds_the_think_markers(engine: Engine, thinking_model: Path) -> None:
    tokenizer = load_tokenizer(thinking_model)  # type: ignore[no-untyped-call]
    assert tokenizer.has_thinking
    assert (tokenizer.think_start, tokenizer.think_end) == (THINK_START, THINK_END)
    spec = DEMO_MODEL_SPECS[THINKING_DEMO_SIZE]
    assert get_total_parameters(engine.model) == spec.parameter_count  # type: ignore[no-untyped-call]
    assert len(tokenizer) == spec.vocab_size


def test_the_switch_reaches_the_template(engine: Engine) -> None:
    assert rendered(engine).endswith(GENERATION_PROMPT)
    on = rendered(engine, template_kwargs=json.dumps({"enable_thinking": True}))
    assert on.endswith(GENERATION_PROMPT)
    assert rendered(engine, template_kwargs=OFF).endswith(
        GENERATION_PROMPT + "<think>\n\n</think>\n\n"
    )


def test_a_replayed_turns_reasoning_is_rendered_after_the_last_user_turn(engine: Engine) -> None:
    turn = ChatMessage("assistant", "Hello.", reasoning="Greet <|im_end|> back.")
    text = rendered(engine, HI, turn, continue_final=True)
    assert text.endswith(
        "<|im_start|>assistant\n<think>\nGreet <|im_end|> back.\n</think>\n\nHello."
    )
    ids = engine.encode_prompt(GenerationRequest(RID, messages=(HI, turn), continue_final=True))
    assert ids.count(engine.tokenizer.eos_token_id) == 1  # the client's <|im_end|> stays text
    assert "Greet" not in rendered(engine, HI, turn, HI)  # before the last user turn: dropped


@pytest.mark.parametrize(
    "kwargs", [{"chat_template": "{{ 'x' }}"}, {"tokenize": False}, {"enable_thinking": "no"}]
)
def test_a_peers_bad_template_variables_are_its_requests_error(
    engine: Engine, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(PromptError, match="template variables"):
        run(engine, template_kwargs=json.dumps(kwargs))


# --- generations --------------------------------------------------------------------------------


def test_the_reasoning_comes_apart_and_first(engine: Engine) -> None:
    chunks = run(engine, params=SamplingParams(max_tokens=32))
    assert said(chunks) == (SCRIPTED_REASONING, SCRIPTED_ANSWER)
    last_reasoning = max(i for i, c in enumerate(chunks) if c.reasoning)
    assert all(not c.text for c in chunks[: last_reasoning + 1])
    assert sum(1 for c in chunks if c.reasoning) > 1  # streamed in pieces
    usage = chunks[-1].usage
    # <think>, 3 pieces, </think>; a blank line, 3 pieces, <|im_end|>: every token counts.
    assert usage is not None and (usage.completion_tokens, usage.reasoning_tokens) == (10, 5)
    assert chunks[-1].finish_reason == "stop"


def test_thinking_off_answers_at_once(engine: Engine) -> None:
    chunks = run(engine, template_kwargs=OFF)
    assert said(chunks) == ("", SCRIPTED_ANSWER)
    usage = chunks[-1].usage
    assert usage is not None and (usage.completion_tokens, usage.reasoning_tokens) == (4, 0)


def test_a_template_that_opens_the_think_block_starts_in_reasoning(
    thinking_model: Path, tmp_path: Path
) -> None:
    r1 = shutil.copytree(thinking_model, tmp_path / "r1-style")
    config_path = r1 / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "chat_template": R1_STYLE}))
    engine = Engine.load(r1)
    prompt = engine.encode_prompt(GenerationRequest(RID, messages=(HI,)))
    assert engine.tokenizer.decode(prompt).endswith(GENERATION_PROMPT + THINK_START)
    assert opens_thinking(engine.tokenizer, prompt)
    assert said(run(engine)) == (SCRIPTED_REASONING, SCRIPTED_ANSWER)


def test_a_prefill_that_opens_the_think_block_goes_on_reasoning(engine: Engine) -> None:
    prefill = ChatMessage("assistant", THINK_START)
    assert said(run(engine, HI, prefill, continue_final=True)) == (
        SCRIPTED_REASONING,
        SCRIPTED_ANSWER,
    )


def test_a_think_marker_in_an_earlier_turn_opens_nothing(engine: Engine) -> None:
    quoting = ChatMessage("user", f"What does {THINK_START} mean?")
    prompt = engine.encode_prompt(GenerationRequest(RID, messages=(quoting,)))
    assert not opens_thinking(engine.tokenizer, prompt)


def test_a_stop_sequence_in_the_reasoning_ends_the_output(engine: Engine) -> None:
    chunks = run(engine, params=SamplingParams(stop=("greets",)))
    assert said(chunks) == ("The user ", "")  # cut right before the stop
    assert (chunks[-1].finish_reason, chunks[-1].stop_sequence) == ("stop", "greets")
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == sum(len(c.token_ids) for c in chunks)


def test_max_tokens_can_end_the_output_in_the_reasoning(engine: Engine) -> None:
    chunks = run(engine, params=SamplingParams(max_tokens=3))
    assert said(chunks) == ("The user greets me;", "")
    assert chunks[-1].finish_reason == "length"
    usage = chunks[-1].usage
    assert usage is not None and (usage.completion_tokens, usage.reasoning_tokens) == (3, 3)


def test_a_text_completion_is_the_text_as_generated(engine: Engine) -> None:
    prompt = engine.tokenizer.decode(engine.encode_prompt(GenerationRequest(RID, messages=(HI,))))
    request = GenerationRequest(RID, prompt=prompt, params=SamplingParams(max_tokens=32))
    chunks = list(engine.generate(request, lambda: False))
    assert said(chunks) == ("", SCRIPTED_THINKING_OUTPUT)
