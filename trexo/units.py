"""Sizes as people read them."""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: int) -> str:
    """`n` bytes in binary units with one decimal: `"96.0 MiB"`, `"512 B"`."""
    if abs(n) < 1024:
        return f"{n} B"
    value = float(n)
    for unit in _UNITS[1:]:
        value /= 1024
        if abs(value) < 1024 or unit == _UNITS[-1]:
            break
    return f"{value:.1f} {unit}"
