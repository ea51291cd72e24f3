"""``python -m podracer`` is the ``podracer`` command."""

import sys

from podracer.cli import main

sys.exit(main())
