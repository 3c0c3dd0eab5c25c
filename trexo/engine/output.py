"""One generation's output as it streams: its text, cut at stop sequences, and the tool calls
parsed out of it.

A model calls a tool by writing the call in its chat template's format between markers
(`<tool_call>` ... `</tool_call>` for Qwen-style templates). mlx-lm chooses the format and
its parser from the chat template (`TokenizerWrapper.tool_parser`, `tool_call_start`,
`tool_call_end`); mlx-lm's `TextStateMachine` separates the marked text from the rest as it
streams, holding back text that could begin a marker. Both are reused here, not rewritten.

Output that looks like a call but is not a valid one (it does not parse, or names a function
the request did not offer) is returned as the text the model wrote, markers included:
never dropped, never an error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import attrs
from mlx_lm.generate import TextStateMachine

from trexo.engine.stops import StopMatcher
from trexo.types.generation import GenerationRequest, ToolCall
from trexo.types.ids import new_id

log = logging.getLogger(__name__)

NORMAL = "normal"
IN_CALL = "tool"
CALL_ID_PREFIX = "call_"


@attrs.frozen
class Released:
    """What a piece of output released: text safe to emit and calls completed, in order
    (text first); `stopped`: a stop sequence ended the output."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    stopped: bool = False
    stop_sequence: str | None = None
    """The stop sequence that ended the output, when one did."""


@attrs.frozen
class ToolFormat:
    """How a model writes calls: its markers and mlx-lm's parser for what is between them."""

    start: str
    end: str
    parser: Any
    """`parse_tool_call(text, tools) -> dict | list[dict]` of an mlx-lm tool parser."""

    @classmethod
    def of(cls, tokenizer: Any) -> ToolFormat | None:
        """The format of mlx-lm's `TokenizerWrapper`; None if it knows of none."""
        if not getattr(tokenizer, "has_tool_calling", False):
            return None
        return cls(tokenizer.tool_call_start, tokenizer.tool_call_end or "", tokenizer.tool_parser)


class ToolCallReader:
    """Separates one generation's tool calls from its text."""

    def __init__(
        self,
        tool_format: ToolFormat,
        tools: Sequence[dict[str, Any]],
        *,
        in_call: bool = False,
        single_call: bool = False,
    ) -> None:
        self._format = tool_format
        self._tools = list(tools)
        self._names = {tool["function"]["name"] for tool in tools}
        self._single = single_call
        edges: dict[str, list[tuple[str, str]]] = {NORMAL: [(tool_format.start, IN_CALL)]}
        edges[IN_CALL] = [(tool_format.end, NORMAL)] if tool_format.end else []
        self._machine = TextStateMachine(edges)  # type: ignore[no-untyped-call]
        self._state = self._machine.make_state(IN_CALL if in_call else NORMAL)  # type: ignore[no-untyped-call]
        self._call_text = ""
        self.calls_made = 0

    def feed(self, piece: str) -> list[str | ToolCall]:
        """The text and calls `piece` completes, in order."""
        self._state, segments = TextStateMachine.split(self._state, piece)  # type: ignore[no-untyped-call]
        out: list[str | ToolCall] = []
        for i, (state, text) in enumerate(segments):
            if state == IN_CALL:
                self._call_text += text
                continue
            if i and segments[i - 1][0] == IN_CALL:  # a call just ended
                out += self._parse(self._call_text, closed=True)
                self._call_text = ""
            if text:
                out.append(text)
        return out

    def finish(self) -> list[str | ToolCall]:
        """The output has ended: what was held back, and a call left open (some formats
        have no end marker; a model may also stop before writing it)."""
        self._state, held, state = TextStateMachine.flush(self._state)  # type: ignore[no-untyped-call]
        if state != IN_CALL:
            return [held] if held else []
        text, self._call_text = self._call_text + held, ""
        return self._parse(text, closed=not self._format.end) if text.strip() else []

    def _parse(self, text: str, *, closed: bool) -> list[str | ToolCall]:
        raw = self._format.start + text + (self._format.end if closed else "")
        try:
            parsed = self._format.parser(text, self._tools)
            calls = [self._call(item) for item in _as_list(parsed)]
        except Exception as exc:  # a parser of any model may raise anything on bad text
            log.info("model output is not a valid tool call (%s): returned as text", exc)
            return [raw]
        if self._single and self.calls_made + len(calls) > 1:
            log.info("parallel tool calls are off: dropping %d later call(s)", len(calls) - 1)
            calls = calls[: max(0, 1 - self.calls_made)]
        self.calls_made += len(calls)
        return list(calls)

    def _call(self, item: Any) -> ToolCall:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ValueError(f"a call must name its function: {item!r}")
        if item["name"] not in self._names:
            raise ValueError(f"the model called {item['name']!r}, which it was not offered")
        arguments = item.get("arguments", {})
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        if not isinstance(arguments, dict):
            raise ValueError(f"a call's arguments must be an object: {arguments!r}")
        return ToolCall(
            id=str(item.get("id") or CALL_ID_PREFIX + new_id()),
            name=item["name"],
            arguments=json.dumps(arguments, ensure_ascii=False),
        )


NOTHING_MORE = Released(stopped=True)
"""What the end releases after a stop sequence ended the output (it said which)."""


def _as_list(parsed: Any) -> list[Any]:
    return parsed if isinstance(parsed, list) else [parsed]


class OutputReader:
    """Text cut at stop sequences and, when the request offers tools, calls parsed out.

    Stop sequences apply to the text, not to a call's arguments.
    """

    def __init__(self, stops: Sequence[str], tools: ToolCallReader | None = None) -> None:
        self._stops = StopMatcher(stops)
        self._tools = tools

    @property
    def calls_made(self) -> int:
        return self._tools.calls_made if self._tools is not None else 0

    def feed(self, piece: str) -> Released:
        if self._tools is None:
            result = self._stops.feed(piece)
            return Released(result.text, stopped=result.stopped, stop_sequence=result.matched)
        return self._release(self._tools.feed(piece))

    def finish(self) -> Released:
        """The output ended (EOS, `max_tokens`, a cancel): everything still held back."""
        if self._stops.stopped:
            return NOTHING_MORE
        if self._tools is None:
            return Released(self._stops.flush())
        released = self._release(self._tools.finish())
        if released.stopped:
            return released
        return Released(released.text + self._stops.flush(), released.tool_calls)

    def _release(self, parts: list[str | ToolCall]) -> Released:
        texts: list[str] = []
        calls: list[ToolCall] = []
        for part in parts:
            if isinstance(part, ToolCall):
                texts.append(self._stops.flush())  # a call ends any stop string begun
                calls.append(part)
                continue
            result = self._stops.feed(part)
            texts.append(result.text)
            if result.stopped:
                return Released("".join(texts), tuple(calls), True, result.matched)
        return Released("".join(texts), tuple(calls))


def output_reader(tokenizer: Any, request: GenerationRequest) -> OutputReader:
    """The reader for `request`'s output from a model with `tokenizer`."""
    from trexo.engine.prompt import forced_tool_call, template_tools

    tools = template_tools(request)
    tool_format = ToolFormat.of(tokenizer)
    if not tools or tool_format is None:
        return OutputReader(request.params.stop)
    reader = ToolCallReader(
        tool_format,
        tools,
        in_call=forced_tool_call(tokenizer, request),
        single_call=not request.parallel_tool_calls,
    )
    return OutputReader(request.params.stop, reader)
