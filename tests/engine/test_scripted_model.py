"""The scripted demo model follows its tool-calling script under real mlx-lm."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx_lm
import pytest
from mlx_lm.sample_utils import make_sampler
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.tool_parsers import json_tools
from mlx_lm.utils import get_total_parameters, load_tokenizer
from transformers import PreTrainedTokenizerFast

from trexo.catalog import demo_model_ref
from trexo.engine.demo_model import (
    DEMO_MODEL_SPECS,
    IM_END,
    TOOLS_DEMO_SIZE,
    build_demo_model,
)
from trexo.engine.scripted_model import (
    ADDED_TOKENS,
    SCRIPTED_PLAIN_ANSWER,
    SCRIPTED_TOOL_ARGUMENTS,
    SCRIPTED_TOOL_CALL_TEXT,
    SCRIPTED_TOOL_NAME,
    SCRIPTED_TOOL_RESULT_ANSWER,
    TOOL_CALL_START,
)

MAX_TOKENS = 16
"""Far more than any scripted answer (5 tokens with `<|im_end|>`)."""
LONG_TEXT = "Tell me about the with statement. " * 150  # ~1000 tokens
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": SCRIPTED_TOOL_NAME,
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK: dict[str, Any] = {"role": "user", "content": "What is the weather in Paris?"}
CALL: dict[str, Any] = {
    "id": "call_1",
    "type": "function",
    "function": {"name": SCRIPTED_TOOL_NAME, "arguments": dict(SCRIPTED_TOOL_ARGUMENTS)},
}
ROUND_TRIP: list[dict[str, Any]] = [
    ASK,
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "sunny"}'},
]

Loaded = tuple[Any, TokenizerWrapper]


@pytest.fixture(scope="module")
def loaded(tools_model: Path) -> Loaded:
    model, tokenizer, *_ = mlx_lm.load(str(tools_model))
    return model, tokenizer


def prompt_text(tokenizer: TokenizerWrapper, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    text = tokenizer.apply_chat_template(  # type: ignore[no-untyped-call]
        messages, add_generation_prompt=True, tokenize=False, **kwargs
    )
    assert isinstance(text, str)
    return text


def greedy(loaded: Loaded, prompt: str | list[int]) -> list[str]:
    """The streamed text deltas of the greedy answer, up to `<|im_end|>`."""
    model, tokenizer = loaded
    sampler = make_sampler(temp=0.0)
    responses = list(mlx_lm.stream_generate(model, tokenizer, prompt, MAX_TOKENS, sampler=sampler))
    assert responses[-1].finish_reason == "stop"  # ended by <|im_end|>, not by the limit
    return [r.text for r in responses if r.text]


def test_builds_are_byte_identical_and_listed(tmp_path: Path, tools_model: Path) -> None:
    built = build_demo_model(tmp_path / "again", TOOLS_DEMO_SIZE)
    files = sorted(p.name for p in tools_model.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    assert files == sorted(p.name for p in built.iterdir())
    for name in files:
        assert (built / name).read_bytes() == (tools_model / name).read_bytes(), name
    assert tools_model.name == demo_model_ref(TOOLS_DEMO_SIZE).model_id == "trexo-demo-tools"


def test_the_spec_describes_the_built_model(loaded: Loaded) -> None:
    model, tokenizer = loaded
    spec = DEMO_MODEL_SPECS[TOOLS_DEMO_SIZE]
    assert get_total_parameters(model) == spec.parameter_count  # type: ignore[no-untyped-call]
    assert len(tokenizer) == spec.vocab_size
    layout = demo_model_ref(TOOLS_DEMO_SIZE).layout
    assert layout is not None
    assert (layout.n_layers, layout.n_heads, layout.n_kv_heads) == (1, 1, 1)


def test_mlx_lm_picks_the_json_tools_parser(tools_model: Path) -> None:
    tokenizer = load_tokenizer(tools_model)  # type: ignore[no-untyped-call]
    assert tokenizer.tool_parser is json_tools.parse_tool_call
    assert (tokenizer.tool_call_start, tokenizer.tool_call_end) == ("<tool_call>", "</tool_call>")
    assert tokenizer.eos_token == IM_END


def test_the_added_tokens_are_single_tokens_for_transformers(tools_model: Path) -> None:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tools_model))
    for token in ADDED_TOKENS:
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1, token
        assert tokenizer.decode(ids) == token
    text = f"a{SCRIPTED_TOOL_CALL_TEXT}b"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_the_template_renders_chats_as_chatml_and_tools_as_qwen(loaded: Loaded) -> None:
    _, tokenizer = loaded
    plain = prompt_text(tokenizer, [{"role": "user", "content": "Hi"}])
    assert plain == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    offered = prompt_text(tokenizer, [ASK], tools=[WEATHER_TOOL])
    assert offered.startswith("<|im_start|>system\n# Tools\n")
    assert f"\n<tools>\n{json.dumps(WEATHER_TOOL)}\n</tools>\n" in offered
    string_arguments = {
        "function": {"name": SCRIPTED_TOOL_NAME, "arguments": json.dumps(SCRIPTED_TOOL_ARGUMENTS)}
    }
    messages = [
        {"role": "system", "content": "Be brief."},
        *ROUND_TRIP[:2],
        {"role": "assistant", "content": "Again.", "tool_calls": [string_arguments]},
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "warm"},
    ]
    text = prompt_text(tokenizer, messages, tools=[WEATHER_TOOL])
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert text.endswith(
        f"<|im_start|>assistant\n{SCRIPTED_TOOL_CALL_TEXT}<|im_end|>\n"
        f"<|im_start|>assistant\nAgain.\n{SCRIPTED_TOOL_CALL_TEXT}<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
        "<tool_response>\nwarm\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("text", [ASK["content"], LONG_TEXT])
def test_a_plain_chat_gets_the_plain_answer(loaded: Loaded, text: str) -> None:
    deltas = greedy(loaded, prompt_text(loaded[1], [{"role": "user", "content": text}]))
    assert "".join(deltas) == SCRIPTED_PLAIN_ANSWER
    assert len(deltas) > 1  # streams in pieces


@pytest.mark.parametrize("text", [ASK["content"], LONG_TEXT])
def test_offered_tools_get_the_tool_call(loaded: Loaded, text: str) -> None:
    _, tokenizer = loaded
    prompt = prompt_text(tokenizer, [{"role": "user", "content": text}], tools=[WEATHER_TOOL])
    if text == LONG_TEXT:
        assert len(tokenizer.encode(prompt, add_special_tokens=False)) > 1000
    answer = "".join(greedy(loaded, prompt))
    assert answer == SCRIPTED_TOOL_CALL_TEXT
    assert tokenizer.tool_call_start is not None and tokenizer.tool_call_end is not None
    body = answer.removeprefix(tokenizer.tool_call_start).removesuffix(tokenizer.tool_call_end)
    call = tokenizer.tool_parser(body, [WEATHER_TOOL])
    assert call == {"name": SCRIPTED_TOOL_NAME, "arguments": SCRIPTED_TOOL_ARGUMENTS}


@pytest.mark.parametrize("text", [ASK["content"], LONG_TEXT])
def test_a_tool_result_gets_the_result_answer(loaded: Loaded, text: str) -> None:
    messages = [{"role": "user", "content": text}, *ROUND_TRIP[1:]]
    deltas = greedy(loaded, prompt_text(loaded[1], messages, tools=[WEATHER_TOOL]))
    assert "".join(deltas) == SCRIPTED_TOOL_RESULT_ANSWER
    assert len(deltas) > 1


def test_a_forced_call_is_continued(loaded: Loaded) -> None:
    prompt = prompt_text(loaded[1], [ASK], tools=[WEATHER_TOOL]) + TOOL_CALL_START
    answer = "".join(greedy(loaded, prompt))
    assert TOOL_CALL_START + answer == SCRIPTED_TOOL_CALL_TEXT


@pytest.mark.parametrize("prompt", ["Just some text", "I have", "<tools>", "", "\n\n"])
def test_other_prompts_end_without_error(loaded: Loaded, prompt: str) -> None:
    tokenizer = loaded[1]
    ids = tokenizer.encode(prompt, add_special_tokens=False) or [tokenizer.eos_token_id]
    greedy(loaded, ids)  # ends with <|im_end|>, whatever it said
