"""JSON schemas as llguidance grammars: compile one, or say why it cannot be. Pure; no MLX.

Compiling is the costly part of constrained output, and a schema comes from a client: an
`allOf` of a few regex patterns under 1 KB asks llguidance for seconds to minutes and
gigabytes (each pattern multiplies the lexer's states), and llguidance's own limits (lexer
fuel, states, grammar size) do not bound that step. So nothing here is called with an
unchecked schema on an event loop or a compute thread: `trexo.schema_guard` runs
`check_schema` in a process of its own, bounded in time and memory, first.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final

import llguidance

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

JSON_OPTIONS: Final[JsonCompileOptions] = {"whitespace_flexible": False}
"""llguidance JSON compile options, applied over the schema's own `x-guidance` options."""

LIMITS: Final = llguidance.LLParserLimits(verbose_errors=False)
"""llguidance's default limits, with short error messages (no parser state or grammar dump)."""


_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
"""Keywords whose value maps names to subschemas."""
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
"""Keywords whose value lists alternative (or positional) subschemas, each whole on its own."""
_SUBSCHEMAS = ("items", "additionalItems", "contains", "then", "else")
"""Keywords whose value is one subschema that values must match. Not `not` or `if`: closing
an object there would change what the schema accepts the other way round."""


def closed_objects(schema: object, *, close_here: bool = True) -> object:
    """`schema` with every object that does not say whether it allows other keys closed
    (`additionalProperties: false`), as OpenAI's strict mode and Ollama (llama.cpp's schema
    converter) read schemas. JSON Schema leaves them open, and a small model given an open
    object keeps adding keys until `max_tokens`. An explicit `additionalProperties` (or
    `unevaluatedProperties`) is kept; so are the parts of an `allOf`, which close nothing on
    their own (each holds only some of the object's properties)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    is_object = (
        out.get("type") == "object"
        or (isinstance(out.get("type"), list) and "object" in out["type"])
        or ("properties" in out and "type" not in out)
    )
    open_ended = "additionalProperties" not in out and "unevaluatedProperties" not in out
    # Beside an `allOf`, the object's keys are spread over its parts: closing it here would
    # refuse theirs (`additionalProperties` sees only its sibling `properties`).
    if close_here and is_object and open_ended and "allOf" not in out:
        out["additionalProperties"] = False
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [closed_objects(sub, close_here=False) for sub in out["allOf"]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed_objects(sub) for name, sub in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(sub) for sub in out[key]]
    for key in (*_SUBSCHEMAS, "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = closed_objects(out[key])
    return out


def grammar(schema_json: str) -> str:
    """The llguidance grammar of `schema_json` (its objects closed: `closed_objects`);
    `ValueError` with a user-facing message. (Cheap: the schema is wrapped, not compiled.)"""
    try:
        schema = json.loads(schema_json)
    except ValueError as exc:
        raise ValueError(f"the JSON schema is not valid JSON: {exc}") from exc
    if not isinstance(schema, dict | bool):
        raise ValueError(f"the JSON schema must be a JSON object, not {type(schema).__name__}")
    try:
        closed = json.dumps(closed_objects(schema))
    except RecursionError:
        raise ValueError("the JSON schema is nested too deeply") from None
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(closed, overrides=JSON_OPTIONS)
    except ValueError as exc:
        raise ValueError(f"the JSON schema cannot be used: {exc}") from exc


def check_schema(schema_json: str) -> None:
    """`ValueError` with a user-facing message unless llguidance can compile `schema_json`.

    Needs no tokenizer or model: the grammar is compiled and checked on its own. A schema that
    passes here can still fail against a real vocabulary only by exceeding a resource limit.
    Unbounded in time and memory: see the module's note.
    """
    error = llguidance.LLMatcher.validate_grammar(grammar(schema_json), limits=LIMITS)
    if error:
        raise ValueError(f"unsupported JSON schema: {error}")
