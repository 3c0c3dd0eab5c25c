"""How a runner process ends, in numbers and in words."""

from __future__ import annotations

import signal

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_PROTOCOL_ERROR = 3
"""The parent sent a frame the runner could not read."""
EXIT_COMPUTE_STUCK = 4
"""The compute thread did not finish within its bound; the runner left with `os._exit`."""

_MEANINGS = {
    EXIT_OK: "clean exit",
    EXIT_USAGE: "bad command line",
    EXIT_PROTOCOL_ERROR: "protocol error",
    EXIT_COMPUTE_STUCK: "compute thread stuck",
}


def describe_exit(returncode: int) -> str:
    """`"SIGKILL"` for a signal death, else `"exit code N (meaning)"`."""
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    meaning = _MEANINGS.get(returncode)
    return f"exit code {returncode}" + (f" ({meaning})" if meaning else "")
