"""``python -m engine.serve --help``."""

import sys

from engine.optional_dependencies import missing_extra_message

try:
    from engine.serve.cli import main
except ModuleNotFoundError as error:  # the server's packages are an extra the base install lacks
    message = missing_extra_message(error, "python -m engine.serve")
    if message is None:
        raise
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)

sys.exit(main())
