"""Which load failures are for good (pure)."""

from __future__ import annotations

import json

import pytest

from trexo.runner.compute import load_failed
from trexo.runner.load_failure import is_permanent


@pytest.mark.parametrize(
    "exc",
    [
        FileNotFoundError("model.safetensors"),
        ValueError("Expected shape (64, 128) but received shape (64, 96)"),
        ValueError("Model type frobnicator not supported."),
        json.JSONDecodeError("Expecting value", "", 0),
        TypeError("'NoneType' object is not subscriptable"),
        IndexError("list index out of range"),
        KeyError("model.layers.0.weight"),
        NotImplementedError("no tensor layout"),
    ],
)
def test_what_fails_the_same_way_again_is_permanent(exc: Exception) -> None:
    assert is_permanent(exc)
    status = load_failed(exc)
    assert status.permanent and type(exc).__name__ in status.cause


@pytest.mark.parametrize(
    "exc",
    [
        MemoryError(),
        RuntimeError("[metal::malloc] Attempting to allocate 80 GB"),
        OSError(24, "Too many open files"),
        TimeoutError(),
    ],
)
def test_what_may_pass_is_retried(exc: Exception) -> None:
    assert not is_permanent(exc)
    assert not load_failed(exc).permanent
