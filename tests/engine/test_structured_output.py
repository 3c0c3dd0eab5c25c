"""response_format as constrained decoding: the demo model's nonsense comes out as valid JSON.

Generation runs through mlx-lm's `BatchGenerator` with per-request `logits_processors`, the way
`trexo.engine.batch` inserts requests, so the processor is proven in the API trexo uses.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import attrs
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import BatchGenerator, generation_stream
from mlx_lm.sample_utils import greedy_sampler, make_logits_processors

from trexo.engine.batch import request_sampler
from trexo.engine.engine import Engine
from trexo.engine.schema_grammar import closed_objects
from trexo.engine.structured_output import (
    JsonProcessor,
    check_schema,
    format_processor,
    tokenizer_bridge,
)
from trexo.types.generation import SamplingParams

CITY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["city", "n"],
    "additionalProperties": False,
}
MAX_CITY = 16
MAX_N = 99_999
# The demo model rarely closes a string (few of its 2k tokens hold a quote), so an unbounded
# string can outrun any token budget: bounds make every output finish (in ~20 tokens, at worst
# ~100: a character can take several byte tokens).
BOUNDED_SCHEMA: dict[str, Any] = CITY_SCHEMA | {
    "properties": {
        "city": {"type": "string", "maxLength": MAX_CITY},
        "n": {"type": "integer", "minimum": 0, "maximum": MAX_N},
    }
}
BOUNDED_BUDGET = 160
UNBOUNDED_BUDGET = 64
FREE_BUDGET = 24
OBJECT_BUDGET = 256
SEEDS = (None, 0, 1, 2, 3)
"""None: greedy; a seed: temperature 1 with that seed."""
CLOSING_BIAS = 4.0
QUESTION = "Describe a city as JSON."


@attrs.frozen
class Request:
    processors: Sequence[Any] = ()
    seed: int | None = None
    max_tokens: int = BOUNDED_BUDGET


@attrs.frozen
class Output:
    tokens: list[int]
    finish_reason: str
    text: str


def prompt_of(engine: Engine) -> list[int]:
    tokenizer: Any = engine.tokenizer
    encoded: list[int] = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True
    )
    return encoded


def generate(engine: Engine, requests: Sequence[Request]) -> list[Output]:
    """Every request in one `BatchGenerator`, inserted one by one as `BatchEngine.add` does."""
    tokenizer = engine.tokenizer
    eos = sorted(tokenizer.eos_token_ids)
    generator: Any = BatchGenerator(
        engine.model,
        stop_tokens=[[token] for token in eos],
        sampler=greedy_sampler,
        stream=generation_stream,
    )
    prompt = prompt_of(engine)
    uids = []
    for request in requests:
        sampler = None
        if request.seed is not None:
            sampler = request_sampler(SamplingParams(temperature=1.0), request.seed)
        (uid,) = generator.insert(
            [prompt],
            max_tokens=[request.max_tokens],
            samplers=[sampler] if sampler is not None else None,
            logits_processors=[make_logits_processors() + list(request.processors)],
        )
        uids.append(uid)
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    reasons: dict[int, str] = {}
    while len(reasons) < len(uids):
        _, responses = generator.next()
        for response in responses:
            tokens[response.uid].append(response.token)
            if response.finish_reason is not None:
                reasons[response.uid] = response.finish_reason
    return [
        Output(
            tokens[uid],
            reasons[uid],
            tokenizer.decode([t for t in tokens[uid] if t not in tokenizer.eos_token_ids]),
        )
        for uid in uids
    ]


def schema_processor(engine: Engine, schema: dict[str, Any] = BOUNDED_SCHEMA) -> JsonProcessor:
    return format_processor(engine.tokenizer, "json_schema", json.dumps(schema))


def assert_city(text: str) -> None:
    """`text` is JSON that BOUNDED_SCHEMA accepts (checked by hand)."""
    value = json.loads(text)
    assert isinstance(value, dict), text
    assert set(value) == {"city", "n"}, text
    assert isinstance(value["city"], str), text
    assert len(value["city"]) <= MAX_CITY, text
    assert type(value["n"]) is int, text
    assert 0 <= value["n"] <= MAX_N, text


def closing_nudge(engine: Engine) -> Any:
    """A processor favouring tokens with a quote or closing bracket: a model keen to finish."""
    tokenizer = engine.tokenizer
    bias = np.zeros(engine.model.args.vocab_size, dtype=np.float32)
    for token in range(len(tokenizer.vocab)):
        if any(c in tokenizer.decode([token]) for c in '"}]'):
            bias[token] = CLOSING_BIAS
    boost = mx.array(bias)
    return lambda tokens, logits: logits + boost


def allowed_ids(processor: JsonProcessor, context: list[int], width: int) -> list[int]:
    """The ids `processor` leaves finite after seeing `context`."""
    out = processor(mx.array(context, dtype=mx.int32), mx.zeros((1, width)))
    return np.flatnonzero(np.isfinite(np.array(out[0]))).tolist()


def feed(
    processor: JsonProcessor, prompt: list[int], generated: list[int], width: int
) -> list[int]:
    """Call `processor` as mlx-lm does while generating `generated`: the last call's mask."""
    allowed = allowed_ids(processor, prompt, width)
    for k in range(1, len(generated) + 1):
        allowed = allowed_ids(processor, prompt + generated[:k], width)
    return allowed


