"""Do a policy's features carry where the object is? A linear probe.

    python -m dit4dit_npu.eval.feature_probe --policy DIR [DIR ...] [--task transfer_cube]
        [--episodes 200] [--seed 0] [--at 0] [--out probe.json]

For each seed the ALOHA scene is reset (the object placed as gym-aloha places it) and, with
``--at`` > 0, the scripted expert runs that many steps first. The policy's observation path gives
what its action head reads (``research.observation_features``): the conditioning VAE latent and
block ``extract_layer``'s output. A ridge regression from each of them (and, as a control, from the
14-d joint state) to the object's x, y is fitted and scored on held-out seeds (5-fold
cross-validation, the ridge strength chosen inside each training fold): R^2 near 1 says the
position is linearly readable, near 0 says it is not. At reset the arms are at their home pose, so
the state says nothing about the object and the control row should be ~0: only the cameras can.

Why a linear probe: the action head is a small transformer over these features; if even a linear
map cannot read the object's position from them, the head has to learn that from its own few
thousand steps, and a backbone objective that helps should make the probe better, not worse.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dit4dit_npu.errors import DiT4DiTError

FOLDS = 5
RIDGE_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)  # x the feature count (standardized features)


class ProbeError(DiT4DiTError, ValueError):
    """Bad probe arguments (one line, no traceback)."""


def _standardize(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mu, sd = train.mean(0), train.std(0)
    sd[sd < 1e-8] = 1.0
    return (train - mu) / sd, (test - mu) / sd


def _ridge_predict(x: np.ndarray, y: np.ndarray, x_test: np.ndarray, lam: float) -> np.ndarray:
    """Ridge in its dual form (n samples << d features): w = X^T (X X^T + lam I)^-1 (y - mean)."""
    ym = y.mean(0)
    k = x @ x.T
    alpha = np.linalg.solve(k + lam * x.shape[1] * np.eye(len(x)), y - ym)
    return x_test @ (x.T @ alpha) + ym


def _folds(n: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    return np.array_split(rng.permutation(n), k)


def probe_r2(x: np.ndarray, y: np.ndarray, seed: int = 0) -> float:
    """Held-out R^2 (mean over y's columns) of a ridge probe, 5-fold, strength chosen per fold."""
    x = x.reshape(len(x), -1).astype(np.float64)
    rng = np.random.default_rng(seed)
    pred = np.zeros_like(y, dtype=np.float64)
    for test in _folds(len(x), FOLDS, rng):
        train = np.setdiff1d(np.arange(len(x)), test)
        xtr, xte = _standardize(x[train], x[test])
        best, best_err = RIDGE_GRID[0], np.inf
        for lam in RIDGE_GRID:  # inner folds choose the strength on the training part only
            err = 0.0
            for inner in _folds(len(train), FOLDS, rng):
                fit = np.setdiff1d(np.arange(len(train)), inner)
                a, b = _standardize(x[train][fit], x[train][inner])
                err += float(((_ridge_predict(a, y[train][fit], b, lam) - y[train][inner]) ** 2).sum())
            if err < best_err:
                best, best_err = lam, err
        pred[test] = _ridge_predict(xtr, y[train], xte, best)
    ss_res = ((pred - y) ** 2).sum(0)
    ss_tot = ((y - y.mean(0)) ** 2).sum(0)
    return float(np.mean(1.0 - ss_res / ss_tot))


def collect(
    task: str, seeds: list[int], at: list[int], size_hw: tuple[int, int]
) -> tuple[list[dict], np.ndarray]:
    """Observations (one per seed and --at step) and the object's x, y at each."""
    from dit4dit_npu.sim.experts import make_expert
    from dit4dit_npu.sim.scene import AlohaScene

    observations, targets = [], []
    with AlohaScene(task, size_hw=size_hw) as scene:
        for seed in seeds:
            obs = scene.reset(seed)
            expert = make_expert(scene) if max(at) > 0 else None
            for step in range(max(at) + 1):
                if step in at:
                    observations.append(obs)
                    targets.append(scene.env_state[:2])
                if step < max(at):
                    obs = scene.step(expert(obs)).obs
    return observations, np.asarray(targets, np.float64)


def policy_rows(policy_dir: str, observations: list[dict], targets: np.ndarray) -> dict[str, Any]:
    from dit4dit_npu.eval.research import observation_features
    from dit4dit_npu.policy import DiT4DiTPolicy

    policy = DiT4DiTPolicy.from_pretrained(policy_dir, device="cpu")
    latents, feats, states = [], [], []
    for obs in observations:
        out = observation_features(policy, obs, seed=0)
        latents.append(out["latent"][0])
        feats.append(out["features"][0])
        states.append(np.asarray(obs["state"], np.float64))
    feats_arr = np.stack(feats)
    return {
        "policy": str(policy_dir),
        "state (control)": probe_r2(np.stack(states), targets),
        "VAE latent": probe_r2(np.stack(latents), targets),
        "features": probe_r2(feats_arr, targets),
        "features, token mean": probe_r2(feats_arr.mean(1), targets),
    }


if __name__ == "__main__":  # python -m dit4dit_npu.eval.feature_probe: the command is eval/cli.py's
    from dit4dit_npu.eval.cli import feature_probe_main

    raise SystemExit(feature_probe_main())
