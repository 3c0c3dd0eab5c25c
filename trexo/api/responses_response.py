"""Build OpenAI Responses objects from trexo chunks: the non-streaming response and the
streamed events (`ResponseEvents`). Pure: no I/O.

The output is a list of items: a thinking model's reasoning as a `reasoning` item (its
whole text as `reasoning_text` content, with no summary, as vLLM returns open models'
reasoning), the assistant's text as one `message` item, and one `function_call` item per
call (trexo receives each call whole, so one arguments delta holds
all of it). Item ids derive from the response's id and the item's position.

Finish reasons: "stop" and "tool_calls" complete the response; "length" leaves it
`incomplete` (`max_output_tokens`); "cancelled" (`POST /v1/cancel/{id}`) completes it with
the text so far, as Chat Completions reports it (see `trexo.api.chat_response`). "error" is
never a status: before the first byte it is an HTTP error; in a stream, an `error` event
followed by `response.failed`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import attrs

from trexo.api.errors import ApiError
from trexo.api.outcome import Outcome, outcome_of
from trexo.api.responses_request import RESPONSE_ID_PREFIX, ResponsesRequest
from trexo.types.chunks import Chunk, FinishReason, Usage
from trexo.types.generation import ToolCall

ResponseStatus = Literal["in_progress", "completed", "incomplete", "failed"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]

RESPONSE_OBJECT = "response"
MESSAGE_ID_PREFIX = "msg_"
REASONING_ID_PREFIX = "rs_"
FUNCTION_CALL_ID_PREFIX = "fc_"
INCOMPLETE_BY_LENGTH = {"reason": "max_output_tokens"}

_STATUSES: dict[FinishReason, ResponseStatus] = {
    "stop": "completed",
    "tool_calls": "completed",
    "cancelled": "completed",
    "length": "incomplete",
}
_TERMINAL_EVENTS: dict[ResponseStatus, str] = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
}


def response_status(reason: FinishReason) -> ResponseStatus:
    """The status of a response that finished for `reason`; `ValueError` for "error"."""
    try:
        return _STATUSES[reason]
    except KeyError:
        raise ValueError(f"finish reason {reason!r} is an error, not a finish") from None


def item_status(status: ResponseStatus) -> ItemStatus:
    """The status of the items a response in `status` ends with."""
    return "incomplete" if status in ("incomplete", "failed") else "completed"


def item_id(prefix: str, response_id: str, index: int) -> str:
    """The id of output item `index`: `msg_<response hex>_<index>` or `fc_...`."""
    return f"{prefix}{response_id.removeprefix(RESPONSE_ID_PREFIX)}_{index}"


def usage_body(usage: Usage) -> dict[str, Any]:
    """The Responses usage object; `cached_tokens` counts the prompt tokens the runner's
    prompt cache held (a conversation's earlier turns)."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def reasoning_item(item_id: str, text: str | None, status: ItemStatus) -> dict[str, Any]:
    """A `reasoning` item; `text` None: its content part has not begun."""
    return {
        "type": "reasoning",
        "id": item_id,
        "status": status,
        "summary": [],
        "content": [] if text is None else [reasoning_part(text)],
    }


def message_item(item_id: str, text: str | None, status: ItemStatus) -> dict[str, Any]:
    """An assistant `message` item; `text` None: its content part has not begun."""
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [] if text is None else [text_part(text)],
    }


def function_call_item(item_id: str, call: ToolCall, status: ItemStatus) -> dict[str, Any]:
    """A `function_call` item; in progress, its arguments have not begun."""
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": "" if status == "in_progress" else call.arguments,
        "status": status,
    }


