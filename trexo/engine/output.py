"""One generation's output as it streams: its reasoning, its answer cut at stop sequences,
and the tool calls parsed out of it.

A model's output has channels, and the model switches between them by writing markers: a
thinking model (Qwen3, DeepSeek-R1) reasons between `<think>` and `</think>` before it
answers; a model calls a tool by writing the call in its chat template's format between
markers (`<tool_call>` ... `</tool_call>` for Qwen-style templates); a few formats put each
message under a header naming its channel (mlx-lm's "response formats"). mlx-lm knows them
all from the tokenizer (`TokenizerWrapper.think_start`/`think_end`, `tool_call_start`/
`tool_call_end`/`tool_parser`, `response_transitions`) and separates the channels with its
`TextStateMachine`, which strips the markers and holds back text that could begin one. Both
are reused here, not rewritten, with mlx-lm's states: "normal" is the answer, "reasoning"
the reasoning, "tool" a call's text; text in any other state (a header) is dropped, as
mlx-lm's server drops it. For the families mlx-lm has no parser for (Llama 3, DeepSeek V3,
gpt-oss, Command R, Gemma 2 / 3, Phi-4-mini), `trexo.engine.tool_parsers` gives the same:
markers, a parser, and where needed a response format. A call written with no marker at
all, as the whole answer (Llama 3's JSON, Gemma's list), is recognised by how the answer
begins, and held until the output ends.

Only chat output is split: a text completion (a raw prompt) is the text as generated. The
output starts in reasoning when the prompt ends inside a think block its template opened
(DeepSeek-R1's and Qwen3's thinking-only templates end the generation prompt with
`<think>`). Whitespace at the edges of a think block (the template's newlines around the
reasoning, before the answer) is trimmed.

Stop sequences end the output wherever they are, in the reasoning or in the answer (as
mlx-lm's server and vLLM match them against all the text generated), but never inside a
call's arguments; a marker between two pieces of text ends any stop string begun.

Output that looks like a call but is not a valid one (it does not parse, or names a function
the request did not offer) is returned as the text the model wrote, markers included:
never dropped, never an error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from mlx_lm.generate import TextStateMachine

from trexo.engine.prompt import forced_tool_call, template_tools
from trexo.engine.stops import StopMatcher
from trexo.engine.tool_parsers import ToolFormat, tool_family
from trexo.types.generation import GenerationRequest, ToolCall
from trexo.types.ids import new_id

log = logging.getLogger(__name__)

NORMAL = "normal"
REASONING = "reasoning"
IN_CALL = "tool"
CALL_ID_PREFIX = "call_"

Transitions = dict[str, list[tuple[str, str]]]
"""A `TextStateMachine`'s edges: state -> [(marker, next state)]."""


@attrs.frozen
class Released:
    """What a piece of output released: reasoning, then text safe to emit, then calls
    completed; `stopped`: a stop sequence ended the output."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    stopped: bool = False
    stop_sequence: str | None = None
    """The stop sequence that ended the output, when one did."""
    reasoning: str = ""
    """The model's reasoning (its think block), apart from its answer `text`."""

    def then(self, later: Released) -> Released:
        """This release followed by `later`."""
        return Released(
            self.text + later.text,
            self.tool_calls + later.tool_calls,
            stopped=self.stopped or later.stopped,
            stop_sequence=self.stop_sequence or later.stop_sequence,
            reasoning=self.reasoning + later.reasoning,
        )


NOTHING_MORE = Released(stopped=True)
"""What the end releases after a stop sequence ended the output (it said which)."""


@attrs.frozen
class Said:
    """Text the model wrote in one channel: its answer, or its reasoning."""

    text: str
    reasoning: bool = False


Part = Said | ToolCall


