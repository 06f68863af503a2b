"""Success-rate statistics: the Wilson score interval and the one-line summary the eval prints."""

from __future__ import annotations

import math

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; unlike the normal (Wald) interval it stays
    inside [0, 1] and is not degenerate at 0/N or N/N - the usual outcomes of small robot evals."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in 0..{n}, got {successes}")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # Exact at the edges (the formula gives 0 and 1 there up to rounding).
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def format_rate(successes: int, n: int) -> str:
    """'k/N = p% (95% Wilson CI lo–hi%)'."""
    lo, hi = wilson_interval(successes, n)
    p = 100 * successes / n if n else 0.0
    return f"{successes}/{n} = {p:.1f}% (95% Wilson CI {100 * lo:.1f}–{100 * hi:.1f}%)"