def output_items(outcome: Outcome, response_id: str) -> list[dict[str, Any]]:
    """A finished generation's items: its reasoning (when it has some), its text (when it
    has some, or made no calls), then its calls."""
    status = item_status(response_status(outcome.finish_reason))
    items = []
    if outcome.reasoning:
        rs_id = item_id(REASONING_ID_PREFIX, response_id, 0)
        items.append(reasoning_item(rs_id, outcome.reasoning, status))
    if outcome.text or not outcome.tool_calls:
        msg_id = item_id(MESSAGE_ID_PREFIX, response_id, len(items))
        items.append(message_item(msg_id, outcome.text, status))
    for call in outcome.tool_calls:
        fc_id = item_id(FUNCTION_CALL_ID_PREFIX, response_id, len(items))
        items.append(function_call_item(fc_id, call, "completed"))
    return items


def response_body(
    request: ResponsesRequest,
    created_at: int,
    *,
    status: ResponseStatus,
    output: Sequence[dict[str, Any]],
    usage: Usage | None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A `response` object: its state, then the fields repeating the request."""
    return {
        "id": request.response_id,
        "object": RESPONSE_OBJECT,
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": INCOMPLETE_BY_LENGTH if status == "incomplete" else None,
        "model": request.model_id,
        "output": list(output),
        "usage": None if usage is None else usage_body(usage),
        **request.echo,
    }


def response_from_chunks(
    chunks: list[Chunk], request: ResponsesRequest, created_at: int
) -> dict[str, Any]:
    """The `response` for a finished generation's chunks (the last one finishes it)."""
    outcome = outcome_of(chunks)
    return response_body(
        request,
        created_at,
        status=response_status(outcome.finish_reason),
        output=output_items(outcome, request.response_id),
        usage=outcome.usage,
    )


def error_object(error: ApiError) -> dict[str, Any]:
    """A failed response's `error`, with a code from OpenAI's list for it."""
    return {
        "code": "server_error" if error.status >= 500 else "invalid_prompt",
        "message": error.message,
    }


@attrs.frozen
class _TextItem:
    """What a streamed item with one text part is: a message, or reasoning."""

    prefix: str
    item: Any
    """`message_item` or `reasoning_item`."""
    part: Any
    """`text_part` or `reasoning_part`."""
    events: str
    """Its text's delta and done events: `response.<events>.delta`."""


MESSAGE = _TextItem(MESSAGE_ID_PREFIX, message_item, text_part, "output_text")
REASONING = _TextItem(REASONING_ID_PREFIX, reasoning_item, reasoning_part, "reasoning_text")


@attrs.define
class ResponseEvents:
    """Turns one generation's trexo chunks into the Responses API's named stream events,
    each with its `sequence_number`. A `trexo.api.streaming.ChunkEvents`.

    `response.created` and `response.in_progress` open the stream. The reasoning is one
    reasoning item and the text one message item, each added, its content part added, text
    deltas (`response.reasoning_text.delta`, `response.output_text.delta`), then each of
    them done; each call is one function-call item (added, one arguments delta, done). An
    item of one kind closes the open item of another; text after it opens another.
    `response.completed` (or `response.incomplete`) ends the stream with the whole response.
    """

    request: ResponsesRequest
    created_at: int
    finished: bool = attrs.field(default=False, init=False)
    _sequence: int = attrs.field(default=0, init=False)
    _output: list[dict[str, Any]] = attrs.field(factory=list, init=False)
    """The items done so far."""
    _open: _TextItem | None = attrs.field(default=None, init=False)
    """The kind of the open item with text; None when none is open."""
    _text: str = attrs.field(default="", init=False)
    """The open item's text."""
    _completion_tokens: int = attrs.field(default=0, init=False)

    def opening(self) -> list[dict[str, Any]]:
        snapshot = self._response("in_progress")
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    def encode(self, chunk: Chunk) -> list[dict[str, Any]]:
        if self.finished:
            return []
        self._completion_tokens += len(chunk.token_ids)
        events = []
        for kind, text in ((REASONING, chunk.reasoning), (MESSAGE, chunk.text)):
            if text:
                events += self._add_text(kind, text)
        for call in chunk.tool_calls:
            events += self._close_item("completed")
            events += self._function_call(call)
        if chunk.finish_reason is not None:
            events += self._finish(chunk)
        return events

    def error(self, error: ApiError) -> list[dict[str, Any]]:
        """An `error` event, then `response.failed` with the output so far."""
        self.finished = True
        output = list(self._output)
        if self._open is not None:
            output.append(self._open.item(self._item_id, self._text, "incomplete"))
        failed = self._response("failed", output=output, error=error_object(error))
        return [
            self._event("error", code=error.code, message=error.message, param=error.param),
            self._event("response.failed", response=failed),
        ]

    # --- items ---------------------------------------------------------------------------------

    @property
    def _item_id(self) -> str:
        """The id of the item at the next output index (the open one's, when one is open)."""
        prefix = self._open.prefix if self._open is not None else MESSAGE_ID_PREFIX
        return item_id(prefix, self.request.response_id, len(self._output))

    def _add_text(self, kind: _TextItem, text: str) -> list[dict[str, Any]]:
        events = [] if self._open is kind else self._close_item("completed") + self._open_item(kind)
        self._text += text
        events.append(self._text_event(f"response.{kind.events}.delta", delta=text))
        return events

    def _open_item(self, kind: _TextItem) -> list[dict[str, Any]]:
        self._open, self._text = kind, ""
        return [
            self._event(
                "response.output_item.added",
                output_index=len(self._output),
                item=kind.item(self._item_id, None, "in_progress"),
            ),
            self._text_event("response.content_part.added", part=kind.part("")),
        ]

    def _close_item(self, status: ItemStatus) -> list[dict[str, Any]]:
        kind = self._open
        if kind is None:
            return []
        text, index = self._text, len(self._output)
        item = kind.item(self._item_id, text, status)
        events = [
            self._text_event(f"response.{kind.events}.done", text=text),
            self._text_event("response.content_part.done", part=kind.part(text)),
            self._event("response.output_item.done", output_index=index, item=item),
        ]
        self._output.append(item)
        self._open, self._text = None, ""
        return events

    def _function_call(self, call: ToolCall) -> list[dict[str, Any]]:
        index = len(self._output)
        fc_id = item_id(FUNCTION_CALL_ID_PREFIX, self.request.response_id, index)
        done = function_call_item(fc_id, call, "completed")
        self._output.append(done)
        where = {"item_id": fc_id, "output_index": index}
        return [
            self._event(
                "response.output_item.added",
                output_index=index,
                item=function_call_item(fc_id, call, "in_progress"),
            ),
            self._event("response.function_call_arguments.delta", **where, delta=call.arguments),
            self._event("response.function_call_arguments.done", **where, arguments=call.arguments),
            self._event("response.output_item.done", output_index=index, item=done),
        ]

    def _finish(self, chunk: Chunk) -> list[dict[str, Any]]:
        assert chunk.finish_reason is not None
        self.finished = True
        status = response_status(chunk.finish_reason)
        events = []
        answered = any(item["type"] != "reasoning" for item in self._output)
        if not answered and self._open is not MESSAGE:  # an empty answer is an empty message
            events += self._close_item(item_status(status)) + self._open_item(MESSAGE)
        events += self._close_item(item_status(status))
        usage = chunk.usage or Usage(0, self._completion_tokens)
        final = self._response(status, output=self._output, usage=usage)
        events.append(self._event(_TERMINAL_EVENTS[status], response=final))
        return events

    # --- events --------------------------------------------------------------------------------

    def _text_event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """An event about the open item's one content part."""
        where = {"item_id": self._item_id, "output_index": len(self._output)}
        if kind.startswith("response.output_text."):
            fields["logprobs"] = []
        return self._event(kind, **where, content_index=0, **fields)

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _response(
        self,
        status: ResponseStatus,
        *,
        output: Sequence[dict[str, Any]] = (),
        usage: Usage | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return response_body(
            self.request, self.created_at, status=status, output=output, usage=usage, error=error
        )
