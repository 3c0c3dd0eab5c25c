"""Test hooks: misbehaviours a runner can be told to show, so tests can exercise the parent.

Set through one environment variable, comma-separated, e.g.
`TREXO_RUNNER_TEST_HOOKS=ignore_shutdown,step_delay=0.05`. Never set in production.
"""

from __future__ import annotations

import os

import attrs

HOOKS_ENV = "TREXO_RUNNER_TEST_HOOKS"


@attrs.frozen
class TestHooks:
    ignore_shutdown: bool = False
    """Ignore `Shutdown`, EOF and SIGTERM: only SIGKILL ends the runner."""
    step_delay: float = 0.0
    """Sleep this long after each decode step (makes generations slow enough to interrupt)."""
    garbage_after_ready: bool = False
    """Send an invalid frame to the parent once the model is ready."""
    load_delay: float = 0.0
    """Sleep this long before loading the model (makes "placed but not ready" observable)."""
    stop_check_delay: float = 0.0
    """Sleep this long each time a generation checks its stop flag (between prefill chunks
    and decode steps): makes a prefill slow enough to interrupt."""


def parse_hooks(text: str) -> TestHooks:
    """Parse the hooks variable; unknown names are an error, not silently ignored."""
    values: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name in ("ignore_shutdown", "garbage_after_ready"):
            values[name] = True
        elif name in ("step_delay", "load_delay", "stop_check_delay"):
            values[name] = float(value)
        else:
            raise ValueError(f"unknown runner test hook {name!r}")
    return TestHooks(**values)  # type: ignore[arg-type]


def hooks_from_env() -> TestHooks:
    return parse_hooks(os.environ.get(HOOKS_ENV, ""))
