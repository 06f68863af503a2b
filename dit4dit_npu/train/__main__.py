"""`python -m dit4dit_npu.train --config FILE [a.b=c | --a.b c ...] [--dry-run]`."""

from dit4dit_npu.train.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
