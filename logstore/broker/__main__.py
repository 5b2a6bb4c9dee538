"""``python -m logstore.broker``: the same as ``logstore broker start``."""

import sys

from logstore.broker.service import main

sys.exit(main())
