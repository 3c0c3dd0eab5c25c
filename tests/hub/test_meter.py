"""A download's rate and time left."""

from __future__ import annotations

import pytest

from trexo.hub.meter import RateMeter


def test_rate_is_the_average_over_the_recent_window() -> None:
    meter = RateMeter(window=5.0)
    assert meter.rate() == 0.0
    assert meter.eta(0, 100) is None  # no rate yet
    for t in range(11):
        meter.record(float(t), t * 10)  # 10 bytes/s
    assert meter.rate() == pytest.approx(10.0)
    assert meter.eta(100, 200) == pytest.approx(10.0)
    meter.record(11.0, 160)  # 60 bytes in the last second; the window forgets 0..5
    assert meter.rate() == pytest.approx((160 - 60) / (11 - 6))
    assert meter.eta(200, 200) == 0.0


def test_a_restart_from_fewer_bytes_starts_the_rate_again() -> None:
    meter = RateMeter(window=5.0)
    meter.record(0.0, 0)
    meter.record(1.0, 100)
    meter.record(2.0, 10)  # a file failed its check and is fetched again
    assert meter.rate() == 0.0
    meter.record(3.0, 30)
    assert meter.rate() == pytest.approx(20.0)
