"""``python -m engine.serve --help``."""

import sys

from engine.optional_dependencies import exit_for_missing_extra

try:
    from engine.serve.cli import main
except ModuleNotFoundError as error:  # the server's packages are an extra the base install lacks
    sys.exit(exit_for_missing_extra(error, "python -m engine.serve"))

sys.exit(main())
