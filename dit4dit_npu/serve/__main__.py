import sys

from dit4dit_npu.serve.server import main

sys.exit(main())
