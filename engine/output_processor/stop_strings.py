"""Stop strings: text-level stop conditions, which the core cannot check (it never sees text).

A stop string can only complete inside the text a step just added, possibly starting up to
``len(stop) - 1`` characters earlier, so each check scans that window, not the whole output: the cost
per step is independent of the output's length. Of several matches the earliest in the text wins (a
later one would have been found first, in an earlier step, had the text arrived character by character).
"""

from __future__ import annotations

from typing import NamedTuple


class StopStringMatch(NamedTuple):
    stop_string: str
    truncate_to: int  # the output text keeps text[:truncate_to]


def find_stop_string(text: str, num_new_chars: int, stop: list[str],
                     include_stop_str_in_output: bool) -> StopStringMatch | None:
    """The stop string completed by the last ``num_new_chars`` characters of ``text``, if any."""
    if not stop or num_new_chars <= 0:
        return None
    best: tuple[int, str] | None = None
    new_start = len(text) - num_new_chars
    for stop_string in stop:
        # Begin early enough to find a match that straddles the old and new text.
        position = text.find(stop_string, max(0, new_start - len(stop_string) + 1))
        if position != -1 and (best is None or position < best[0]):
            best = (position, stop_string)
    if best is None:
        return None
    position, stop_string = best
    end = position + len(stop_string) if include_stop_str_in_output else position
    return StopStringMatch(stop_string, end)
