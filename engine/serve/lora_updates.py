"""``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter``: vLLM's runtime LoRA updates.

Only served when allowed, as vLLM serves them only under ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``: here the
environment variable ``SERVESIM_ALLOW_RUNTIME_LORA_UPDATING`` (``1`` or ``true``) or the flag
``--allow-runtime-lora-updating``. Otherwise the routes do not exist (404, like any unknown route), since
anyone who can reach the server could otherwise make it read any folder it can see.

Load (``{"lora_name", "lora_path"}``) reads and checks the adapter as ``--lora-modules`` does, off the event
loop; a bad one is a 400 naming ``lora_path`` and the reason, and registers nothing. A good one gets the next
``lora_int_id`` (after the ``--lora-modules`` ones; ids are never reused), and from then on a request whose
``model`` is the name runs it and ``/v1/models`` lists it. A name already served is a 400.

Unload (``{"lora_name"}``, optionally ``lora_int_id``) forgets the name: later requests naming it are the
404 of any unknown model, and ``/v1/models`` drops it; an unknown name is a 404 (vLLM's status). As in vLLM,
it never waits for nor stops requests already running with the adapter: each holds its own LoRARequest, and
the runner keeps the adapter's weights (its host copy until the least-recently-used order drops it, its
device slot while a batch uses it), so they finish with exactly the adapter they started with. A later load
of the name is a new adapter under a new id, which also keys the prefix cache (engine/core/lora.py), so it
never reuses the old adapter's KV.

Both answer vLLM's plain-text ``Success: ...`` with a 200. Loads and unloads are serialised: a load's disk
read awaits, and a second load of the same name must see the first.
"""

from __future__ import annotations

import asyncio
import logging
import os

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from engine.core import LoRARequest
from engine.serve.errors import OpenAIError
from engine.serve.state import ServerState

logger = logging.getLogger(__name__)

ALLOW_ENV_VAR = "SERVESIM_ALLOW_RUNTIME_LORA_UPDATING"

_STRICT = ConfigDict(extra="ignore", strict=True)


class LoadLoRAAdapterRequest(BaseModel):
    model_config = _STRICT
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = _STRICT
    lora_name: str
    lora_int_id: int | None = Field(default=None, ge=1)


def runtime_lora_updating_allowed(flag: bool | None = None) -> bool:
    """The flag when given (True or False), else the environment variable (``1`` or ``true``, any case)."""
    if flag is not None:
        return flag
    return os.environ.get(ALLOW_ENV_VAR, "0").strip().lower() in ("1", "true")


def _require(value: str, param: str) -> str:
    if not value.strip():
        raise OpenAIError(f"{param} must be a non-empty string, got {value!r}", param=param, code="invalid_value")
    return value


async def load_lora_adapter(body: LoadLoRAAdapterRequest, state: ServerState) -> PlainTextResponse:
    name, path = _require(body.lora_name, "lora_name"), _require(body.lora_path, "lora_path")
    async with state.lora_update_lock:
        if name in state.lora_requests:
            raise OpenAIError(f"The LoRA adapter '{name}' has already been loaded (unload it first to load it "
                              "again)", param="lora_name", code="lora_adapter_already_loaded")
        if name in state.served_model_names:
            raise OpenAIError(f"lora_name '{name}' is the base model's name; give the adapter another",
                              param="lora_name", code="invalid_value")
        if not state.engine.engine_args.enable_lora:
            raise OpenAIError("loading a LoRA adapter needs a server started with --enable-lora",
                              param="lora_path", code="lora_disabled")
        lora_request = LoRARequest(name, state.next_lora_int_id, path)
        try:  # a disk read: off the event loop, so other requests keep streaming meanwhile
            await asyncio.to_thread(state.engine.add_lora, lora_request)
        except ValueError as error:
            raise OpenAIError(f"lora_path {path!r}: {error}", param="lora_path", code="invalid_lora_adapter") \
                from None
        # Taken only now: a failed load registered nothing in the runner, so its id is still free.
        state.next_lora_int_id += 1
        state.lora_requests[name] = lora_request
    logger.info("loaded LoRA adapter %r (lora_int_id %d) from %s", name, lora_request.lora_int_id, path)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(body: UnloadLoRAAdapterRequest, state: ServerState) -> PlainTextResponse:
    name = _require(body.lora_name, "lora_name")
    async with state.lora_update_lock:
        lora_request = state.lora_requests.get(name)
        if lora_request is None or body.lora_int_id not in (None, lora_request.lora_int_id):
            which = f"'{name}'" if body.lora_int_id is None else f"'{name}' with lora_int_id {body.lora_int_id}"
            raise OpenAIError(f"The LoRA adapter {which} cannot be found.", status=404, param="lora_name",
                              code="lora_adapter_not_found")
        del state.lora_requests[name]
        state.lora_parents.pop(name, None)
        state.engine.remove_lora(lora_request.lora_int_id)
    logger.info("unloaded LoRA adapter %r (lora_int_id %d)", name, lora_request.lora_int_id)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


def add_lora_update_routes(app: FastAPI, state: ServerState) -> None:
    logger.warning("runtime LoRA loading and unloading is on (/v1/load_lora_adapter, /v1/unload_lora_adapter): "
                   "any client can make the server read any folder it can see")

    @app.post("/v1/load_lora_adapter")
    async def load_route(body: LoadLoRAAdapterRequest) -> PlainTextResponse:
        return await load_lora_adapter(body, state)

    @app.post("/v1/unload_lora_adapter")
    async def unload_route(body: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        return await unload_lora_adapter(body, state)