@attrs.frozen
class OutputFormat:
    """Where a model's output switches channel: the markers its tokenizer knows. Read once
    per model; each request's machine is built from it (`transitions`)."""

    think: tuple[str, str] | None = None
    """The think block's start and end markers."""
    tools: ToolFormat | None = None
    response: Mapping[str, tuple[tuple[str, str], ...]] = attrs.field(factory=dict)
    """A response format's own edges (mlx-lm's `response_transitions`)."""
    initial: str = NORMAL
    """The state a response starts in (a response format's header, or the answer)."""
    structural: tuple[str, ...] = ()
    """Markers stripped from the answer (mlx-lm's `structural_markers`)."""

    @classmethod
    def of(cls, tokenizer: Any) -> OutputFormat:
        """The format mlx-lm's `TokenizerWrapper` knows (a Hugging Face tokenizer: none)."""
        think = None
        if getattr(tokenizer, "has_thinking", False):
            think = (tokenizer.think_start, tokenizer.think_end)
        response = getattr(tokenizer, "response_transitions", None) or {}
        initial = getattr(tokenizer, "response_initial_state", None) or NORMAL
        family_format = getattr(tool_family(tokenizer), "RESPONSE_FORMAT", None)
        if not response and family_format is not None:  # harmony, Command R7B
            response, initial = family_format["transitions"], family_format["initial_state"]
        return cls(
            think,
            ToolFormat.of(tokenizer),
            {state: tuple(edges) for state, edges in response.items()},
            initial,
            tuple(getattr(tokenizer, "structural_markers", None) or ()),
        )

    def transitions(self, *, calls: bool) -> Transitions:
        """The edges of mlx-lm's `make_text_state_machine`, less its stop words (stops are cut
        here, in every channel), and a call's markers only when calls are parsed."""
        edges: Transitions = {}
        if self.think is not None:
            edges.setdefault(NORMAL, []).append((self.think[0], REASONING))
            edges[REASONING] = [(self.think[1], NORMAL)]
        if calls and self.tools is not None:
            targets = {state for pairs in self.response.values() for _, state in pairs}
            if IN_CALL not in targets:  # a response format that goes to calls decides where
                edges.setdefault(NORMAL, []).append((self.tools.start, IN_CALL))
            if self.think is not None:
                edges[REASONING].append((self.tools.start, IN_CALL))
            edges[IN_CALL] = [(self.tools.end, NORMAL)] if self.tools.end else []
        for marker in self.structural:
            edges.setdefault(NORMAL, []).append((marker, NORMAL))
        for state, pairs in self.response.items():
            edges.setdefault(state, []).extend(pairs)
        return edges


class ToolCalls:
    """Parses the calls a model writes, with mlx-lm's parser for its format; what is no
    valid call comes back as the text the model wrote."""

    def __init__(
        self, tool_format: ToolFormat, tools: Sequence[dict[str, Any]], *, single_call: bool = False
    ) -> None:
        self.format = tool_format
        self._tools = list(tools)
        self._names = {tool["function"]["name"] for tool in tools}
        self._single = single_call
        self.calls_made = 0

    def parse(self, text: str, *, closed: bool, marked: bool = True) -> list[Part]:
        """The calls in `text` (what was between the markers; `closed`: the end marker was
        written; not `marked`: a bare call, written with no markers), or the text as
        written if it holds no valid call."""
        raw = text
        if marked:
            raw = self.format.start + text + (self.format.end if closed else "")
        try:
            parsed = self.format.parser(text, self._tools)
            calls = [self._call(item) for item in _as_list(parsed)]
        except Exception as exc:  # a parser of any model may raise anything on bad text
            log.info("model output is not a valid tool call (%s): returned as text", exc)
            return [Said(raw)]
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


def _as_list(parsed: Any) -> list[Any]:
    return parsed if isinstance(parsed, list) else [parsed]


