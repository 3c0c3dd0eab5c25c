"""Waits bounded by silence: the pure rule (real processes: `test_progress_processes.py`)."""

from __future__ import annotations

from trexo.progress import (
    Effort,
    SilenceWatch,
)


def test_progress_restarts_the_silence_and_idle_ticks_do_not() -> None:
    watch = SilenceWatch(10.0, started_at=0.0, min_cpu_s=0.1, min_read_bytes=1000)
    watch.observe(0.0, Effort(1.0, 0))  # the first sample is the baseline
    watch.observe(8.0, Effort(1.05, 500))  # an idle process's ticks: below both thresholds
    assert not watch.expired(9.9)
    assert watch.expired(10.0)
    watch.observe(10.5, Effort(1.05, 1500))  # it read: progress
    assert watch.progressed_at == 10.5
    assert not watch.expired(20.0)
    watch.observe(20.1, Effort(1.2, 1500))  # it computed: progress
    assert not watch.expired(30.0)
    assert watch.expired(30.1)


def test_an_unreadable_process_is_no_progress() -> None:
    watch = SilenceWatch(1.0, started_at=0.0)
    watch.observe(0.5, None)
    watch.observe(0.9, None)
    assert watch.expired(1.0)
