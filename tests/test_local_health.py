"""A node's own local health: its stalls are not its peers' silence, and stretch its
timeouts while they last (Lifeguard's local health multiplier)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trexo.local_health import LocalHealth, load_stretch


def test_scheduling_jitter_is_not_a_stall() -> None:
    health = LocalHealth(threshold=0.1)
    health.observe(10.0, 0.05)
    assert health.multiplier(10.0) == 1.0 and health.stalled_since(0.0) == 0.0


def test_a_stall_stretches_timeouts_until_the_node_recovers() -> None:
    health = LocalHealth(threshold=0.1, max_score=8, recovery=2.0)
    health.observe(10.0, 1.2)  # a 1.2 s pause, seen as it ends
    assert health.multiplier(10.0) == 2.0
    health.observe(13.0, 0.5)
    assert health.multiplier(13.0) == 2.0  # one point recovered, one more stall
    assert health.multiplier(14.9) == 2.0
    assert health.multiplier(15.0) == 1.0  # 2 s without a stall
    assert health.multiplier(60.0) == 1.0


def test_the_score_is_capped() -> None:
    health = LocalHealth(threshold=0.1, max_score=3)
    for k in range(10):
        health.observe(float(k), 0.5)
    assert health.multiplier(9.0) == 4.0


def test_one_stall_seen_by_several_timers_counts_once() -> None:
    health = LocalHealth(threshold=0.1)
    health.observe(10.0, 1.0)  # a heartbeat due at 9.0
    health.observe(10.01, 0.81)  # another due at 9.2, run just after
    assert health.multiplier(10.01) == 2.0
    assert health.stalled_since(8.0) == pytest.approx(1.01)


def test_only_the_stall_after_a_moment_is_discounted_from_a_silence_since_then() -> None:
    health = LocalHealth(threshold=0.1)
    health.observe(10.0, 1.0)  # stalled over [9, 10]
    assert health.stalled_since(8.0) == pytest.approx(1.0)
    assert health.stalled_since(9.5) == pytest.approx(0.5)
    assert health.stalled_since(10.0) == 0.0


@given(st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.0, 3.0)), max_size=30))
def test_the_stalled_time_never_exceeds_the_time_elapsed(stalls: list[tuple[float, float]]) -> None:
    health = LocalHealth(threshold=0.1)
    now = 0.0
    for gap, lateness in stalls:
        now += gap + lateness
        health.observe(now, lateness)
    for since in (0.0, now / 2, now):
        assert 0.0 <= health.stalled_since(since) <= max(0.0, now - since) + 1e-9
    assert 1.0 <= health.multiplier(now) <= 1.0 + health.max_score


def test_a_busy_machine_stretches_bounds_in_proportion_to_its_load() -> None:
    assert load_stretch(0.5, 2) == 1.0  # idle cores: no stretch
    assert load_stretch(2.0, 2) == 1.0
    assert load_stretch(10.0, 2) == 5.0
    assert load_stretch(3.0, 0) == 3.0  # no core count known: one
