"""``python -m engine.serve --help``."""

import sys

from engine.serve.cli import main

sys.exit(main())
