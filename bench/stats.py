"""Small statistics helpers shared by the benchmarks."""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).parent / "results"


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """Median, p90, max and min of `samples` (seconds in, milliseconds out)."""
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return {
        "n": len(ordered),
        "median_ms": statistics.median(ordered) * 1e3,
        "p90_ms": p90 * 1e3,
        "max_ms": ordered[-1] * 1e3,
        "min_ms": ordered[0] * 1e3,
    }


def write_results(name: str, results: dict[str, Any]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        **results,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def markdown_table(rows: dict[str, dict[str, float]]) -> str:
    lines = ["| measure | median | p90 | max | n |", "|---|---:|---:|---:|---:|"]
    for name, s in rows.items():
        lines.append(
            f"| {name} | {s['median_ms']:.1f} ms | {s['p90_ms']:.1f} ms"
            f" | {s['max_ms']:.1f} ms | {s['n']} |"
        )
    return "\n".join(lines)


def describe(samples: Sequence[float], unit: str, digits: int = 1) -> dict[str, Any]:
    """Median, min and max of `samples` in their own `unit` (rates, ratios, differences).

    `digits` is how many decimals `markdown_value_table` shows.
    """
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "unit": unit,
        "digits": digits,
        "median": statistics.median(ordered),
        "min": ordered[0],
        "max": ordered[-1],
    }


def markdown_value_table(rows: dict[str, dict[str, Any]]) -> str:
    """A table of `describe` rows: the unit follows each value."""
    lines = ["| measure | median | min | max | n |", "|---|---:|---:|---:|---:|"]
    for name, s in rows.items():
        unit = f" {s['unit']}" if s["unit"] else ""
        cells = [f"{s[key]:.{s['digits']}f}{unit}" for key in ("median", "min", "max")]
        lines.append(f"| {name} | {' | '.join(cells)} | {s['n']} |")
    return "\n".join(lines)
