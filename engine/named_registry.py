"""Things registered by name (vLLM's ``--tool-call-parser NAME``, ``--reasoning-parser NAME``): one registry class, so
that every front-end option spelled by name refuses a second registration and an unknown name the same way."""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class NamedRegistry(Generic[T]):
    def __init__(self, what: str) -> None:
        self.what = what  # "tool-call parser": how errors name an entry
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T) -> None:
        if name in self._entries:
            raise ValueError(f"a {self.what} named {name!r} is already registered")
        self._entries[name] = entry

    def names(self) -> list[str]:
        return sorted(self._entries)

    def get(self, name: str) -> T:
        """The entry registered as ``name``; a ValueError listing the known names otherwise."""
        if name not in self._entries:
            raise ValueError(f"unknown {self.what} {name!r}; known: {', '.join(self.names())}")
        return self._entries[name]
