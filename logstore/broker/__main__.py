"""``python -m logstore.broker``: the same as ``logstore broker start``."""

import sys

from logstore.broker.server import main

sys.exit(main())
