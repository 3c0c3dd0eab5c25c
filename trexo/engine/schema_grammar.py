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


def grammar(schema_json: str) -> str:
    """The llguidance grammar of `schema_json`; `ValueError` with a user-facing message.
    (Cheap: the schema is wrapped, not compiled.)"""
    try:
        schema = json.loads(schema_json)
    except ValueError as exc:
        raise ValueError(f"the JSON schema is not valid JSON: {exc}") from exc
    if not isinstance(schema, dict | bool):
        raise ValueError(f"the JSON schema must be a JSON object, not {type(schema).__name__}")
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema_json, overrides=JSON_OPTIONS)
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
