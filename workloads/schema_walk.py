"""Walking the schema's model tree along a path, for error messages and for ``--set`` overrides.

Two users need to know "what lives at this path": the error translator (to drop the union tags
pydantic inserts into locations and to suggest the nearest valid key) and the override applier (to
tell a misspelled path from a valid one whose section is simply absent from the YAML). Both walk the
same pydantic models, so the rules live here once.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

ShapeKind = Literal["model", "model_list", "tagged_union", "mapping", "leaf"]


@dataclass(frozen=True)
class FieldShape:
    """What a field holds: a nested model, a list of them, a union selected by a tag key, a free mapping,
    or a value."""

    kind: ShapeKind
    model: type[BaseModel] | None = None
    # For a tagged union: the tag value (e.g. "poisson") -> the member model.
    members: dict[str, type[BaseModel]] = field(default_factory=dict)
    discriminator: str | None = None

    def models_for(self, raw: Any) -> list[type[BaseModel]]:
        """The models a raw value of this field may be validated as (all members if the tag is unknown)."""
        if self.kind == "model" and self.model is not None:
            return [self.model]
        if self.kind == "tagged_union":
            if isinstance(raw, dict) and raw.get(self.discriminator) in self.members:
                return [self.members[raw[self.discriminator]]]
            return list(self.members.values())
        return []


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _members(annotation: Any) -> list[Any]:
    """The non-None members of an annotation (one element unless it is a union)."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [member for member in typing.get_args(annotation) if member is not type(None)]
    return [annotation]


def _tag_of(member: type[BaseModel], discriminator: str) -> str:
    (tag,) = typing.get_args(member.model_fields[discriminator].annotation)
    return tag


def field_shape(model: type[BaseModel], name: str) -> FieldShape | None:
    """The shape of ``model.name``, or None when the model has no such field."""
    info = model.model_fields.get(name)
    if info is None:
        return None
    members = _members(info.annotation)
    if isinstance(info.discriminator, str):
        tagged = {_tag_of(member, info.discriminator): member for member in members}
        return FieldShape("tagged_union", members=tagged, discriminator=info.discriminator)
    if len(members) == 1 and _is_model(members[0]):
        return FieldShape("model", model=members[0])
    if len(members) == 1 and typing.get_origin(members[0]) is list and _is_model(typing.get_args(members[0])[0]):
        return FieldShape("model_list", model=typing.get_args(members[0])[0])
    if any(typing.get_origin(member) is dict or member is dict for member in members):
        return FieldShape("mapping")
    return FieldShape("leaf")


def field_names(models: Sequence[type[BaseModel]]) -> list[str]:
    names: dict[str, None] = {}
    for model in models:
        names.update(dict.fromkeys(model.model_fields))
    return list(names)


@dataclass
class Location:
    """A pydantic location rendered for people: the dotted parts, and the keys valid beside the last."""

    shown: list[str]
    candidate_keys: list[str]

    @property
    def path(self) -> str:
        text = ""
        for part in self.shown:
            text += part if part.startswith("[") or not text else "." + part
        return text


def walk_location(model: type[BaseModel], location: Sequence[str | int]) -> Location:
    """Render a pydantic ``loc`` against ``model``, dropping tagged-union tags."""
    shown: list[str] = []
    candidates: list[str] = []
    current: list[type[BaseModel]] = [model]
    list_items: list[type[BaseModel]] = []
    index = 0
    while index < len(location):
        part = location[index]
        index += 1
        if isinstance(part, int):
            shown.append(f"[{part}]")
            current = list_items  # the element model of a list of models, else nothing known
            list_items = []
            continue
        shown.append(str(part))
        if not current:
            continue
        candidates = field_names(current)
        owner = next((candidate for candidate in current if part in candidate.model_fields), None)
        shape = field_shape(owner, part) if owner is not None else None
        if shape is None:
            current = []
        elif shape.kind == "tagged_union":
            next_part = location[index] if index < len(location) else None
            if isinstance(next_part, str) and next_part in shape.members:
                current = [shape.members[next_part]]
                index += 1  # the tag pydantic inserted; it is not a key in the file
            else:
                current = list(shape.members.values())
        elif shape.kind == "model_list":
            list_items, current = [shape.model], []
        else:
            current = shape.models_for(None)
    return Location(shown, candidates)
