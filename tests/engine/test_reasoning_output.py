"""A thinking model's reasoning split from its answer as it streams, by mlx-lm's own text
state machine: whatever the pieces, the same reasoning, answer, calls and stops."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mlx_lm.tool_parsers import json_tools

from trexo.engine.output import (
    NORMAL,
    REASONING,
    OutputFormat,
    OutputReader,
    OutputSplitter,
    Released,
    ToolCalls,
    ToolFormat,
    output_reader,
)
from trexo.types.generation import ChatMessage, GenerationRequest, SamplingParams
from trexo.types.ids import RequestId

THINK = ("<think>", "</think>")
QWEN_FORMAT = OutputFormat(THINK)
QWEN3 = "<think>\nThe user greets me.\n</think>\n\nHello there."
"""What Qwen3 writes: newlines around its reasoning, a blank line before its answer."""
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOLS = ToolFormat(json_tools.tool_call_start, json_tools.tool_call_end, json_tools.parse_tool_call)
HARMONY_LIKE: Any = {
    "header": [
        ("<|channel|>analysis<|message|>", REASONING),
        ("<|channel|>final<|message|>", NORMAL),
    ],
    REASONING: [("<|end|>", "header")],
    NORMAL: [("<|end|>", "header")],
}
"""A response format whose messages sit under headers (mlx-lm's muse_spark is one)."""


def reader(
    initial: str = NORMAL,
    stops: tuple[str, ...] = (),
    *,
    tools: bool = False,
    output_format: OutputFormat = QWEN_FORMAT,
) -> OutputReader:
    if tools:
        output_format = OutputFormat(output_format.think, TOOLS)
    calls = ToolCalls(TOOLS, [WEATHER]) if tools else None
    transitions = output_format.transitions(calls=tools)
    return OutputReader(stops, OutputSplitter(transitions, initial, calls))


def read(out: OutputReader, pieces: list[str]) -> Released:
    """Everything the pieces and the end release, joined."""
    released = Released()
    for piece in pieces:
        released = released.then(out.feed(piece))
        if released.stopped:
            return released
    return released.then(out.finish())


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@given(st.lists(st.integers(0, len(QWEN3)), max_size=12))
def test_reasoning_and_answer_are_the_same_however_the_output_is_split(cuts: list[int]) -> None:
    result = read(reader(), split(QWEN3, cuts))
    assert (result.reasoning, result.text) == ("The user greets me.", "Hello there.")
    assert not result.stopped


def test_markers_split_across_pieces_are_still_markers() -> None:
    result = read(reader(), ["<th", "ink>a", "b</", "thi", "nk", ">c"])
    assert (result.reasoning, result.text) == ("ab", "c")


def test_reasoning_streams_as_it_comes() -> None:
    out = reader()
    assert out.feed("<think>").reasoning == ""
    assert out.reasoning
    assert out.feed("one").reasoning == "one"
    assert out.feed(" two").reasoning == " two"
    step = out.feed("</think>Answer")
    assert (step.reasoning, step.text) == ("", "Answer")
    assert not out.reasoning


def test_a_prompt_that_opened_the_think_block_starts_in_reasoning() -> None:
    result = read(reader(REASONING), ["\nStill thinking.", "\n</think>", "\n\nDone."])
    assert (result.reasoning, result.text) == ("Still thinking.", "Done.")


@pytest.mark.parametrize("text", ["Just an answer.", "a < b and <thin ice>", "x <think"])
def test_without_markers_everything_is_answer(text: str) -> None:
    result = read(reader(), split(text, [1, 5, 9]))
    assert (result.reasoning, result.text) == ("", text)
    plain = read(OutputReader(()), [text])  # a model with no markers: no splitter at all
    assert (plain.reasoning, plain.text) == ("", text)


def test_reasoning_cut_by_max_tokens_is_reasoning() -> None:
    result = read(reader(), ["<think>\nHalf a tho", "ught"])
    assert (result.reasoning, result.text) == ("Half a thought", "")


def test_whitespace_at_the_edges_of_a_think_block_is_trimmed_inside_it_kept() -> None:
    result = read(reader(), ["<think>\n\n", " a \n\n b ", "\n</think>", "\n\n", " c "])
    assert (result.reasoning, result.text) == ("a \n\n b", "c ")
    empty = read(reader(), ["<think>\n\n</think>\n\nAnswer."])
    assert (empty.reasoning, empty.text) == ("", "Answer.")


def test_a_stop_sequence_in_the_reasoning_ends_the_output() -> None:
    result = read(reader(stops=("STOP",)), ["<think>a ST", "OP b</think>c"])
    assert (result.reasoning, result.text, result.stopped) == ("a ", "", True)
    assert result.stop_sequence == "STOP"


def test_a_stop_sequence_in_the_answer_cuts_the_answer() -> None:
    result = read(reader(stops=("STOP",)), ["<think>plan</think>", "yes STOP no"])
    assert (result.reasoning, result.text, result.stopped) == ("plan", "yes ", True)


def test_a_marker_ends_a_stop_string_begun_before_it() -> None:
    result = read(reader(stops=("ab",)), ["<think>xa", "</think>", "b"])
    assert (result.reasoning, result.text, result.stopped) == ("xa", "b", False)


def test_a_call_after_the_reasoning_is_parsed() -> None:
    result = read(reader(tools=True), split("<think>Check.</think>\n\n" + CALL, [3, 20, 40]))
    assert result.reasoning == "Check."
    [call] = result.tool_calls
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert result.text == ""


def test_a_call_inside_an_unclosed_think_block_is_a_call() -> None:
    result = read(reader(tools=True), ["<think>I should call.", CALL])
    assert result.reasoning == "I should call."
    assert [call.name for call in result.tool_calls] == ["get_weather"]


def test_a_response_formats_headers_are_dropped() -> None:
    headers = OutputFormat(response=HARMONY_LIKE, initial="header")
    out = reader("header", output_format=headers)
    pieces = ["<|channel|>analysis<|mes", "sage|>Plan.<|end|><|start|>assistant", "<|channel|>"]
    result = read(out, [*pieces, "final<|message|>Hi."])
    assert (result.reasoning, result.text) == ("Plan.", "Hi.")


class _NoTokenizer:
    """A tokenizer that knows no markers (as a Hugging Face tokenizer, for mlx-lm)."""


@pytest.mark.parametrize("continued", [False, True])
def test_a_text_completion_is_the_text_as_generated(continued: bool) -> None:
    text = "<think>a</think>b"
    completion = GenerationRequest(RequestId("r"), prompt="x", params=SamplingParams(stop=("Z",)))
    out = output_reader(OutputFormat(THINK), _NoTokenizer(), completion, [1, 2])
    assert read(out, [text]) == Released(text)
    messages = (ChatMessage("user", "x"), ChatMessage("assistant", "Sure"))
    chat = GenerationRequest(RequestId("r"), messages=messages, continue_final=continued)
    out = output_reader(OutputFormat(THINK), _NoTokenizer(), chat, [1, 2])
    assert read(out, [text]) == Released("b", reasoning="a")
