"""The base every schema model shares: unknown keys are errors, and values are taken as typed.

``extra="forbid"`` turns a misspelled key into an error instead of a silently ignored setting.
``strict=True`` keeps YAML's types honest: ``block_size: "16"`` (a quoted string) or
``num_requests: 2.5`` is a mistake worth reporting, not something to coerce. ``frozen=True`` lets one
validated config be shared by a sweep's points and by the simulator without defensive copies.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SchemaModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)
