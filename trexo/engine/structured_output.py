"""Constrained decoding for OpenAI's `response_format`, built on llguidance.

`format_processor` returns an mlx-lm logits processor that lets one request generate only
tokens its JSON grammar allows: `"json_object"` (any one JSON object) or `"json_schema"` (a
value the schema accepts). Once the JSON is complete the processor allows only the
tokenizer's EOS ids, so generation stops right there. `check_schema` validates a schema
without a model or tokenizer (`trexo.engine.schema_grammar`; a client's schema is checked
first in a bounded process, `trexo.schema_guard`).

What mlx-lm passes a processor: `processor(tokens, logits)` once per decoded token, where
`tokens` is the request's context so far (the prompt tokens mlx-lm knows of, then every
generated token up to and including the one just fed to the model) and `logits` the
`(1, vocab)` scores for the next token. The first call's context is the prompt alone; each
later call (in `BatchGenerator`) has one more generated token. The processor remembers the
first call's length as the prompt and feeds the matcher the tokens generated since, rolling
back tokens a caller trimmed away (mlx-lm's speculative decoding does), so it works with
`BatchGenerator`, `generate_step` and `speculative_generate_step` alike. A processor serves
one request, once.

The JSON is compact (no whitespace between tokens of the syntax): flexible whitespace lets a
weak model pad forever with spaces and newlines, a known failure of constrained decoding.

The llguidance tokenizer bridge costs ~20 ms for a 2k vocabulary (~1 s for 150k, by
llguidance's account) and is built once per tokenizer, then shared. A compiled schema is kept
too (a few per tokenizer) and copied for each request: clients send the same schema with
every request, and the compute thread compiles it once.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from typing import Any, Final, cast

import llguidance
import mlx.core as mx
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from trexo.config import SCHEMA_MATCHERS_CACHED
from trexo.engine.schema_grammar import LIMITS, check_schema, grammar

__all__ = ["KINDS", "JsonProcessor", "check_schema", "format_processor", "tokenizer_bridge"]

log = logging.getLogger(__name__)

KINDS: Final = ("json_object", "json_schema")
"""The `response_format` types that constrain output (`"text"` does not)."""

ANY_OBJECT_SCHEMA: Final = '{"type": "object", "additionalProperties": true}'
"""`json_object`: one JSON object, whatever it holds (said open: objects a schema leaves
unsaid are closed, `trexo.engine.schema_grammar.closed_objects`)."""

_bridges: weakref.WeakKeyDictionary[Any, llguidance.LLTokenizer] = weakref.WeakKeyDictionary()
_matchers: weakref.WeakKeyDictionary[Any, OrderedDict[str, llguidance.LLMatcher]] = (
    weakref.WeakKeyDictionary()
)
"""Per tokenizer: compiled grammars, never stepped, copied for each request (recent last)."""
_bridges_lock = threading.Lock()


def _eos_ids(tokenizer: Any) -> list[int]:
    ids = sorted(int(i) for i in (getattr(tokenizer, "eos_token_ids", None) or ()))
    if not ids:
        raise ValueError("the tokenizer has no EOS token: constrained output could never end")
    return ids


def tokenizer_bridge(tokenizer: Any) -> llguidance.LLTokenizer:
    """llguidance's view of `tokenizer` (mlx-lm's `TokenizerWrapper`), built once and shared.

    Building it costs ~20 ms for a 2k vocabulary and about a second for a large one; it lives
    as long as `tokenizer` does.
    """
    with _bridges_lock:
        bridge = _bridges.get(tokenizer)
        if bridge is None:
            eos = _eos_ids(tokenizer)
            hf_tokenizer = getattr(tokenizer, "_tokenizer", tokenizer)
            try:
                # Imported here: it imports transformers (seconds on a busy machine), which
                # a runner must not pay before joining its group.
                import llguidance.hf

                bridge = llguidance.hf.from_tokenizer(hf_tokenizer, eos_token=eos)
            except Exception as exc:  # a slow tokenizer, or one the Rust side cannot read
                raise ValueError(f"llguidance cannot use this tokenizer: {exc}") from exc
            _bridges[tokenizer] = bridge
        return bridge


class JsonProcessor:
    """An mlx-lm logits processor holding one request's output to a JSON grammar."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab: int, eos_ids: list[int]) -> None:
        self._matcher = matcher
        self._vocab = vocab
        self._eos = np.array(eos_ids, dtype=np.int64)
        self._eos_set = frozenset(eos_ids)
        self._bitmask = allocate_token_bitmask(1, vocab)
        self._prompt: int | None = None
        self._consumed: list[int] = []
        self._ended = False

    @property
    def matcher(self) -> llguidance.LLMatcher:
        """The llguidance matcher, fed every generated token so far."""
        return self._matcher

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        self._advance(tokens)
        allowed = self._allowed(logits.shape[-1])
        return mx.where(mx.array(allowed), logits, -mx.inf)

    def _advance(self, tokens: mx.array) -> None:
        """Feed the matcher the tokens generated since the last call."""
        if self._prompt is None:
            self._prompt = tokens.size
            return
        if self._ended:
            return
        kept, fresh = self._news(tokens.reshape(-1), self._prompt)
        consumed = self._consumed
        if kept < len(consumed):  # the caller trimmed tokens away: forget them too
            self._matcher.rollback(len(consumed) - kept)
            del consumed[kept:]
        for token in fresh:
            # mlx-lm steps once more after sampling EOS (it decodes a step ahead).
            if token in self._eos_set and self._matcher.is_accepting():
                self._ended = True
                return
            if not self._matcher.consume_token(token):
                self._end(f"token {token} is outside the grammar")
                return
            consumed.append(token)

    def _news(self, tokens: mx.array, prompt: int) -> tuple[int, list[int]]:
        """How many consumed tokens `tokens` still holds, and the generated tokens after them.

        A longer context is the last one plus new tokens (mlx-lm appends): reading its tail
        keeps a step O(1). A context no longer than the consumed tokens was trimmed, and is
        compared in full.
        """
        consumed = self._consumed
        if tokens.size - prompt > len(consumed):
            if not consumed:
                return 0, cast(list[int], tokens[prompt:].tolist())
            tail = cast(list[int], tokens[prompt + len(consumed) - 1 :].tolist())
            if tail[0] == consumed[-1]:
                return len(consumed), tail[1:]
        generated = cast(list[int], tokens[prompt:].tolist())
        kept = 0
        for old, new in zip(consumed, generated, strict=False):
            if old != new:
                break
            kept += 1
        return kept, generated[kept:]

    def _end(self, why: str) -> None:
        self._ended = True
        log.warning("constrained output cut short: %s: %s", why, self._matcher.get_error())

    def _allowed(self, width: int) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """Which of the logits' `width` token ids may come next."""
        allowed = np.zeros(width, dtype=np.bool_)
        eos = self._eos[self._eos < width]
        matcher = self._matcher
        if not self._ended and not matcher.is_stopped():
            fill_next_token_bitmask(matcher, self._bitmask)
            if matcher.is_error():
                self._end("no mask")
            else:
                n = min(width, self._vocab)
                words = self._bitmask.astype("<i4", copy=False)  # bit k of word w: id 32w + k
                bits = np.unpackbits(words.view(np.uint8), count=n, bitorder="little")
                allowed[:n] = bits.view(np.bool_)
                if matcher.is_accepting():
                    allowed[eos] = True
                if allowed.any():
                    return allowed
        # Complete, stopped, or broken: only EOS, which ends the generation.
        allowed[:] = False
        allowed[eos] = True
        return allowed


