"""Hypothesis strategies for hostile JSON: what a peer, a runner or an HTTP client may send.

Shared by the fuzz suites of the wire (`tests/types`) and of the peer links (`tests/net`);
importable as `hostile_json` because pytest puts `tests/` on the path (its conftest).
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
from hypothesis import example
from hypothesis import strategies as st

from trexo import wire
from trexo.config import MAX_JSON_DEPTH

T = TypeVar("T")

# --- nesting -----------------------------------------------------------------------------

OPENERS = {"[": "]", "{": "}", '{"a":': "}", "[{": "}]", '[{"type":': "}]"}
"""Ways to go one level (or two) deeper, each with what closes it."""


def nest(depth: int, opener: str = "[", inner: str = "", *, closed: bool = True) -> str:
    """`depth` levels of `opener` around `inner`, closed or left open (a truncated message)."""
    return opener * depth + inner + (OPENERS[opener] * depth if closed else "")


deep = st.builds(
    nest,
    depth=st.sampled_from([1_000, 5_000, 100_000]) | st.integers(MAX_JSON_DEPTH + 1, 2_000),
    opener=st.sampled_from(sorted(OPENERS)),
    inner=st.sampled_from(["", "1", '"x"', "[]", "{}", '"]]]"']),
    closed=st.booleans(),
)

# --- numbers, constants, strings ---------------------------------------------------------

huge_numbers = st.one_of(
    st.integers(21, 100_000).map(lambda n: "9" * n),  # past MAX_JSON_INT_DIGITS; 4301+ digits
    st.integers(21, 5_000).map(lambda n: "-" + "1" * n),  # trip Python's int-string limit
    st.sampled_from(["1e999999", "-1e400", "1E+99999", "123456789e999999999999"]),
    st.integers(1, 50_000).map(lambda n: "0." + "0" * n + "1"),  # long, but a fine float
)
constants = st.sampled_from(["NaN", "Infinity", "-Infinity", "nan", "inf", "undefined"])
lone_surrogates = st.integers(0xD800, 0xDFFF).map(lambda cp: f'"\\u{cp:04x}"')

# --- any JSON, wrong types, random bytes ---------------------------------------------------

tricky_text = st.text(
    st.sampled_from('[]{}"\\:,') | st.characters(exclude_categories=["Cs"]), max_size=20
)
"""Strings full of JSON syntax: a depth scan must not count what is inside strings."""
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | tricky_text
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(tricky_text, children, max_size=4)
    ),
    max_leaves=20,
)
"""Valid JSON values, shallow and deep; for any of our types, mostly of the wrong shape."""


def depth_of(value: Any) -> int:
    """Nesting depth as `MAX_JSON_DEPTH` counts it: a scalar is 0, `[]` and `[1]` are 1."""
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    return 0


json_alphabet_text = st.text(st.sampled_from('[]{}",:0123456789.eE+- \\untrfalsu'), max_size=200)
"""Mostly-invalid text made of JSON's own characters."""
documents = values.map(json.dumps)


def in_containers(fragment: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A fragment on its own, inside an array, or as an object's value."""
    return st.one_of(
        fragment,
        fragment.map(lambda f: f"[{f}]"),
        fragment.map(lambda f: f'{{"type": {f}}}'),
        fragment.map(lambda f: f'{{"a": [1, {{"b": {f}}}]}}'),
    )


any_tag = values.map(lambda v: json.dumps({"type": v}))
"""A tag of any JSON type: lists and objects are unhashable."""

hostile_text = st.one_of(
    deep,
    in_containers(huge_numbers | constants | lone_surrogates),
    documents,
    any_tag,
    json_alphabet_text,
    st.text(max_size=100),
).flatmap(lambda doc: st.one_of(st.just(doc), truncations(doc)))
"""Text messages (a websocket text frame holds any str)."""
hostile_bytes = st.one_of(
    hostile_text.map(str.encode),
    st.binary(max_size=300),
    st.binary(max_size=40).map(lambda b: b'{"type": "' + b + b'"}'),  # invalid UTF-8 inside
)
"""Frame bodies and HTTP bodies."""


def truncations(doc: str) -> st.SearchStrategy[str]:
    """`doc` cut short somewhere: a message that broke off."""
    return st.integers(0, max(0, len(doc) - 1)).map(lambda end: doc[:end])


KNOWN_KILLERS = [
    nest(1_000),  # ~2 KB that killed a node: RecursionError out of json.loads
    nest(100_000, '{"a":', closed=False),
    '{"type": ["Hello"]}',  # an unhashable tag: TypeError out of the tag check
    '{"type": "Hello", "x": ' + "9" * 5_000 + "}",  # past Python's int-string limit
]
"""Messages that crashed a decoder once: every fuzz test tries them first."""


def with_known_killers(argument: str, **others: Any) -> Callable[[T], T]:
    """Decorate a `@given` test to try each of `KNOWN_KILLERS` as `argument` too (with
    `others` for its other arguments)."""

    def decorate(test: T) -> T:
        for killer in KNOWN_KILLERS:
            test = example(**{argument: killer}, **others)(test)
        return test

    return decorate


# --- right shape, wrong contents ------------------------------------------------------------


def shaped_like(kind: Any) -> st.SearchStrategy[str]:
    """JSON shaped like a `kind` (an attrs class or a tagged union of them): its tags and its
    field names (maybe some missing, maybe extra ones), holding arbitrary values or, for
    fields of such types, values shaped the same way: past the tag check, deep into the
    converter."""
    return _shaped(kind, NESTED_SHAPES).map(json.dumps)


NESTED_SHAPES = 2
"""How many levels of fields get shaped values rather than arbitrary ones."""


def _shaped(kind: Any, levels: int) -> st.SearchStrategy[Any]:
    if attrs.has(kind):
        return _fields_of(kind, levels, tagged=False)
    if typing.get_origin(kind) in (tuple, list):
        return st.lists(_shaped(typing.get_args(kind)[0], levels), max_size=3)
    members = [m for m in typing.get_args(kind) if attrs.has(m)]
    if not members:
        return values
    tagged = kind in wire._union_tags  # `A | B` is tagged; `A | None` is not
    return st.sampled_from(members).flatmap(lambda m: _fields_of(m, levels, tagged=tagged))


def _fields_of(cls: type, levels: int, *, tagged: bool) -> st.SearchStrategy[dict[str, Any]]:
    attrs.resolve_types(cls)
    fields = {
        f.name: (_shaped(f.type, levels - 1) | values) if levels > 0 else values
        for f in attrs.fields(cls)
    }
    tag = {"type": cls.__name__} if tagged else {}
    return st.builds(
        lambda present, extra: {**tag, **present, **extra},
        st.fixed_dictionaries({}, optional=fields),
        st.dictionaries(tricky_text, values, max_size=1),
    )
