"""What a request tells a thinking model's chat template: whether to think, how hard, and a
client's own template variables. Pure: no I/O; problems raise a 400 `ApiError`.

Every dialect's switches become template variables (`GenerationRequest.template_kwargs`),
under the names the templates of thinking models read: `enable_thinking` (Qwen3, DeepSeek
V3.1, GLM; mlx-lm renames it for templates that call it `thinking`) and `reasoning_effort`
(gpt-oss). A template that reads neither ignores them, and a model that thinks whatever it
is told still has its reasoning returned apart from its answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from trexo.api.validation import invalid_value, require_object, valid_text
from trexo.types.generation import MAX_TEMPLATE_KWARGS_CHARS, template_kwargs_problem

ENABLE_THINKING: Final = "enable_thinking"
REASONING_EFFORT: Final = "reasoning_effort"
REASONING_EFFORTS: Final = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
"""OpenAI's `reasoning_effort` values; "none" turns thinking off."""


def thinking(enabled: bool | None) -> dict[str, Any]:
    """The variables that turn thinking on or off (None: the template's default)."""
    return {} if enabled is None else {ENABLE_THINKING: enabled}


def effort(
    value: str | None, where: str, allowed: tuple[str, ...] = REASONING_EFFORTS
) -> dict[str, Any]:
    """The variables for a reasoning effort: "none" turns thinking off, any other is the
    template's `reasoning_effort`; `where` names the field in a 400."""
    if value is None:
        return {}
    if value not in allowed:
        raise invalid_value(where, f"expected one of {', '.join(allowed)}, but got {value!r}")
    return thinking(False) if value == "none" else {REASONING_EFFORT: value}


def client_kwargs(raw: Any, where: str = "chat_template_kwargs") -> dict[str, Any]:
    """A client's own template variables (vLLM's `chat_template_kwargs`): an object."""
    return {} if raw is None else dict(require_object(raw, where))


def template_kwargs_text(kwargs: Mapping[str, Any], where: str) -> str | None:
    """The template variables as a request carries them (None: none), or a 400 naming
    `where` if a name is reserved, a switch has the wrong type, or they are too long."""
    if not kwargs:
        return None
    if problem := template_kwargs_problem(kwargs):
        raise invalid_value(where, problem)
    text = valid_text(json.dumps(dict(kwargs), ensure_ascii=False, separators=(",", ":")), where)
    if len(text) > MAX_TEMPLATE_KWARGS_CHARS:
        raise invalid_value(
            where, f"expected at most {MAX_TEMPLATE_KWARGS_CHARS} characters of JSON"
        )
    return text
