"""Content arrays in request bodies: the typed parts or blocks every dialect has (OpenAI's
`{"type": "text", "text"}`, Responses' `input_text`, Anthropic's blocks). Pure: problems
raise a 400 `ApiError` naming the item."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from trexo.api.errors import ApiError
from trexo.api.validation import (
    invalid_type,
    present,
    require_object,
    required_str,
    valid_text,
)

TypedItem = tuple[str, str, dict[str, Any]]
"""(where it is, its type, its non-null fields)."""


def typed_items(content: Any, where: str, kinds: Collection[str]) -> list[TypedItem]:
    """An array of objects whose `type` is one of `kinds`; a 400 for anything else."""
    if not isinstance(content, list):
        raise invalid_type(where, "a string or an array of content parts", content)
    items = []
    for i, raw in enumerate(content):
        at = f"{where}[{i}]"
        item = present(require_object(raw, at))
        kind = required_str(item, "type", where=f"{at}.type")
        if kind not in kinds:
            raise ApiError(
                400,
                f"Unsupported content type {kind!r} in '{at}': trexo supports "
                f"{', '.join(repr(k) for k in kinds)} here.",
                param=f"{at}.type",
                code="unsupported_value",
            )
        items.append((at, kind, item))
    return items


def item_text(item: Mapping[str, Any], where: str) -> str:
    return valid_text(required_str(item, "text", where=f"{where}.text"), f"{where}.text")


def text_content(
    content: Any, where: str, kinds: Collection[str] = ("text",), separator: str = ""
) -> str:
    """A string, or the texts of an array of text parts of `kinds`, joined by `separator`."""
    if isinstance(content, str):
        return valid_text(content, where)
    return separator.join(item_text(item, at) for at, _, item in typed_items(content, where, kinds))
