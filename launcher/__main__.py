"""``python -m hvdlite.runner`` is ``hvdlite-run``."""

import sys

from hvdlite.runner.launch import main

sys.exit(main())
