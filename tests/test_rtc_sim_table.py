"""bench/rtc_sim.py's table and plot for cells whose episodes lack a kind of step: with an
execution horizon of 3 (``--replan 3``) every step lies within 3 of a chunk boundary, so
``interior_jerk`` is None (sim/execution.py's boundary_jerk); the sweep used to crash on it after
every cell had run, and again on a rerun from the cached cells."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.rtc_sim import plot, table, with_rewards
from dit4dit_npu.sim.execution import boundary_jerk


def summary(boundary: float | None, interior: float | None) -> dict:
    return {"successes": 1, "episodes": 2, "success_rate": 0.5, "wilson95": [0.09, 0.91],
            "boundary_jerk": boundary, "interior_jerk": interior, "wall_s": 12.0}


def test_an_execution_horizon_of_3_leaves_no_interior_step() -> None:
    actions = np.cumsum(np.random.default_rng(0).normal(size=(30, 14)), axis=0)
    jerk = boundary_jerk(actions, list(range(0, 30, 3)))
    assert jerk["interior_jerk"] is None and jerk["boundary_jerk"] is not None


def test_table_and_plot_write_cells_without_interior_or_boundary_steps(tmp_path: Path) -> None:
    cell = {"label": "tiny", "policy": "p", "delay_ms": 100.0, "delay_steps": 5}
    cells = [
        {**cell, "mode": "sync", "summary": summary(1234.5, 56.7)},
        {**cell, "mode": "async", "summary": summary(2000.0, None)},  # --replan 3
        {**cell, "mode": "ensemble", "summary": summary(None, None)},  # no boundary past step 3
        {**cell, "mode": "rtc", "skip": "n/a: the robot would starve"},
    ]
    rows = table(cells).splitlines()
    assert len(rows) == 2 + len(cells)
    assert "| 1,234 | 57 | 21.77 |" in rows[2]
    assert "| 2,000 | – | – |" in rows[3]
    assert "| – | – | – |" in rows[4]
    assert "n/a: the robot would starve" in rows[5]
    plot(cells, tmp_path / "rtc_sim.png")
    assert (tmp_path / "rtc_sim.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_cell_row_names_its_horizon_its_300_step_rate_and_its_max_rewards() -> None:
    """Every rate beside its 300-step rate (gym-aloha's episode), the distribution of the episodes'
    maximum reward, and the execution horizon the cell ran."""
    episodes = [{"max_reward": r} for r in (4.0, 0.0, 2.0, 4.0)]
    s = with_rewards({"summary": {**summary(1000.0, 500.0), "successes_within_300": 1, "execution_horizon": 6},
                      "episodes": episodes})
    assert s["max_reward_counts"] == {"0": 1, "2": 1, "4": 2}
    row = table([{"label": "p", "policy": "p", "delay_ms": 0.0, "delay_steps": 0, "mode": "rtc", "summary": s}])
    assert "| rtc | 6 | 1/2 (9–91%) | 1/2 | 0: 1 / 2: 1 / 4: 2 | 1,000 | 500 | 2.00 |" in row.splitlines()[2], row