def encode(engine: Engine, text: str) -> list[int]:
    ids: list[int] = engine.tokenizer.encode(text, add_special_tokens=False)
    return ids


# --- generation ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_schema_output_validates(engine: Engine, seed: int | None) -> None:
    (out,) = generate(engine, [Request([schema_processor(engine)], seed)])
    assert out.finish_reason == "stop"
    assert out.tokens[-1] in engine.tokenizer.eos_token_ids
    assert_city(out.text)


@pytest.mark.parametrize("seed", SEEDS)
def test_json_object_output_is_an_object(engine: Engine, seed: int | None) -> None:
    # The nudge runs before the constraint: it steers the model, it cannot break the JSON.
    processor = format_processor(engine.tokenizer, "json_object", None)
    request = Request([closing_nudge(engine), processor], seed, OBJECT_BUDGET)
    (out,) = generate(engine, [request])
    assert out.finish_reason == "stop", out.text
    assert isinstance(json.loads(out.text), dict), out.text


@pytest.mark.parametrize("seed", [None, 0, 1])
def test_unbounded_schema_output_is_json_or_cut_by_length(engine: Engine, seed: int | None) -> None:
    """The demo model left alone: an output that ends is valid; one that does not, is cut."""
    request = Request([schema_processor(engine, CITY_SCHEMA)], seed, UNBOUNDED_BUDGET)
    (out,) = generate(engine, [request])
    assert out.text.startswith('{"city":"'), out.text
    if out.finish_reason == "stop":
        value = json.loads(out.text)
        assert set(value) == {"city", "n"}, out.text
    else:
        assert out.finish_reason == "length"
        assert len(out.tokens) == UNBOUNDED_BUDGET


def test_processors_are_per_request(engine: Engine) -> None:
    constrained = Request([schema_processor(engine)])
    free = Request(max_tokens=FREE_BUDGET)
    (alone_free,) = generate(engine, [free])
    together = generate(engine, [constrained, free])
    (alone_constrained,) = generate(engine, [Request([schema_processor(engine)])])

    assert_city(together[0].text)
    assert together[0].tokens == alone_constrained.tokens
    assert together[1].tokens == alone_free.tokens
    with pytest.raises(ValueError, match="Expecting value"):
        json.loads(together[1].text)  # the demo model's own nonsense


def test_a_schema_compiled_once_serves_requests_side_by_side(engine: Engine) -> None:
    # The second and third processors are copies of the first's compiled schema: each keeps
    # its own state, however the requests interleave.
    (alone,) = generate(engine, [Request([schema_processor(engine)])])
    together = generate(engine, [Request([schema_processor(engine)]) for _ in range(2)])
    assert [out.tokens for out in together] == [alone.tokens, alone.tokens]
    assert_city(together[1].text)


def test_max_tokens_too_small_just_stops(engine: Engine) -> None:
    (out,) = generate(engine, [Request([schema_processor(engine)], max_tokens=3)])
    assert out.finish_reason == "length"
    assert len(out.tokens) == 3
    assert '{"city":"'.startswith(out.text), out.text


# --- the processor, called directly ----------------------------------------------------------


def test_only_eos_once_the_json_is_complete(engine: Engine) -> None:
    eos = sorted(engine.tokenizer.eos_token_ids)
    width = engine.model.args.vocab_size
    body = encode(engine, '{"city":"Oslo","n":7')
    prompt = prompt_of(engine)
    open_object = feed(schema_processor(engine), prompt, body, width)
    assert not set(eos) & set(open_object)
    assert encode(engine, "}")[0] in open_object
    done = feed(schema_processor(engine), prompt, [*body, *encode(engine, "}")], width)
    assert done == eos


def test_ids_past_the_tokenizer_are_masked(engine: Engine) -> None:
    vocab = len(engine.tokenizer.vocab)
    width = vocab + 64
    first = allowed_ids(schema_processor(engine), prompt_of(engine), width)
    assert first == encode(engine, "{")


def test_trimmed_context_rolls_the_matcher_back(engine: Engine) -> None:
    """mlx-lm's speculative decoding trims rejected tokens: the matcher must forget them."""
    width = engine.model.args.vocab_size
    prompt = prompt_of(engine)
    (brace,) = encode(engine, "{")
    (quote,) = encode(engine, '"')
    (close,) = encode(engine, "}")
    trimmed = format_processor(engine.tokenizer, "json_object", None)
    assert feed(trimmed, prompt, [brace, close], width) == sorted(engine.tokenizer.eos_token_ids)
    after = allowed_ids(trimmed, [*prompt, brace, quote], width)
    fresh = format_processor(engine.tokenizer, "json_object", None)
    assert after == feed(fresh, prompt, [brace, quote], width)
    assert not set(engine.tokenizer.eos_token_ids) & set(after)  # a key is open, not complete


