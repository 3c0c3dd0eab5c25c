"""The API dialects besides OpenAI Chat Completions: each a blueprint of thin views over the
one generation path (`trexo.api.streaming`), with its own error shape."""

from __future__ import annotations

from collections.abc import Callable

import attrs
from quart import Blueprint

from trexo.api.handle import NodeHandle
from trexo.api.streaming import StreamSettings
from trexo.api.views import ErrorShape
from trexo.config import ApiConfig

BlueprintFactory = Callable[[NodeHandle, ApiConfig, StreamSettings], Blueprint]


@attrs.frozen
class Dialect:
    blueprint: BlueprintFactory
    errors: ErrorShape | None = None
    """How errors under the dialect's paths look; None: OpenAI's shape."""


def dialects() -> list[Dialect]:
    """Every dialect the API serves, registered by `trexo.api.app.create_app`."""
    found: list[Dialect] = []
    from trexo.api.responses_api import RESPONSES  # here: it imports `Dialect` from this module

    found.append(RESPONSES)
    from trexo.api.ollama_api import OLLAMA

    found.append(OLLAMA)
    from trexo.api.anthropic_api import ANTHROPIC

    found.append(ANTHROPIC)
    return found
