"""Loaded adapters in host memory, least recently used first out (vLLM's ``max_cpu_loras``).

An adapter is read and checked (engine/models/lora_checkpoint.py) when a request naming it is added, on
the front end's thread, so a bad adapter is the request's ValueError and never reaches a step. The engine
thread reads the cache when it fills a device slot; a lock makes the two safe together. An adapter evicted
from here while requests still use it is read again from its folder, which was valid when they were added.

The cache also keeps the identity of every adapter it has seen: a ``lora_int_id`` always names the same
adapter (name and folder), and a name always the same id, because the device slots key weights by the id
(two adapters under one id would share weights) and users expect one name to mean one adapter.

``remove_lora`` (the server's ``/v1/unload_lora_adapter``) releases the adapter's name, so that a later
load may give it to a new adapter under a new id, but keeps the id's identity forever (ids are never
reused) and leaves the weights to the least-recently-used order: requests already running with the old
adapter keep their LoRARequest, and their steps still find (or read again) exactly that adapter, which
keeps its device slot while any batch uses it. Dropping the weights at once would make such a request read
its folder again, which the user may have just overwritten with the new adapter.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from engine.core.lora import LoRARequest
from engine.models.lora_checkpoint import LoRATargetShapes, LoRAWeights, read_adapter


class LoRAHostCache:
    def __init__(self, capacity: int, target_shapes: LoRATargetShapes, max_lora_rank: int) -> None:
        self.capacity = capacity
        self.target_shapes = target_shapes
        self.max_lora_rank = max_lora_rank
        self._adapters: OrderedDict[int, LoRAWeights] = OrderedDict()  # oldest use first
        self._identity: dict[int, tuple[str, str]] = {}
        self._ids_by_name: dict[str, int] = {}
        self._lock = threading.Lock()
        self.num_loads = 0  # reads from disk, for tests and logs

    def __contains__(self, lora_int_id: int) -> bool:
        with self._lock:
            return lora_int_id in self._adapters

    @property
    def lora_int_ids(self) -> list[int]:
        """The cached adapters' ids, least recently used first."""
        with self._lock:
            return list(self._adapters)

    def check_identity(self, lora_request: LoRARequest) -> None:
        """A ValueError when the request's id or name already belongs to another adapter."""
        lora_id, name, path = lora_request.lora_int_id, lora_request.lora_name, lora_request.lora_path
        with self._lock:
            known = self._identity.get(lora_id)
            if known == (name, path):
                return  # an adapter seen before (possibly removed since, with requests still running it)
            if known is not None:
                raise ValueError(f"LoRARequest lora_int_id {lora_id} is adapter {known[0]!r} at {known[1]!r}; "
                                 f"it cannot also be {name!r} at {path!r} (give each adapter its own id)")
            other_id = self._ids_by_name.get(name)
            if other_id is not None and other_id != lora_id:
                raise ValueError(f"LoRARequest lora_name {name!r} is adapter lora_int_id {other_id}; it cannot "
                                 f"also be lora_int_id {lora_id} (give each adapter its own name)")

    def remove_lora(self, lora_int_id: int) -> bool:
        """Release the adapter's name for a new adapter (False: the id was never seen). Its weights stay until
        the least-recently-used order drops them, and the id keeps naming this adapter (see the docstring)."""
        with self._lock:
            identity = self._identity.get(lora_int_id)
            if identity is None:
                return False
            if self._ids_by_name.get(identity[0]) == lora_int_id:
                del self._ids_by_name[identity[0]]
            return True

    def get(self, lora_request: LoRARequest) -> LoRAWeights:
        """The adapter's weights, read from its folder unless cached (a ValueError if it cannot be used);
        it becomes the most recently used, and the least recently used beyond ``capacity`` is dropped."""
        self.check_identity(lora_request)
        lora_id = lora_request.lora_int_id
        with self._lock:
            cached = self._adapters.get(lora_id)
            if cached is not None:
                self._adapters.move_to_end(lora_id)
                return cached
        if not lora_request.lora_path:
            raise ValueError(f"LoRARequest {lora_request.lora_name!r} has no lora_path (the folder of a PEFT "
                             "adapter)")
        adapter = read_adapter(lora_request.lora_path, self.target_shapes, self.max_lora_rank)
        with self._lock:
            self.num_loads += 1
            if lora_id not in self._identity:  # a removed adapter read again keeps its name released
                self._identity[lora_id] = (lora_request.lora_name, lora_request.lora_path)
                self._ids_by_name[lora_request.lora_name] = lora_id
            self._adapters[lora_id] = adapter
            self._adapters.move_to_end(lora_id)
            while len(self._adapters) > self.capacity:
                self._adapters.popitem(last=False)
        return adapter
