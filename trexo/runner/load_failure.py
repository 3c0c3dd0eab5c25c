"""Whether a model's load failed for good or may pass when tried again. A pure function.

A runner whose load fails is restarted with backoff: memory may free up, a descriptor may
come back, a rank's peer may return. But most load failures are the model's own: a layout
that cannot be split as asked, a file missing from its directory, a weight whose shape does
not match its config, a config this mlx-lm cannot read. Those fail the same way every time,
so the runner reports them as permanent and is not restarted: its instance says why, and the
API answers with the cause instead of "retry shortly" forever.
"""

from __future__ import annotations

PERMANENT_LOAD_ERRORS: tuple[type[BaseException], ...] = (
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
    ValueError,  # shape mismatches, missing parameters, unsupported model types, bad JSON
    KeyError,
    IndexError,
    TypeError,
    AttributeError,
    NotImplementedError,
)
"""Deterministic for a given model directory and layout: loading again fails again."""


def is_permanent(exc: BaseException) -> bool:
    """Whether loading again would fail the same way. Memory (`MemoryError`, MLX's
    allocation `RuntimeError`), other OS errors (out of descriptors) and a rank group's
    failure may pass, and are not."""
    return isinstance(exc, PERMANENT_LOAD_ERRORS)
