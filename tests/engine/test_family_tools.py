# ruff: noqa: RUF001  (the fullwidth bars are DeepSeek's own tokens)
"""Tool calls of the families mlx-lm has no parser for (`trexo.engine.tool_parsers`): each
family's scripted model (`family_scripts`, with its real chat template) through the real
engine, in-process, and each parser on the text its family writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mlx_lm.utils import load_tokenizer

from tests.engine.family_scripts import (
    COMMAND_R,
    COMMAND_R7B,
    COMMAND_REASONING,
    DEEPSEEK_CALLS_BEGIN,
    DEEPSEEK_V3,
    GEMMA_3,
    GPT_OSS,
    HARMONY_REASONING,
    LLAMA3,
    PHI4_MINI,
    PLAIN_ANSWER,
    RESULT_ANSWER,
    TEMPLATES,
    build,
)
from trexo.engine.engine import Engine
from trexo.engine.output import OutputReader, OutputSplitter, ToolCalls
from trexo.engine.prompt import encode_chat, forced_tool_call
from trexo.engine.scripted_model import (
    SCRIPTED_TOOL,
    SCRIPTED_TOOL_ARGUMENTS,
    SCRIPTED_TOOL_NAME,
    Script,
)
from trexo.engine.tool_parsers import (
    ToolFormat,
    command_r,
    command_r7b,
    deepseek_v3,
    gemma,
    harmony,
    infer_tool_parser,
    llama3_json,
    phi4_mini,
)
from trexo.types.chunks import Chunk
from trexo.types.generation import (
    ChatMessage,
    GenerationRequest,
    ToolCall,
    ToolChoice,
    ToolSpec,
)
from trexo.types.ids import RequestId

RID = RequestId("family-1")
WEATHER = SCRIPTED_TOOL
CLOCK = ToolSpec("get_time", "The time in a city")
OFFERED = [{"type": "function", "function": {"name": SCRIPTED_TOOL_NAME, "parameters": {}}}]
ASK = ChatMessage("user", "What is the weather in Paris?")
HI = ChatMessage("user", "Hi")
REPLAYED = ToolCall("call_1", SCRIPTED_TOOL_NAME, json.dumps(SCRIPTED_TOOL_ARGUMENTS))
ARGUMENTS = json.dumps(SCRIPTED_TOOL_ARGUMENTS)
FAMILIES = {
    "llama3": LLAMA3,
    "deepseek_v3": DEEPSEEK_V3,
    "gpt_oss": GPT_OSS,
    "command_r7b": COMMAND_R7B,
    "command_r": COMMAND_R,
    "gemma3": GEMMA_3,
    "phi4_mini": PHI4_MINI,
}
PARSERS = {
    "llama3": llama3_json,
    "deepseek_v3": deepseek_v3,
    "gpt_oss": harmony,
    "command_r7b": command_r7b,
    "command_r": command_r,
    "gemma3": gemma,
    "phi4_mini": phi4_mini,
}
FORCED_STARTS = {
    "deepseek_v3": DEEPSEEK_CALLS_BEGIN,
    "gpt_oss": harmony.tool_call_start,
    "command_r7b": command_r7b.tool_call_start,
    "command_r": command_r.tool_call_start,
    "phi4_mini": phi4_mini.tool_call_start,
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("family-models")
    return {name: build(root / name, script) for name, script in FAMILIES.items()}


@pytest.fixture(scope="module")
def engines(models: dict[str, Path]) -> dict[str, Engine]:
    return {name: Engine.load(path) for name, path in models.items()}


@pytest.fixture
def engine(engines: dict[str, Engine], family: str) -> Engine:
    return engines[family]


def run(engine: Engine, *messages: ChatMessage, **fields: Any) -> list[Chunk]:
    request = GenerationRequest(RID, messages=messages or (ASK,), **fields)
    chunks = list(engine.generate(request, lambda: False))
    assert [c.finish_reason is not None for c in chunks].count(True) == 1
    return chunks


def rendered(engine: Engine, *messages: ChatMessage, **fields: Any) -> str:
    request = GenerationRequest(RID, messages=messages, **fields)
    text: str = engine.tokenizer.decode(engine.encode_prompt(request))
    return text


def calls(chunks: list[Chunk]) -> list[ToolCall]:
    return [call for chunk in chunks for call in chunk.tool_calls]


def answer(chunks: list[Chunk]) -> str:
    return "".join(chunk.text for chunk in chunks)


def assert_scripted_call(chunks: list[Chunk]) -> None:
    (call,) = calls(chunks)
    assert call.name == SCRIPTED_TOOL_NAME
    assert json.loads(call.arguments) == SCRIPTED_TOOL_ARGUMENTS
    assert call.id.startswith("call_")
    assert chunks[-1].finish_reason == "tool_calls"
    assert answer(chunks) == ""


# --- detection -----------------------------------------------------------------------------------


def test_the_real_templates_name_their_family() -> None:
    assert infer_tool_parser((TEMPLATES / "llama-3.2.jinja").read_text()) is llama3_json
    assert infer_tool_parser((TEMPLATES / "deepseek-v3.jinja").read_text()) is deepseek_v3
    assert infer_tool_parser((TEMPLATES / "gpt-oss.jinja").read_text()) is harmony
    command = (TEMPLATES / "command-r7b-tool_use.jinja").read_text()
    assert infer_tool_parser(command) is command_r7b
    assert infer_tool_parser({"default": "{{ x }}", "tool_use": command}) is command_r7b
    assert infer_tool_parser((TEMPLATES / "command-r-tool_use.jinja").read_text()) is command_r
    assert infer_tool_parser((TEMPLATES / "gemma-3.jinja").read_text()) is gemma
    assert infer_tool_parser((TEMPLATES / "phi-4-mini.jinja").read_text()) is phi4_mini
    assert infer_tool_parser("{{ messages[0].content }}") is None


def test_mlx_lm_knows_none_of_them_and_trexo_does(models: dict[str, Path], family: str) -> None:
    tokenizer = load_tokenizer(models[family])  # type: ignore[no-untyped-call]
    assert not tokenizer.has_tool_calling
    tool_format = ToolFormat.of(tokenizer)
    assert tool_format is not None
    assert tool_format.parser is PARSERS[family].parse_tool_call


# --- through the engine --------------------------------------------------------------------------


def test_a_plain_chat_is_answered(engine: Engine, family: str) -> None:
    # Offered the weather, most scripts call it (their templates list it); DeepSeek's calls
    # only when asked about the weather, and Command R's only when it is its tool that is
    # offered (its tool_use template cannot render a chat with no tools: Cohere's default
    # template does), so these two answer with tools offered.
    tools = {"deepseek_v3": (WEATHER,), "command_r": (CLOCK,)}.get(family, ())
    chunks = run(engine, HI, tools=tools)
    assert answer(chunks) == (PLAIN_ANSWER if family != "gpt_oss" else "Hello from gpt-oss.")
    assert "<|" not in answer(chunks)  # no section or channel marker leaks
    assert calls(chunks) == []
    assert chunks[-1].finish_reason == "stop"


def test_offered_tools_are_called_in_the_familys_format(engine: Engine) -> None:
    chunks = run(engine, tools=(WEATHER,))
    assert_scripted_call(chunks)
    assert len(chunks) > 2  # streamed token by token; the call comes out whole, once


def test_the_result_is_answered_after_the_call_is_replayed(engine: Engine, family: str) -> None:
    turns = (
        ASK,
        ChatMessage("assistant", "", tool_calls=(REPLAYED,)),
        ChatMessage("tool", "sunny", tool_call_id="call_1", name=SCRIPTED_TOOL_NAME),
    )
    prompt = rendered(engine, *turns, tools=(WEATHER,))
    if family != "deepseek_v3":  # (V3's template cannot: `tool_parsers.deepseek_v3`)
        assert f"{SCRIPTED_TOOL_NAME}" in prompt.split("Paris?")[1]  # the call, replayed
    assert "sunny" in prompt
    chunks = run(engine, *turns, tools=(WEATHER,))
    assert answer(chunks) == RESULT_ANSWER
    assert calls(chunks) == []


def test_tools_not_offered_are_not_parsed(engine: Engine, family: str) -> None:
    if family == "command_r":
        pytest.skip("its tool_use template renders only chats with tools")
    chunks = run(engine, ASK)
    assert calls(chunks) == []


@pytest.mark.parametrize("choice", [ToolChoice("required"), ToolChoice("function", "get_weather")])
def test_a_forced_call_starts_in_the_prompt(
    engine: Engine, family: str, choice: ToolChoice
) -> None:
    request = GenerationRequest(RID, messages=(HI,), tools=(WEATHER,), tool_choice=choice)
    if family in ("llama3", "gemma3"):  # no marker starts its calls: only the prompt asks
        assert not forced_tool_call(engine.tokenizer, request)
        return
    assert forced_tool_call(engine.tokenizer, request)
    start = FORCED_STARTS[family]
    assert rendered(engine, HI, tools=(WEATHER,), tool_choice=choice).endswith(start)
    assert_scripted_call(run(engine, HI, tools=(WEATHER,), tool_choice=choice))


def test_gpt_oss_reasons_in_analysis_and_ends_a_call_with_call(engines: dict[str, Engine]) -> None:
    engine = engines["gpt_oss"]
    call_token = engine.tokenizer.convert_tokens_to_ids("<|call|>")
    assert call_token in engine.tokenizer.eos_token_ids  # from generation_config.json
    chunks = run(engine, tools=(WEATHER,))
    assert "".join(c.reasoning for c in chunks) == HARMONY_REASONING
    assert_scripted_call(chunks)
    plain = run(engine, HI)
    assert "".join(c.reasoning for c in plain) == "The user greets me."


def test_deepseek_v3_1_template_replays_a_call_with_its_arguments_as_text(
    models: dict[str, Path],
) -> None:
    v3_1 = {"chat_template": (TEMPLATES / "deepseek-v3.1.jinja").read_text()}
    tokenizer = load_tokenizer(models["deepseek_v3"], v3_1)  # type: ignore[no-untyped-call]
    assert ToolFormat.of(tokenizer) is not None
    ids = encode_chat(tokenizer, [ASK, ChatMessage("assistant", "", tool_calls=(REPLAYED,))])
    replayed = f"{SCRIPTED_TOOL_NAME}<｜tool▁sep｜>{ARGUMENTS}<｜tool▁call▁end｜>"
    assert replayed in tokenizer.decode(ids)  # the template concatenates the arguments


def test_command_r7b_plans_in_thinking_and_acts_in_actions(engines: dict[str, Engine]) -> None:
    chunks = run(engines["command_r7b"], tools=(WEATHER,))
    assert "".join(c.reasoning for c in chunks) == COMMAND_REASONING
    assert_scripted_call(chunks)


# --- the parsers on their family's text ----------------------------------------------------------


def split(module: Any, *pieces: str, initial: str = "normal") -> tuple[str, list[ToolCall]]:
    """`pieces` streamed through the output reader of `module`'s format: (answer, calls)."""
    tool_format = ToolFormat(
        module.tool_call_start,
        module.tool_call_end,
        module.parse_tool_call,
        getattr(module, "bare_call_start", ""),
    )
    edges = {"normal": [(tool_format.start, "tool")], "tool": []}
    if tool_format.end:
        edges["tool"] = [(tool_format.end, "normal")]
    reader = OutputReader((), OutputSplitter(edges, initial, ToolCalls(tool_format, OFFERED)))
    released = [reader.feed(piece) for piece in pieces] + [reader.finish()]
    return "".join(r.text for r in released), [c for r in released for c in r.tool_calls]