class OutputSplitter:
    """Separates one generation's reasoning, answer and calls as it streams: mlx-lm's
    `TextStateMachine` over `transitions`, starting in `initial`."""

    def __init__(
        self, transitions: Transitions, initial: str = NORMAL, calls: ToolCalls | None = None
    ) -> None:
        machine = TextStateMachine(transitions)  # type: ignore[no-untyped-call]
        self._state = machine.make_state(initial)  # type: ignore[no-untyped-call]
        self._calls = calls
        self._call_text = ""
        self._trim = initial == REASONING
        """Leading whitespace is dropped: a think block has just opened or closed."""
        self._space = ""
        """The reasoning's trailing whitespace, released only if more reasoning follows."""
        self._undecided = calls is not None and bool(calls.format.bare_start) and initial == NORMAL
        """The answer may yet be a bare call: it is only whitespace so far (`_lead`)."""
        self._lead = ""
        self._in_bare = False
        """The answer is a bare call (its text in `_call_text`), parsed when the output ends."""

    @property
    def state(self) -> str:
        state: str = self._state[0]
        return state

    @property
    def calls_made(self) -> int:
        return self._calls.calls_made if self._calls is not None else 0

    def feed(self, piece: str) -> list[Part]:
        """The reasoning, text and calls `piece` completes, in order."""
        before = self.state
        self._state, segments = TextStateMachine.split(self._state, piece)  # type: ignore[no-untyped-call]
        return self._parts(before, segments)

    def finish(self) -> list[Part]:
        """The output has ended: what was held back, and a call left open (some formats
        have no end marker; a model may also stop before writing it)."""
        before = self.state
        self._state, held, state = TextStateMachine.flush(self._state)  # type: ignore[no-untyped-call]
        out = self._parts(before, [(state, held)])
        if state == IN_CALL and self._calls is not None:
            text, self._call_text = self._call_text, ""
            if text.strip():
                out += self._calls.parse(text, closed=not self._calls.format.end)
        if self._in_bare and self._calls is not None:
            text, self._call_text, self._in_bare = self._call_text, "", False
            out += self._calls.parse(text, closed=True, marked=False)
        elif self._lead:
            out.append(Said(self._lead))
        self._undecided, self._lead = False, ""
        return out

    def _parts(self, before: str, segments: list[tuple[str, str]]) -> list[Part]:
        out: list[Part] = []
        previous = before
        for state, text in segments:
            if state != previous:
                out += self._switch(previous, state)
                previous = state
            if state == REASONING:
                out += self._reasoning(text)
            elif state == IN_CALL and self._calls is not None:
                self._call_text += text
            elif state == NORMAL and (self._undecided or self._in_bare):
                out += self._bare(text)
            elif state in (NORMAL, IN_CALL) and (text := self._trimmed(text)):
                out.append(Said(text))  # (no calls parsed: a call's text is answer text)
            # any other state is a response format's header: dropped
        return out

    def _switch(self, previous: str, state: str) -> list[Part]:
        """What leaving `previous` for `state` completes: a call that ended."""
        self._undecided = False  # a marker came first: the answer is no bare call
        if state == REASONING or previous == REASONING:
            self._trim = True
            self._space = ""
        if previous != IN_CALL or self._calls is None:
            return []
        text, self._call_text = self._call_text, ""
        return self._calls.parse(text, closed=True)

    def _bare(self, text: str) -> list[Part]:
        """Answer text while it may be, or is, a bare call: held until how it begins says
        which."""
        assert self._calls is not None
        if self._in_bare:
            self._call_text += text
            return []
        self._lead += text
        start, body = self._calls.format.bare_start, self._lead.lstrip()
        if len(body) < len(start) and start.startswith(body):
            return []  # it may yet begin a call
        lead, self._lead, self._undecided = self._lead, "", False
        if body.startswith(start):
            self._in_bare, self._call_text = True, body
            return []
        return [Said(lead)]

    def _reasoning(self, text: str) -> list[Part]:
        text = self._trimmed(text)
        body = text.rstrip()
        if not body:
            self._space += text
            return []
        said, self._space = Said(self._space + body, reasoning=True), text[len(body) :]
        return [said]

    def _trimmed(self, text: str) -> str:
        if self._trim:
            text = text.lstrip()
            self._trim = not text
        return text


