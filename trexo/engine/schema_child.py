"""The process that compiles one JSON schema for `trexo.schema_guard`: `python -m` this.

Protocol: argv[1] is the address space allowed (bytes), argv[2] the CPU seconds. Once
llguidance is imported and the limits set, it writes `ready` and a newline to stdout; it
then reads the schema (JSON text, UTF-8) from stdin to EOF, compiles it, writes one JSON
line, `{"error": null}` or `{"error": "why"}`, and exits 0. Past the memory limit either
Python raises `MemoryError` (reported as `{"memory": true}`) or llguidance's allocator
aborts the process: either way the guard knows it ran out of memory. Past its CPU seconds
the kernel ends it (`SIGXCPU`); the guard's clock is only a backstop.
"""

from __future__ import annotations

import json
import math
import resource
import sys
from typing import Final

from trexo.engine.schema_grammar import check_schema

READY: Final = b"ready\n"
MEMORY: Final = "memory"
"""The verdict's key when the compile ran out of memory."""


def limit_memory(limit: int) -> bool:
    """Cap this process's memory at `limit` bytes; False where the system cannot (macOS
    refuses or ignores `RLIMIT_AS`: only the guard's clock bounds the compile there)."""
    for name in ("RLIMIT_AS", "RLIMIT_DATA"):
        which = getattr(resource, name, None)
        if which is None:
            continue
        try:
            resource.setrlimit(which, (limit, limit))
        except (ValueError, OSError):
            continue
        return True
    return False


def limit_cpu(seconds: int) -> None:
    """End this process (`SIGXCPU`) once it has used `seconds` of CPU time. Set after the
    imports: only the compile is counted."""
    used = math.ceil(resource.getrusage(resource.RUSAGE_SELF).ru_utime)
    resource.setrlimit(resource.RLIMIT_CPU, (used + seconds, used + seconds + 1))


def main(argv: list[str]) -> int:
    if not limit_memory(int(argv[1])):
        print("schema compiler: this system cannot cap its memory", file=sys.stderr)
    limit_cpu(int(argv[2]))
    sys.stdout.buffer.write(READY)
    sys.stdout.buffer.flush()
    schema = sys.stdin.buffer.read().decode("utf-8", errors="replace")
    try:
        check_schema(schema)
    except MemoryError:
        verdict: dict[str, object] = {MEMORY: True}
    except ValueError as exc:
        verdict = {"error": str(exc)}
    else:
        verdict = {"error": None}
    sys.stdout.buffer.write(json.dumps(verdict).encode() + b"\n")
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
