"""Stop strings: text-level stop conditions, which the core cannot check (it never sees text).

A stop string can only complete inside the text a step just added, possibly starting up to
``len(stop) - 1`` characters earlier, so each check scans that window, not the whole output: the cost
per step is independent of the output's length. Of several matches the earliest in the text wins (a
later one would have been found first, in an earlier step, had the text arrived character by character).

While streaming, text that may be the start of a stop string must not be sent yet: if the stop string
completes in a later step, that text is cut from the output, and a client cannot take back what it
already received. ``stop_string_hold_back`` says how many trailing characters to hold.
"""

from __future__ import annotations

from typing import NamedTuple


class StopStringMatch(NamedTuple):
    stop_string: str
    truncate_to: int  # the output text keeps text[:truncate_to]


def find_stop_string(text: str, num_new_chars: int, stop: list[str],
                     include_stop_str_in_output: bool, min_position: int = 0) -> StopStringMatch | None:
    """The stop string completed by the last ``num_new_chars`` characters of ``text``, if any, starting
    at ``min_position`` or later (the text before it is exempt: that of the first ``min_tokens`` tokens)."""
    if not stop or num_new_chars <= 0:
        return None
    best: tuple[int, str] | None = None
    new_start = len(text) - num_new_chars
    for stop_string in stop:
        # Begin early enough to find a match that straddles the old and new text.
        position = text.find(stop_string, max(min_position, new_start - len(stop_string) + 1))
        if position != -1 and (best is None or position < best[0]):
            best = (position, stop_string)
    if best is None:
        return None
    position, stop_string = best
    end = position + len(stop_string) if include_stop_str_in_output else position
    return StopStringMatch(stop_string, end)


def stop_string_hold_back(text: str, stop: list[str]) -> int:
    """How many trailing characters of ``text`` are a proper prefix of some stop string (0 if none).

    Holding exactly these is enough: a stop string found later starts either inside them or after
    them, so the text already sent never needs to be cut. Costs O(sum of len(stop)^2) per call; stop
    strings are short.
    """
    hold = 0
    for stop_string in stop:
        for length in range(min(len(stop_string) - 1, len(text)), hold, -1):
            if text.endswith(stop_string[:length]):
                hold = length
                break
    return hold
