"""How a runner process ends, in numbers and in words."""

from __future__ import annotations

import signal

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_PROTOCOL_ERROR = 3
"""The parent sent a frame the runner could not read."""
EXIT_COMPUTE_STUCK = 4
"""The compute thread did not finish within its bound; the runner left with `os._exit`."""
EXIT_GROUP_BROKEN = 5
"""A collective of this rank's group failed (a peer rank died or left): the group is over."""
EXIT_GROUP_STALLED = 6
"""A collective waited longer than the stall timeout (a peer rank frozen or cut off); the
runner's watchdog left with `os._exit`."""
EXIT_RANK_FAILED = 7
"""This rank could not join its group or load its part of the model, and left the group."""

_MEANINGS = {
    EXIT_OK: "clean exit",
    EXIT_USAGE: "bad command line",
    EXIT_PROTOCOL_ERROR: "protocol error",
    EXIT_COMPUTE_STUCK: "compute thread stuck",
    EXIT_GROUP_BROKEN: "group broken: a peer rank left",
    EXIT_GROUP_STALLED: "group stalled: a peer rank stopped responding",
    EXIT_RANK_FAILED: "rank failed: could not join its group or load its part",
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
