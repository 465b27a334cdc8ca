"""Which install extra provides each optional package, so that a missing one is named with its fix.

The README's first command installs only what the simulator needs; real runs, the server and the
Triton kernels are extras (``pyproject.toml``). Without this, a user who ran that command and then asked
for a real run met ``ModuleNotFoundError: No module named 'torch'`` and had to guess the extra.
"""

from __future__ import annotations

import sys

# Top-level package -> the extras (comma-separated, as pip spells them) that install it and what needs it.
EXTRA_FOR_PACKAGE = {
    "torch": "real", "transformers": "real", "safetensors": "real", "tokenizers": "real",
    "fastapi": "real,serve", "uvicorn": "real,serve", "httpx": "serve",
    "triton": "triton", "flash_attn": "gpu", "xgrammar": "structured",
}


def missing_extra_message(error: ModuleNotFoundError, needed_for: str) -> str | None:
    """One line naming the missing package and the extra to install, or None when ``error`` is about a
    package no extra provides (then it is a bug or a broken install, and the traceback should show)."""
    package = (error.name or "").split(".")[0]
    extra = EXTRA_FOR_PACKAGE.get(package)
    if extra is None:
        return None
    return (f"{needed_for} needs the {package!r} package, which this install lacks: install the {extra!r} "
            f"extra (in a checkout: pip install -e '.[{extra}]'; the test extra has them all)")


def exit_for_missing_extra(error: ModuleNotFoundError, needed_for: str) -> int:
    """For a command's ``except ModuleNotFoundError``: print the one-line message and return exit status 1,
    or re-raise ``error`` when no extra provides the package (a bug or a broken install: show the traceback)."""
    message = missing_extra_message(error, needed_for)
    if message is None:
        raise error
    print(f"error: {message}", file=sys.stderr)
    return 1