def test_eos_after_completion_is_quiet(engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    """`BatchGenerator` decodes a step ahead: the processor sees the EOS it allowed."""
    eos = sorted(engine.tokenizer.eos_token_ids)
    width = engine.model.args.vocab_size
    processor = format_processor(engine.tokenizer, "json_object", None)
    with caplog.at_level(logging.WARNING):
        assert feed(processor, prompt_of(engine), [*encode(engine, "{}"), eos[0]], width) == eos
    assert not caplog.records


def test_token_outside_the_grammar_ends_with_eos(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    eos = sorted(engine.tokenizer.eos_token_ids)
    width = engine.model.args.vocab_size
    processor = format_processor(engine.tokenizer, "json_object", None)
    with caplog.at_level(logging.WARNING):
        assert feed(processor, prompt_of(engine), encode(engine, "x"), width) == eos
    assert "outside the grammar" in caplog.text


def test_the_tokenizer_bridge_is_built_once(engine: Engine) -> None:
    assert tokenizer_bridge(engine.tokenizer) is tokenizer_bridge(engine.tokenizer)
    assert tokenizer_bridge(engine.tokenizer).vocab_size == len(engine.tokenizer.vocab)


# --- objects closed by default ----------------------------------------------------------------


def test_objects_are_closed_unless_they_say_otherwise() -> None:
    schema = {
        "type": "object",
        "properties": {
            "inner": {"type": "object", "properties": {"a": {"type": "integer"}}},
            "free": {"type": "object", "additionalProperties": True},
            "list": {"type": "array", "items": {"properties": {"b": {"type": "string"}}}},
            "either": {"anyOf": [{"type": "object"}, {"type": "string"}]},
            "negated": {"not": {"type": "object"}},
        },
        "$defs": {"node": {"type": "object", "properties": {}}},
        "allOf": [{"properties": {"x": {"type": "integer"}}}],
    }
    closed: Any = closed_objects(schema)
    props = closed["properties"]
    assert "additionalProperties" not in closed  # its keys are spread over its allOf
    assert "additionalProperties" not in closed["allOf"][0]  # a part closes nothing alone
    assert props["inner"]["additionalProperties"] is False
    assert props["free"]["additionalProperties"] is True  # said so: kept
    assert props["list"]["items"]["additionalProperties"] is False
    assert props["either"]["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in props["either"]["anyOf"][1]
    assert props["negated"]["not"] == {"type": "object"}  # closing it would widen the not
    assert closed["$defs"]["node"]["additionalProperties"] is False
    assert schema["properties"]["inner"] == {  # type: ignore[index]
        "type": "object",
        "properties": {"a": {"type": "integer"}},
    }  # the caller's schema is left as it was


def test_an_object_that_does_not_say_admits_no_other_key(engine: Engine) -> None:
    # JSON Schema leaves it open, and a small model keeps adding keys to its last token:
    # closed, as OpenAI's strict mode and Ollama read it, the object can only end here.
    open_schema = {k: v for k, v in BOUNDED_SCHEMA.items() if k != "additionalProperties"}
    width = engine.model.args.vocab_size
    prefix = encode(engine, '{"city":"Oslo","n":5')
    allowed = feed(schema_processor(engine, open_schema), prompt_of(engine), prefix, width)
    texts = [engine.tokenizer.decode([t]) for t in allowed]
    assert texts and not any("," in text for text in texts), texts
    explicit = open_schema | {"additionalProperties": True}
    allowed = feed(schema_processor(engine, explicit), prompt_of(engine), prefix, width)
    assert any("," in engine.tokenizer.decode([t]) for t in allowed)


# --- errors ----------------------------------------------------------------------------------


def test_check_schema_accepts_a_good_schema() -> None:
    check_schema(json.dumps(CITY_SCHEMA))
    check_schema(json.dumps(BOUNDED_SCHEMA))


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ('{"type": 5}', "type must be a string"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"type": "string", "pattern": "("}', "unsupported JSON schema"),
        ('{"properties": {"a": {"$ref": "#/defs/nowhere"}}}', "does not exist"),
        ('{"not": {"type": "string"}}', "Unimplemented"),
    ],
)
def test_check_schema_rejects_a_broken_schema(schema: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_schema(schema)


def test_format_processor_errors(engine: Engine) -> None:
    with pytest.raises(ValueError, match="unknown response_format type 'yaml'"):
        format_processor(engine.tokenizer, "yaml", None)
    with pytest.raises(ValueError, match="needs a schema"):
        format_processor(engine.tokenizer, "json_schema", None)
    with pytest.raises(ValueError, match="type must be a string"):
        format_processor(engine.tokenizer, "json_schema", '{"type": 5}')
