"""JSON from outside (peers, runners, HTTP clients), parsed so that no input can fail open.

`loads` returns plain JSON values, or raises `InvalidJson` (a `MalformedMessage`, so a
`WireError`) and nothing else: for invalid JSON, and for valid JSON that is no value of ours:

- nesting deeper than `MAX_JSON_DEPTH`: found by a linear scan *before* parsing (Python's
  parser recurses once per level and raises `RecursionError` near 1000),
- integer literals longer than `MAX_JSON_INT_DIGITS`, numbers that overflow a float
  (`1e999`), and `NaN`/`Infinity` (not JSON, though Python's json writes and reads them),
- bytes that are not UTF-8 (strictly: `json.loads` itself would sniff UTF-16/32, and decode
  encoded surrogates),
- lone surrogates (`"\\ud800"`): no UTF-8 text holds one, and a string with one raises
  `UnicodeEncodeError` wherever it is encoded later (an HMAC, a file name, a log file).
  The API allows them here: its request validation refuses them with a better message.

`excerpt` and `bounded` keep a hostile value from growing an error message or a log line.
"""

from __future__ import annotations

import functools
import json
import math
import re
import reprlib
from typing import Any

from trexo.config import MAX_ERROR_DETAIL_CHARS, MAX_JSON_DEPTH, MAX_JSON_INT_DIGITS
from trexo.errors import MalformedMessage


class InvalidJson(MalformedMessage):
    """The input is not acceptable JSON; `detail` says why (without the "not valid JSON")."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"not valid JSON: {detail}")
        self.detail = detail


def loads(
    data: bytes | str,
    *,
    max_depth: int = MAX_JSON_DEPTH,
    allow_lone_surrogates: bool = False,
) -> Any:
    """The JSON value in `data`, or `InvalidJson`."""
    if isinstance(data, str):
        text = data
        try:
            encoded = data.encode()
        except UnicodeEncodeError:
            if not allow_lone_surrogates:
                raise InvalidJson("contains a lone surrogate") from None
            encoded = data.encode(errors="surrogatepass")
    else:
        encoded = data
        try:
            text = data.decode()
        except UnicodeDecodeError as exc:
            raise InvalidJson(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    check_depth(encoded, max_depth)
    try:
        value = json.loads(
            text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_refuse_constant
        )
    except (ValueError, RecursionError) as exc:  # RecursionError: cannot happen after the scan
        raise InvalidJson(bounded(str(exc))) from None
    if (
        not allow_lone_surrogates
        and _SURROGATE_ESCAPE.search(encoded)
        and _has_lone_surrogate(value)
    ):
        raise InvalidJson("contains a lone surrogate (an unpaired \\ud800-\\udfff escape)")
    return value


# --- nesting depth ---------------------------------------------------------------------------

_NOT_SYNTAX = bytes(sorted(set(range(256)) - set(b'"[]{}')))
_CURLY_TO_SQUARE = bytes.maketrans(b"{}", b"[]")
_QUOTED = re.compile(rb'"[^"]*+"')


def check_depth(data: bytes, limit: int = MAX_JSON_DEPTH) -> None:
    """`InvalidJson` if the arrays and objects of `data` nest deeper than `limit` (or their
    brackets do not match, where telling the two apart would cost more than a linear scan).

    Shallow input that is invalid in other ways passes: the parser then says what is wrong.
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return  # nothing can nest deeper than it has brackets: most messages stop here
    # The brackets outside strings, all made square: escaped backslashes and quotes go
    # first (after them no quote is escaped), then everything but quotes and brackets. Then
    # adjacent quotes (an empty string, or two strings with nothing between them: dropping
    # either leaves every bracket inside or outside as it was), then the quoted runs left.
    # All of it is C-speed bytes work: ~0.2 s for 16 MiB at worst, a few ms for 1 MiB.
    syntax = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    syntax = syntax.translate(_CURLY_TO_SQUARE, _NOT_SYNTAX).replace(b'""', b"")
    brackets = _QUOTED.sub(b"", syntax)
    balanced = _balanced(limit).match(brackets)
    end = balanced.end() if balanced else 0  # it always matches, if only the empty prefix
    if end == len(brackets) or brackets[end] != ord("["):
        # All of it is balanced within `limit`, or the balanced prefix ends at a stray `]`
        # or an unterminated string: the parser fails there, no deeper than `limit`.
        return
    # An open bracket that does not close within `limit` levels: too deep, or never
    # closed; what follows it cannot go deeper than `limit` if it has no more opens.
    if brackets.count(b"[", end) > limit:
        raise InvalidJson(f"arrays and objects nested deeper than {limit} levels (or unclosed)")


@functools.cache
def _balanced(limit: int) -> re.Pattern[bytes]:
    """Balanced `[...]` groups nested at most `limit` deep. Possessive, so matching is linear:
    a group that fails is never tried another way."""
    pattern = b""
    for _ in range(limit):
        pattern = rb"(?:\[" + pattern + rb"\])*+"
    return re.compile(pattern)


# Compiled now, not at the first deep message: the regex compiler recurses once per level,
# and a message may arrive on a deep stack.
_balanced(MAX_JSON_DEPTH)


# --- numbers, constants, surrogates ----------------------------------------------------------


def _parse_int(literal: str) -> int:
    digits = len(literal) - literal.startswith("-")
    if digits > MAX_JSON_INT_DIGITS:
        raise ValueError(f"an integer of {digits} digits (at most {MAX_JSON_INT_DIGITS})")
    return int(literal)


def _parse_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise ValueError(f"number {bounded(literal, 40)} is out of range")
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A surrogate's escape: only then can a parsed string hold one (escaped pairs combine)."""
_SURROGATE = re.compile("[\ud800-\udfff]")


def _has_lone_surrogate(value: Any) -> bool:
    stack = [value]  # a loop, not a recursion: the depth is bounded, the habit is cheap
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


# --- quoting hostile values ------------------------------------------------------------------

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = MAX_ERROR_DETAIL_CHARS // 2
_repr.maxlevel = 3


def excerpt(value: object) -> str:
    """A short repr of `value`, however large or deep it is."""
    return _repr.repr(value)


def bounded(text: str, limit: int = MAX_ERROR_DETAIL_CHARS) -> str:
    """`text`, cut to about `limit` characters."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"
