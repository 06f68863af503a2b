import sys

from dit4dit_npu import device
from dit4dit_npu.eval.cli import main

device.configure_host_allocator()  # glibc malloc thresholds, CPU hosts only (bench/malloc.py)
sys.exit(main())
