"""Tool calls parsed out of streamed output with mlx-lm's own parsers: whatever the pieces,
the same calls and text; what is not a valid call stays text."""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mlx_lm.tool_parsers import json_tools, mistral

from trexo.engine.output import (
    IN_CALL,
    NORMAL,
    OutputFormat,
    OutputReader,
    OutputSplitter,
    Released,
    ToolCalls,
    ToolFormat,
)
from trexo.types.generation import ToolCall

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def fmt(module: ModuleType) -> ToolFormat:
    return ToolFormat(module.tool_call_start, module.tool_call_end, module.parse_tool_call)


def reader(
    tools: list[dict[str, Any]] | None = None,
    stops: tuple[str, ...] = (),
    module: ModuleType = json_tools,
    *,
    in_call: bool = False,
    single_call: bool = False,
) -> OutputReader:
    tool_format = fmt(module)
    calls = ToolCalls(tool_format, [WEATHER] if tools is None else tools, single_call=single_call)
    transitions = OutputFormat(tools=tool_format).transitions(calls=True)
    return OutputReader(stops, OutputSplitter(transitions, IN_CALL if in_call else NORMAL, calls))


def read(out: OutputReader, pieces: list[str]) -> Released:
    released = [out.feed(piece) for piece in pieces]
    if not any(r.stopped for r in released):
        released.append(out.finish())
    return Released(
        "".join(r.text for r in released),
        tuple(c for r in released for c in r.tool_calls),
        stopped=any(r.stopped for r in released),
    )


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def shape(calls: tuple[ToolCall, ...]) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@given(st.lists(st.integers(0, 120), max_size=10))
def test_calls_and_text_are_the_same_however_the_output_is_split(cuts: list[int]) -> None:
    text = "Let me check." + CALL + " Done."
    result = read(reader(), split(text, cuts))
    assert result.text == "Let me check. Done."
    assert shape(result.tool_calls) == [("get_weather", {"city": "Paris"})]
    assert result.tool_calls[0].id.startswith("call_")


def test_two_calls_in_parallel_and_only_the_first_when_parallel_calls_are_off() -> None:
    two = CALL + CALL.replace("Paris", "Oslo")
    assert [args for _, args in shape(read(reader(), [two]).tool_calls)] == [
        {"city": "Paris"},
        {"city": "Oslo"},
    ]
    single = read(reader(single_call=True), [two])
    assert shape(single.tool_calls) == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize(
    "bad",
    [
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',  # not offered
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
        '<tool_call>\n{"name": "get_weather", "arguments": [1]}\n</tool_call>',
    ],
)
def test_what_is_not_a_valid_call_is_returned_as_the_text_written(bad: str) -> None:
    result = read(reader(), ["a ", bad, " b"])
    assert result.tool_calls == ()
    assert result.text == "a " + bad + " b"


def test_a_call_left_open_at_the_end_is_parsed_or_kept_as_text() -> None:
    open_call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert shape(read(reader(), [open_call]).tool_calls) == [("get_weather", {"city": "Paris"})]
    truncated = '<tool_call>\n{"name": "get_weather", "argu'
    result = read(reader(), [truncated])
    assert (result.text, result.tool_calls) == (truncated, ())


def test_a_format_without_an_end_marker_parses_at_the_end() -> None:
    text = 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
    result = read(reader(module=mistral), split(text, [3, 9, 20, 30]))
    assert result.text == "Sure."
    assert shape(result.tool_calls) == [("get_weather", {"city": "Paris"})]


def test_a_forced_call_starts_inside_the_call() -> None:
    body = '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    result = read(reader(in_call=True), [body[:7], body[7:]])
    assert (result.text, shape(result.tool_calls)) == ("", [("get_weather", {"city": "Paris"})])


def test_stop_sequences_cut_the_text_but_not_a_calls_arguments() -> None:
    result = read(reader(stops=("Paris",)), [CALL, " then Paris, then more"])
    assert shape(result.tool_calls) == [("get_weather", {"city": "Paris"})]
    assert (result.text, result.stopped) == (" then ", True)


def test_text_held_for_a_stop_sequence_is_released_before_a_call() -> None:
    result = read(reader(stops=("END",)), ["E", CALL, "N"])
    assert result.text == "EN"
    assert len(result.tool_calls) == 1


def test_without_tools_the_reader_only_cuts_at_stops() -> None:
    out = OutputReader(("!",))
    assert read(out, [CALL, " hi! more"]) == Released(CALL + " hi", stopped=True)
