"""Building Ollama responses from chunks and listings (pure), checked against the official
client's own response types."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from ollama import ChatResponse, GenerateResponse, ListResponse, ProcessResponse, ShowResponse

from trexo.api.errors import ApiError
from trexo.api.handle import ModelListing
from trexo.api.ollama_response import (
    LineEncoder,
    Timings,
    answer_body,
    digest,
    done_reason,
    load_body,
    running_body,
    show_body,
    stats,
    tag_body,
    timestamp,
    tool_call_body,
)
from trexo.api.outcome import Outcome
from trexo.hub.curated import curated_models
from trexo.types.chunks import Chunk, TokenLogprob, TopLogprob, Usage
from trexo.types.generation import ToolCall
from trexo.types.ids import RequestId
from trexo.types.models import ModelLayout, ModelRef

RID = RequestId("r")
WEATHER_CALL = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
MOMENT = datetime(2024, 7, 22, 20, 33, 28, 123648, tzinfo=UTC)
START_NS = 1_000


def encoder(endpoint: str = "chat", *, logprobs: bool = False) -> LineEncoder:
    """An encoder whose clock ticks 100 ns per line it writes."""
    ticks = itertools.count(START_NS + 100, 100)
    return LineEncoder(
        endpoint,  # type: ignore[arg-type]
        "m",
        START_NS,
        logprobs=logprobs,
        clock=lambda: next(ticks),
        wall_clock=lambda: MOMENT,
    )


def test_timestamps_are_rfc3339_in_utc() -> None:
    assert timestamp(MOMENT) == "2024-07-22T20:33:28.123648Z"
    paris = MOMENT.astimezone(timezone(timedelta(hours=2)))
    assert timestamp(paris) == timestamp(MOMENT)
    assert datetime.fromisoformat(timestamp(MOMENT)) == MOMENT


def test_done_reasons() -> None:
    assert [done_reason(r) for r in ("stop", "length", "tool_calls", "cancelled")] == [
        "stop",
        "length",
        "stop",
        "stop",
    ]
    with pytest.raises(ValueError, match="error"):
        done_reason("error")


def test_stats_split_the_answer_at_its_first_token() -> None:
    measured = stats(Usage(7, 3), Timings(100, 250, 1000))
    assert measured == {
        "total_duration": 900,
        "load_duration": 0,
        "prompt_eval_count": 7,
        "prompt_eval_duration": 150,
        "eval_count": 3,
        "eval_duration": 750,
    }
    unseen = stats(Usage(7, 3), Timings(100, None, 1000))
    assert (unseen["total_duration"], unseen["prompt_eval_duration"], unseen["eval_duration"]) == (
        900,
        0,
        0,
    )


def test_tool_calls_carry_arguments_as_an_object() -> None:
    assert tool_call_body(WEATHER_CALL, 2) == {
        "id": "call_1",
        "function": {"index": 2, "name": "get_weather", "arguments": {"city": "Paris"}},
    }


def test_a_streamed_chat() -> None:
    lines = encoder()
    assert lines.opening() == []
    out = [
        *lines.encode(Chunk(RID, "Hel", token_ids=(1,))),
        *lines.encode(Chunk(RID, "", token_ids=())),  # nothing to say
        *lines.encode(Chunk(RID, "lo", token_ids=(2, 3))),
    ]
    assert not lines.finished
    out += lines.encode(Chunk(RID, "!", (4,), finish_reason="stop", usage=Usage(5, 4)))
    assert lines.finished
    assert lines.encode(Chunk(RID, "late", (5,))) == []
    *deltas, done = out
    assert deltas == [
        {
            "model": "m",
            "created_at": timestamp(MOMENT),
            "message": {"role": "assistant", "content": text},
            "done": False,
        }
        for text in ("Hel", "lo", "!")
    ]
    assert done["message"] == {"role": "assistant", "content": ""}
    assert (done["done"], done["done_reason"]) == (True, "stop")
    # Lines were written at START + 100, 200, 300, 400: the first token at the first.
    assert stats(Usage(5, 4), Timings(START_NS, START_NS + 100, START_NS + 400)).items() <= (
        done.items()
    )
    for line in out:
        ChatResponse(**line)


def test_tool_calls_stream_with_running_indexes() -> None:
    lines = encoder()
    first = lines.encode(Chunk(RID, "", (1,), tool_calls=(WEATHER_CALL,)))
    second = lines.encode(
        Chunk(RID, "", (2,), finish_reason="tool_calls", tool_calls=(WEATHER_CALL,))
    )
    [call_line] = first
    [again, done] = second
    assert call_line["message"]["tool_calls"] == [tool_call_body(WEATHER_CALL, 0)]
    assert again["message"]["tool_calls"] == [tool_call_body(WEATHER_CALL, 1)]
    assert done["done_reason"] == "stop"
    parsed = ChatResponse(**call_line)
    [call] = parsed.message.tool_calls or []
    assert (call.function.name, dict(call.function.arguments)) == ("get_weather", {"city": "Paris"})


def test_a_streamed_generation_writes_responses() -> None:
    lines = encoder("generate")
    out = lines.encode(Chunk(RID, "Hi", (1,))) + lines.encode(
        Chunk(RID, ".", (2,), finish_reason="length")
    )
    assert [line["response"] for line in out] == ["Hi", ".", ""]
    assert all("message" not in line for line in out)
    assert out[-1]["done_reason"] == "length"
    # No usage reported: the tokens seen are counted.
    assert (out[-1]["prompt_eval_count"], out[-1]["eval_count"]) == (0, 2)
    for line in out:
        GenerateResponse(**line)


def test_logprobs_only_when_asked() -> None:
    entry = TokenLogprob("Hi", -0.5, (72, 105), top=(TopLogprob("Ho", -1.5, (72, 111)),))
    chunk = Chunk(RID, "Hi", (1,), logprobs=(entry,))
    [plain] = encoder().encode(chunk)
    assert "logprobs" not in plain
    [line] = encoder(logprobs=True).encode(chunk)
    assert line["logprobs"] == [
        {
            "token": "Hi",
            "logprob": -0.5,
            "bytes": [72, 105],
            "top_logprobs": [{"token": "Ho", "logprob": -1.5, "bytes": [72, 111]}],
        }
    ]
    assert ChatResponse(**line).logprobs is not None


def test_an_error_ends_the_stream() -> None:
    lines = encoder()
    assert lines.error(ApiError(500, "runner died")) == [{"error": "runner died"}]
    assert lines.finished


def test_whole_answers() -> None:
    outcome = Outcome("", "tool_calls", Usage(9, 2), tool_calls=(WEATHER_CALL,))
    timings = Timings(0, None, 500)
    body = answer_body("chat", outcome, model="m", created_at=timestamp(MOMENT), timings=timings)
    assert body["message"] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [tool_call_body(WEATHER_CALL, 0)],
    }
    assert (body["done"], body["done_reason"], body["total_duration"]) == (True, "stop", 500)
    assert (body["prompt_eval_count"], body["eval_count"]) == (9, 2)
    ChatResponse(**body)
    generated = answer_body(
        "generate",
        Outcome("Hello", "stop", Usage(1, 1)),
        model="m",
        created_at=timestamp(MOMENT),
        timings=timings,
    )
    assert generated["response"] == "Hello"
    assert "logprobs" not in generated
    GenerateResponse(**generated)


def test_load_answers() -> None:
    chat = load_body("chat", model="m", created_at=timestamp(MOMENT))
    assert chat == {
        "model": "m",
        "created_at": timestamp(MOMENT),
        "message": {"role": "assistant", "content": ""},
        "done": True,
        "done_reason": "load",
    }
    assert load_body("generate", model="m", created_at="t")["response"] == ""


# --- models --------------------------------------------------------------------------------------


def listing(model: ModelRef, *, ready: bool = True) -> ModelListing:
    return ModelListing(model, placed=ready, ready=ready)


DEMO = ModelRef(
    "demo", "demo:tiny", 3_400_000, created=1_700_000_000, layout=ModelLayout(4, 4, 2, 8)
)


def test_tags_describe_the_model() -> None:
    tag = tag_body(listing(DEMO))
    assert (tag["name"], tag["model"], tag["size"]) == ("demo", "demo", 3_400_000)
    parsed = ListResponse(models=[tag]).models[0]
    assert parsed.modified_at == datetime.fromtimestamp(1_700_000_000, UTC)
    assert parsed.details is not None
    assert parsed.details.format == "safetensors"


def test_digests_are_stable_and_tell_sources_apart() -> None:
    other = ModelRef("demo", "demo:small", 1)
    assert digest(listing(DEMO)) == digest(listing(DEMO, ready=False))
    assert digest(listing(DEMO)) != digest(listing(other))
    assert len(digest(listing(DEMO))) == 64


def test_curated_models_state_parameters_and_quantization() -> None:
    entry = curated_models()[0]
    details = tag_body(listing(entry.model_ref()))["details"]
    assert (details["parameter_size"], details["quantization_level"]) == (
        entry.parameters,
        entry.quantization,
    )


def test_running_models() -> None:
    running = running_body(listing(DEMO))
    parsed = ProcessResponse(models=[running]).models[0]
    assert (parsed.name, parsed.size) == ("demo", 3_400_000)
    assert parsed.expires_at is not None
    assert parsed.expires_at > datetime.now(UTC)


def test_show_states_what_trexo_knows() -> None:
    shown = show_body(listing(DEMO, ready=False))
    parsed = ShowResponse(**shown)
    assert parsed.modelinfo is not None
    assert parsed.modelinfo["trexo.n_layers"] == 4
    assert parsed.modelinfo["trexo.ready"] is False
    assert parsed.capabilities == ["completion", "tools"]
    assert json.loads(json.dumps(shown)) == shown
