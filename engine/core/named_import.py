"""Loading a user's own policy named as ``"module:name"`` (a scheduling rank function, an eviction policy class).

One place for the rules, so every such field refuses the same mistakes with the same words: a string without a
module or a name, a module that does not import, a name that is not a callable in it. The ValueError says what
the value must be; the config that calls it names the field and the value.
"""

from __future__ import annotations

import importlib
from typing import Callable


def import_named_callable(spec: object, kind: str, choices: str) -> Callable:
    """The callable ``spec`` (``"module:name"``) names. ``kind`` is how the name is spelled in messages
    (``function``, ``Class``); ``choices`` the message for a value of the wrong shape (the named alternatives)."""
    module_name, colon, name = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if not colon or not module_name or not name or ":" in name:
        raise ValueError(choices)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"'module:{kind}' whose module imports ({error})") from None
    found = getattr(module, name, None)
    if not callable(found):
        raise ValueError(f"'module:{kind}' naming a callable; {module_name} has no callable {name!r}")
    return found
