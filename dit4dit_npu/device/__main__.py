"""``python -m dit4dit_npu.device [env [--ranks N]]`` (console script ``dit4dit-device``): the
detected device in one line, or the launch environment for this host (used by
``scripts/train_8p.sh``)."""

from __future__ import annotations

import shlex
import sys

from dit4dit_npu.console import entry_point
from dit4dit_npu.device.api import DeviceError, describe
from dit4dit_npu.device.launch import check_local_ranks, launch_env

USAGE = """usage: python -m dit4dit_npu.device [env [--ranks N]]
  (no argument)   one line describing the detected device
  env             `export NAME=value` lines for a launcher on this host (eval them in bash)
  --ranks N       first check N ranks per node against the visible cards (one line, exit 2)
  -h, --help      this text"""


@entry_point
def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if not args:
        print(describe())
        return 0
    if args[0] != "env" or len(args) not in (1, 3) or (len(args) == 3 and args[1] != "--ranks"):
        print(USAGE, file=sys.stderr)
        return 2
    if len(args) == 3:
        ranks = _positive_int(args[2], "--ranks")
        warning = check_local_ranks(ranks)
        if warning:
            print(warning, file=sys.stderr)
    for key, value in launch_env().items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


def _positive_int(text: str, name: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1 or str(n) != text.strip():
        raise DeviceError(f"{name}={text!r}: expected a positive integer (ranks per node)")
    return n


if __name__ == "__main__":
    raise SystemExit(main())
