"""The linear probe's scoring (dit4dit_npu.eval.feature_probe), on data whose answer is known; its
run on a trained policy is in tests/test_sim_training.py."""

from __future__ import annotations

import numpy as np
import pytest

from dit4dit_npu.eval.cli import feature_probe_args as parse_args
from dit4dit_npu.eval.feature_probe import ProbeError, probe_r2


def test_a_linearly_readable_target_scores_near_one_and_noise_near_zero() -> None:
    """Features that encode a 2-d position through a random linear map, in more dimensions than
    there are samples and with noise (as a policy's features would), give it back."""
    rng = np.random.default_rng(0)
    y = rng.uniform(-1, 1, (120, 2))
    x = y @ rng.normal(size=(2, 300)) + rng.normal(0, 1.0, (120, 300))
    assert probe_r2(x, y) > 0.8
    assert probe_r2(x, rng.normal(size=(120, 2))) < 0.1


def test_held_out_folds_decide_the_score_not_the_fit() -> None:
    """Memorising noise (d >> n fits the training folds exactly) must not count."""
    rng = np.random.default_rng(1)
    assert probe_r2(rng.normal(size=(40, 5000)), rng.normal(size=(40, 2))) < 0.1


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--policy", "p", "--episodes", "4"], "--episodes: got 4, expected >= 10"),
        (["--policy", "p", "--at", "-1"], "--at: got [-1], expected step counts >= 0"),
    ],
)
def test_bad_arguments_are_one_line(argv: list[str], expected: str) -> None:
    with pytest.raises(ProbeError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        parse_args(argv)
