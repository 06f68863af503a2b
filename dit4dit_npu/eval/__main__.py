import sys

from dit4dit_npu.eval.offline import main

sys.exit(main())
