"""``python -m aiscope``."""

import sys

from aiscope.cli import main

sys.exit(main())
