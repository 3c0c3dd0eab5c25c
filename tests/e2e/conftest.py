"""The one `trexo run` that the dialect tests share: the scripted tool-calling demo model,
with the Ollama listener open too. Started once per session, stopped and reaped after."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from trexo.engine.scripted_model import SCRIPTED_TOOL_NAME

from .shared_node import SharedNode, shared_node

TOOLS_MODEL = "trexo-demo-tools"
QUESTION = "What is the weather in Paris?"
WEATHER_DESCRIPTION = "The current weather in a city"
WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
"""The scripted model's tool (`get_weather`), as each dialect describes a function."""
OPENAI_WEATHER: Any = {
    "type": "function",
    "function": {
        "name": SCRIPTED_TOOL_NAME,
        "description": WEATHER_DESCRIPTION,
        "parameters": WEATHER_PARAMETERS,
    },
}


@pytest.fixture(scope="session")
def tools_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedNode]:
    data_dir = tmp_path_factory.mktemp("tools-node")
    args = ("--demo-size", "tools", "--ollama-port", "0")
    with shared_node(data_dir, TOOLS_MODEL, *args) as node:
        yield node
