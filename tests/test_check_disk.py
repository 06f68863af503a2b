"""scripts/check_disk.sh, which scripts/test.sh runs before pytest: on a nearly full disk the tests
would each error out (they write checkpoints under the temp folder), so it refuses in one line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def check(tmp: Path, need: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp), "TEST_MIN_FREE_MB": need}
    return subprocess.run(["bash", str(ROOT / "scripts" / "check_disk.sh")], env=env,
                          capture_output=True, text=True, timeout=60)


def test_enough_free_space_passes_silently(tmp_path):
    r = check(tmp_path, "0")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


@pytest.mark.parametrize("need, says", [
    (str(10**12), "the tests need 1000000000000 (TEST_MIN_FREE_MB): free some disk first"),
    ("2GB", "TEST_MIN_FREE_MB=2GB: expected a whole number of MB"),
])
def test_too_little_space_or_a_bad_setting_is_one_line(tmp_path, need, says):
    r = check(tmp_path, need)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
    if need.isdigit():
        assert str(tmp_path) in r.stderr  # names the folder it measured


def test_a_temp_folder_that_is_not_there_is_one_line(tmp_path):
    r = check(tmp_path / "missing", "0")
    assert r.returncode == 2 and r.stderr == f"scripts/check_disk.sh: TMPDIR={tmp_path / 'missing'}: expected an existing folder\n"
