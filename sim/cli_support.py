"""What the command-line tools share about bad input and warnings, so that each says it the same way.

Bad input ends a tool with one ``error: ...`` line naming the flag and the value, exit code 2 (argparse's
convention), never a traceback; a warning is one ``warning: ...`` line on stderr, never Python's
``file:line: UserWarning`` with a source line that means nothing to a user.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def positive_int(text: str) -> int:
    """argparse ``type`` for counts (threads, jobs, repeats): an integer >= 1; argparse names the flag."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def open_fraction(text: str) -> float:
    """argparse ``type`` for a fraction strictly between 0 and 1 (e.g. the share of steps held out)."""
    return _fraction(text, include_one=False)


def positive_fraction(text: str) -> float:
    """argparse ``type`` for a fraction in (0, 1] (e.g. the share of requests that must meet an SLO)."""
    return _fraction(text, include_one=True)


def _fraction(text: str, include_one: bool) -> float:
    interval = "(0, 1]" if include_one else "(0, 1), both ends excluded"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in {interval}, got {text!r}") from None
    if not (0.0 < value <= 1.0 if include_one else 0.0 < value < 1.0):
        raise argparse.ArgumentTypeError(f"must be in {interval}, got {text}")
    return value


def check_output_directory(parser: argparse.ArgumentParser, flag: str, path: str | Path | None) -> None:
    """An output that is a directory of files (a run, a comparison) must not be an existing file."""
    if path is not None and Path(path).exists() and not Path(path).is_dir():
        parser.error(f"{flag}: {str(path)!r} is a file, not a directory; give a directory to write into")


def check_output_file(parser: argparse.ArgumentParser, flag: str, path: str | Path | None, example: str) -> None:
    """An output that is one file (a profile, a page) must not be an existing directory; ``example``: a
    file name to suggest inside it."""
    if path is not None and Path(path).is_dir():
        parser.error(f"{flag}: {str(path)!r} is a directory; give the file to write, e.g. "
                     f"{str(Path(path) / example)!r}")


def print_warning(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


@contextmanager
def warnings_as_lines() -> Iterator[None]:
    """Print each distinct ``warnings.warn`` raised inside the block as a ``warning: ...`` line, once.

    The library code warns through ``warnings`` (callers of the API can filter or raise on them); the
    CLIs show them as one clean line each (a sweep's points share one profile: its mismatch once)."""
    previous = warnings.showwarning
    shown: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if str(message) not in shown:
            shown.add(str(message))
            print_warning(str(message))

    warnings.showwarning = show
    try:
        with warnings.catch_warnings():
            # Python's default shows a warning once per source line and process, for good: a second
            # main() in one process (the tests) would print nothing. Deduplicated above instead.
            warnings.simplefilter("always", UserWarning)
            yield
    finally:
        warnings.showwarning = previous


def flags_given(parser: argparse.ArgumentParser, args: argparse.Namespace, names: list[str]) -> list[str]:
    """The flags among ``names`` (their option strings, e.g. ``--device``) whose value is not the default,
    i.e. that the user gave: used to refuse flags that would do nothing in the mode asked for."""
    given = []
    for action in parser._actions:  # argparse has no public API from an option string to its action
        flag = next((option for option in action.option_strings if option in names), None)
        if flag is not None and getattr(args, action.dest) != action.default:
            given.append(flag)
    return given