def test_llama3_bare_and_tagged_calls() -> None:
    call = f'{{"name": "{SCRIPTED_TOOL_NAME}", "parameters": {ARGUMENTS}}}'
    for pieces in (("  ", call[:5], call[5:]), ("<|python_tag|>", call), (call + "; " + call,)):
        text, found = split(llama3_json, *pieces)
        assert text == ""
        assert all(c.name == SCRIPTED_TOOL_NAME for c in found) and found
    assert len(split(llama3_json, call + "; " + call)[1]) == 2


def test_llama3_text_and_json_that_is_no_call_are_answers() -> None:
    assert split(llama3_json, "Hello", " {x}") == ("Hello {x}", [])
    assert split(llama3_json, '{"city": ', '"Paris"}') == ('{"city": "Paris"}', [])
    assert split(llama3_json, '{"name": "nope", "parameters": {}}')[1] == []


def test_deepseek_v3_and_v3_1_calls() -> None:
    v3 = (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
        f"```json\n{ARGUMENTS}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    )
    v31 = (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        f"{ARGUMENTS}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        f"{ARGUMENTS}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    )
    assert [c.name for c in split(deepseek_v3, "Let me check.", v3)[1]] == [SCRIPTED_TOOL_NAME]
    assert split(deepseek_v3, "Let me check.", v3)[0] == "Let me check."
    assert len(split(deepseek_v3, v31)[1]) == 2


def test_harmony_calls_with_the_recipient_before_or_after_the_channel() -> None:
    for text in (
        f"get_weather <|constrain|>json<|message|>{ARGUMENTS}",
        f"get_weather<|channel|>commentary json<|message|>{ARGUMENTS}",
    ):
        assert harmony.parse_tool_call(text) == {
            "name": SCRIPTED_TOOL_NAME,
            "arguments": SCRIPTED_TOOL_ARGUMENTS,
        }
    with pytest.raises(ValueError):
        harmony.parse_tool_call("get_weather no message")


def test_command_r7b_parallel_calls() -> None:
    action = json.dumps(
        [
            {"tool_call_id": "0", "tool_name": SCRIPTED_TOOL_NAME, "parameters": {"city": "Paris"}},
            {"tool_call_id": "1", "tool_name": SCRIPTED_TOOL_NAME, "parameters": {"city": "Rome"}},
        ]
    )
    found = split(command_r7b, "<|START_ACTION|>", action, "<|END_ACTION|>")[1]
    assert [json.loads(c.arguments)["city"] for c in found] == ["Paris", "Rome"]
    assert split(command_r7b, "<|START_ACTION|>", "[]", "<|END_ACTION|>")[1] == []


def test_gemma_calls_are_a_python_list_or_a_tool_code_block() -> None:
    text, found = split(gemma, '[get_weather(city="Paris"), get_weather(city="Rome")]')
    assert text == "" and [json.loads(c.arguments)["city"] for c in found] == ["Paris", "Rome"]
    text, found = split(gemma, "Sure.\n```tool_code\n", 'get_weather(city="Paris")\n```')
    assert text == "Sure.\n" and [c.name for c in found] == [SCRIPTED_TOOL_NAME]
    assert split(gemma, "[1] is a footnote.") == ("[1] is a footnote.", [])


def test_gemma_sees_the_tools_calls_and_results_as_text(engines: dict[str, Engine]) -> None:
    turns = (
        ASK,
        ChatMessage("assistant", "", tool_calls=(REPLAYED,)),
        ChatMessage("tool", "sunny", tool_call_id="call_1"),
        ChatMessage("tool", "warm", tool_call_id="call_2"),
    )
    prompt = rendered(engines["gemma3"], *turns, tools=(WEATHER,))
    assert prompt.index(gemma.TOOLS_PREAMBLE) < prompt.index('"name": "get_weather"')
    assert prompt.index('"name": "get_weather"') < prompt.index(ASK.content)
    assert '<start_of_turn>model\n[get_weather(city="Paris")]<end_of_turn>' in prompt
    results = "```tool_output\nsunny\n```\n```tool_output\nwarm\n```"
    assert f"<start_of_turn>user\n{results}<end_of_turn>" in prompt


def test_phi4_mini_calls_between_markers_or_after_functools() -> None:
    listed = f'[{{"name": "{SCRIPTED_TOOL_NAME}", "arguments": {ARGUMENTS}}}]'
    for pieces in (("<|tool_call|>", listed, "<|/tool_call|>"), ("func", "tools", listed)):
        text, found = split(phi4_mini, *pieces)
        assert text == "" and [c.name for c in found] == [SCRIPTED_TOOL_NAME]
    assert split(phi4_mini, "func", "tion") == ("function", [])


def test_phi4_mini_sees_the_tools_in_its_system_field(engines: dict[str, Engine]) -> None:
    turns = (
        ASK,
        ChatMessage("assistant", "", tool_calls=(REPLAYED,)),
        ChatMessage("tool", "sunny", tool_call_id="call_1"),
    )
    prompt = rendered(engines["phi4_mini"], *turns, tools=(WEATHER,))
    assert prompt.startswith(f'<|system|>{phi4_mini.SYSTEM}<|tool|>[{{"name": "get_weather"')
    call = f'<|tool_call|>[{{"name": "get_weather", "arguments": {ARGUMENTS}}}]<|/tool_call|>'
    assert f"<|assistant|>{call}<|end|>" in prompt
    assert "<|tool_response|>sunny<|end|>" in prompt


def test_command_r_actions_and_directly_answer() -> None:
    action = json.dumps([{"tool_name": SCRIPTED_TOOL_NAME, "parameters": {"city": "Paris"}}])
    text, found = split(command_r, "Action:", f"\n```json\n{action}\n```")
    assert text == "" and [c.name for c in found] == [SCRIPTED_TOOL_NAME]
    direct = json.dumps([{"tool_name": "directly-answer", "parameters": {}}])
    assert split(command_r, f"Action: ```json\n{direct}```")[1] == []  # text, as written


def test_scripts_are_distinct_tokens() -> None:
    for script in FAMILIES.values():
        assert isinstance(script, Script)
        assert len(set(script.added_tokens)) == len(script.added_tokens)
