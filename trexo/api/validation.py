"""Reading fields of a decoded JSON body, and the 400 errors OpenAI's API words for them.

Readers take a mapping whose `null` values have been dropped (OpenAI treats `null` as
absent) and return None for an absent field. JSON types are exact: `true` is not `1`, and
`2.0` is not an integer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeGuard

from trexo.api.errors import ApiError


def present(body: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of `body` that are not null."""
    return {key: value for key, value in body.items() if value is not None}


def required(fields: Mapping[str, Any], name: str, *, where: str | None = None) -> Any:
    if fields.get(name) is None:
        raise missing(where or name)
    return fields[name]


def required_str(fields: Mapping[str, Any], name: str, *, where: str | None = None) -> str:
    value = read_str(fields, name, where=where)
    if value is None:
        raise missing(where or name)
    return value


def read_str(fields: Mapping[str, Any], name: str, *, where: str | None = None) -> str | None:
    value = fields.get(name)
    if value is None or isinstance(value, str):
        return value
    raise invalid_type(where or name, "a string", value)


def read_bool(fields: Mapping[str, Any], name: str, *, where: str | None = None) -> bool | None:
    value = fields.get(name)
    if value is None or isinstance(value, bool):
        return value
    raise invalid_type(where or name, "a boolean", value)


def read_int(
    fields: Mapping[str, Any], name: str, *, low: int, high: int | None = None
) -> int | None:
    value = fields.get(name)
    if value is None:
        return None
    if not is_int(value):
        raise invalid_type(name, "an integer", value)
    if value < low:
        raise invalid_value(name, f"expected a value >= {low}, but got {value} instead")
    if high is not None and value > high:
        raise invalid_value(name, f"expected a value <= {high}, but got {value} instead")
    return value


def read_number(
    fields: Mapping[str, Any],
    name: str,
    *,
    low: float,
    high: float | None = None,
    low_open: bool = False,
) -> float | None:
    """A finite number in `[low, high]` (`(low, high]` with `low_open`); ints are accepted."""
    value = fields.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid_type(name, "a number", value)
    if not math.isfinite(value):
        raise invalid_value(name, f"expected a finite number, but got {value} instead")
    if value < low or (low_open and value == low):
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        raise invalid_value(name, f"expected a value {bound}, but got {value} instead")
    if high is not None and value > high:
        raise invalid_value(name, f"expected a value <= {high:g}, but got {value} instead")
    return float(value)


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def same_json(value: object, other: object) -> bool:
    """JSON equality: unlike Python's, `true` is not `1`."""
    return type(value) is type(other) and value == other


def json_type(value: Any) -> str:
    """How OpenAI's errors name a value's JSON type."""
    match value:
        case None:
            return "null"
        case bool():
            return "a boolean"
        case int():
            return "an integer"
        case float():
            return "a decimal number"
        case str():
            return "a string"
        case list():
            return "an array"
        case dict():
            return "an object"
        case _:
            return type(value).__name__


def require_object(value: Any, param: str | None = None) -> dict[str, Any]:
    """`value` if it is a JSON object; `param` names it in the error (None: the body)."""
    if isinstance(value, dict):
        return value
    if param is not None:
        raise invalid_type(param, "an object", value)
    raise ApiError(
        400,
        f"The request body must be a JSON object, but got {json_type(value)}.",
        code="invalid_type",
    )


# --- errors ------------------------------------------------------------------------------------


def missing(param: str) -> ApiError:
    return ApiError(
        400,
        f"Missing required parameter: '{param}'.",
        param=param,
        code="missing_required_parameter",
    )


def invalid_type(param: str, expected: str, got: Any) -> ApiError:
    return ApiError(
        400,
        f"Invalid type for '{param}': expected {expected}, but got {json_type(got)} instead.",
        param=param,
        code="invalid_type",
    )


def invalid_value(param: str, why: str) -> ApiError:
    return ApiError(400, f"Invalid '{param}': {why}.", param=param, code="invalid_value")


def unsupported(param: str, hint: str | None = None) -> ApiError:
    message = f"Unsupported parameter: '{param}' is not supported by trexo."
    if hint:
        message += f" Hint: {hint}."
    return ApiError(400, message, param=param, code="unsupported_parameter")


def unknown(param: str) -> ApiError:
    return ApiError(
        400,
        f"Unrecognized request argument supplied: {param}",
        param=param,
        code="unknown_parameter",
    )


def valid_text(value: str, where: str) -> str:
    """`value`, unless it holds a lone surrogate (valid JSON, but not Unicode text)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = value[exc.start]
        raise invalid_value(
            where,
            f"the text holds a lone surrogate (U+{ord(bad):04X}) at position {exc.start}; "
            "text must be valid Unicode",
        ) from None
    return value