def format_processor(tokenizer: Any, kind: str, schema_json: str | None) -> JsonProcessor:
    """A fresh logits processor for one request whose `response_format` is `kind`.

    `tokenizer` is mlx-lm's `TokenizerWrapper`; `kind` is `"json_object"` or `"json_schema"`,
    and `schema_json` the schema's JSON text for `"json_schema"` (ignored for
    `"json_object"`). `ValueError` for an unknown kind, a missing or unusable schema, or a
    tokenizer llguidance cannot read.
    """
    if kind == "json_object":
        schema_json = ANY_OBJECT_SCHEMA
    elif kind == "json_schema":
        if schema_json is None:
            raise ValueError("response_format json_schema needs a schema")
    else:
        raise ValueError(f"unknown response_format type {kind!r}: expected one of {KINDS}")
    bridge = tokenizer_bridge(tokenizer)
    return JsonProcessor(
        _matcher(tokenizer, bridge, schema_json), bridge.vocab_size, _eos_ids(tokenizer)
    )


def _matcher(
    tokenizer: Any, bridge: llguidance.LLTokenizer, schema_json: str
) -> llguidance.LLMatcher:
    """A fresh matcher of `schema_json`: a copy of the one compiled before, if it was."""
    with _bridges_lock:
        compiled = _matchers.setdefault(tokenizer, OrderedDict())
        pristine = compiled.get(schema_json)
        if pristine is not None:
            compiled.move_to_end(schema_json)
            return pristine.deep_copy()
    pristine = llguidance.LLMatcher(bridge, grammar(schema_json), log_level=0, limits=LIMITS)
    if pristine.is_error():
        raise ValueError(f"unsupported JSON schema: {pristine.get_error()}")
    with _bridges_lock:
        compiled[schema_json] = pristine
        while len(compiled) > SCHEMA_MATCHERS_CACHED:
            compiled.popitem(last=False)
    return pristine.deep_copy()
