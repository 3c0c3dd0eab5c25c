"""Lab tests need network namespaces: they skip, saying why, where none can be made."""

from __future__ import annotations

import pytest

from .netns import available


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    lab_items = [item for item in items if "tests/lab/" in str(item.fspath)]
    if not lab_items:
        return
    why = available()
    if why is not None:
        for item in lab_items:
            item.add_marker(pytest.mark.skip(reason=f"no lab of hosts here: {why}"))