class OutputReader:
    """Text cut at stop sequences and, for a chat, the reasoning and the calls apart."""

    def __init__(self, stops: Sequence[str], splitter: OutputSplitter | None = None) -> None:
        self._stops = StopMatcher(stops)
        self._splitter = splitter
        self._reasoning = splitter is not None and splitter.state == REASONING
        """The channel the stop matcher's held text belongs to."""

    @property
    def calls_made(self) -> int:
        return self._splitter.calls_made if self._splitter is not None else 0

    @property
    def reasoning(self) -> bool:
        """The model is writing its reasoning now."""
        return self._splitter is not None and self._splitter.state == REASONING

    def feed(self, piece: str) -> Released:
        if self._splitter is None:
            result = self._stops.feed(piece)
            return Released(result.text, stopped=result.stopped, stop_sequence=result.matched)
        return self._release(self._splitter.feed(piece))

    def finish(self) -> Released:
        """The output ended (EOS, `max_tokens`, a cancel): everything still held back."""
        if self._stops.stopped:
            return NOTHING_MORE
        if self._splitter is None:
            return Released(self._stops.flush())
        released = self._release(self._splitter.finish())
        if released.stopped:
            return released
        return released.then(self._said(self._stops.flush(), reasoning=self._reasoning))

    def _release(self, parts: list[Part]) -> Released:
        released = Released()
        for part in parts:
            if isinstance(part, ToolCall):  # a call ends any stop string begun
                held = self._said(self._stops.flush(), reasoning=self._reasoning)
                released = released.then(held).then(Released(tool_calls=(part,)))
                continue
            if part.reasoning != self._reasoning:  # so does a think block's marker
                released = released.then(self._said(self._stops.flush(), self._reasoning))
                self._reasoning = part.reasoning
            result = self._stops.feed(part.text)
            released = released.then(self._said(result.text, part.reasoning))
            if result.stopped:
                return released.then(Released(stopped=True, stop_sequence=result.matched))
        return released

    @staticmethod
    def _said(text: str, reasoning: bool) -> Released:
        return Released(reasoning=text) if reasoning else Released(text)


def opens_thinking(tokenizer: Any, prompt: Sequence[int]) -> bool:
    """Whether `prompt` ends inside a think block: its last turn (after the last end-of-turn
    token) opens one and does not close it. A client's `<think>` in an earlier turn opens
    nothing."""
    if not getattr(tokenizer, "has_thinking", False):
        return False
    ends = set(getattr(tokenizer, "eos_token_ids", None) or ())
    turn = len(prompt)
    while turn > 0 and prompt[turn - 1] not in ends:
        turn -= 1
    tokens = list(prompt)
    start: int = tokenizer.rfind_think_start(tokens, start=turn)
    end: int = tokenizer.rfind_think_end(tokens, start=turn)
    return start > end


def output_reader(
    output_format: OutputFormat, tokenizer: Any, request: GenerationRequest, prompt: Sequence[int]
) -> OutputReader:
    """The reader of `request`'s output, from a model with `tokenizer` (whose format is
    `output_format`), after `prompt` (the request's encoded prompt)."""
    stops = request.params.stop
    if request.messages is None:
        return OutputReader(stops)  # a text completion: the text as generated
    tools = template_tools(request)
    calls = None
    if tools and output_format.tools is not None:
        calls = ToolCalls(output_format.tools, tools, single_call=not request.parallel_tool_calls)
    transitions = output_format.transitions(calls=calls is not None)
    if not transitions:
        return OutputReader(stops)
    if calls is not None and forced_tool_call(tokenizer, request):
        initial = IN_CALL
    elif opens_thinking(tokenizer, prompt):
        initial = REASONING
    elif request.continue_final:
        initial = NORMAL  # the model goes on with its answer, past any header
    else:
        initial = output_format.initial
    return OutputReader(stops, OutputSplitter(transitions, initial, calls))
