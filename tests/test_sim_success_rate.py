"""Wilson score interval: known values, edges, and the summary line format."""

from __future__ import annotations

import pytest

from dit4dit_npu.sim.success_rate import format_rate, wilson_interval


@pytest.mark.parametrize(
    ("k", "n", "lo", "hi"),
    [
        # Wilson (1927) score interval, z = 1.95996; equal to scipy.stats.binomtest(k, n).proportion_ci("wilson")
        (5, 10, 0.236593, 0.763407),
        (0, 3, 0.0, 0.561497),
        (47, 50, 0.837829, 0.979385),
        (100, 100, 0.963007, 1.0),
        (1, 50, 0.003539, 0.104954),
    ],
)
def test_known_values(k: int, n: int, lo: float, hi: float) -> None:
    got = wilson_interval(k, n)
    assert got == pytest.approx((lo, hi), abs=1e-6)


def test_agrees_with_scipy() -> None:
    st = pytest.importorskip("scipy.stats")
    for k, n in [(0, 1), (3, 7), (13, 20), (50, 50), (0, 100)]:
        ci = st.binomtest(k, n).proportion_ci(method="wilson")
        assert wilson_interval(k, n) == pytest.approx((ci.low, ci.high), abs=1e-9)


def test_interval_stays_in_unit_range_and_contains_p() -> None:
    for n in (1, 2, 10, 37):
        for k in range(n + 1):
            lo, hi = wilson_interval(k, n)
            assert 0.0 <= lo <= k / n <= hi <= 1.0


def test_bad_counts() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(4, 3)


def test_format() -> None:
    assert format_rate(47, 50) == "47/50 = 94.0% (95% Wilson CI 83.8–97.9%)"
    assert format_rate(0, 3) == "0/3 = 0.0% (95% Wilson CI 0.0–56.1%)"
