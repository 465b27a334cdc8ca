"""vLLM's adapter caches: ``max_loras`` device slots and ``max_cpu_loras`` adapters in host memory, both LRU.

vLLM's worker (``LRUCacheWorkerLoRAManager``) makes every adapter of a step's batch active before the forward
pass: one not in host memory is read from disk into the host cache (evicting the least recently used adapter
there, which also frees its device slot), and one not on the device is copied into a slot (evicting the least
recently used adapter there). The core never lets a batch use more than ``max_loras`` adapters
(engine/core/waiting_admission.py), so the batch's own adapters always fit.

Two choices keep the simulation exact and order-free:

- "least recently used" is by step: every adapter of a batch is used in that step, with ties broken by the
  runner's id (lowest first). A batch's order then never matters, and a decode fast-forward, which knows in
  which steps each adapter runs, can leave exactly the state the ordinary steps would (``touch``);
- an adapter of the current batch is never the one evicted (vLLM touches them one by one, and could evict a
  batch's adapter it has not yet reached; here the victim is the least recent of the others).

The host cache holds every adapter on the device (``max_cpu_loras >= max_loras``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AdapterLoad:
    int_id: int
    from_disk: bool


class LoRASlots:
    def __init__(self, max_loras: int, max_cpu_loras: int) -> None:
        if max_loras < 1 or max_cpu_loras < max_loras:
            raise ValueError(f"LoRA slots need max_loras >= 1 and max_cpu_loras >= max_loras, got {max_loras} and "
                             f"{max_cpu_loras}")
        self.max_loras = max_loras
        self.max_cpu_loras = max_cpu_loras
        # Adapter id -> the step it was last used in.
        self.device: dict[int, int] = {}
        self.host: dict[int, int] = {}

    def copy(self) -> LoRASlots:
        twin = LoRASlots(self.max_loras, self.max_cpu_loras)
        twin.device, twin.host = dict(self.device), dict(self.host)
        return twin

    def admit(self, batch: Collection[int], step: int) -> list[AdapterLoad]:
        """Make the batch's adapters active for ``step``; the loads it takes, in id order."""
        if len(batch) > self.max_loras:
            raise ValueError(f"a batch uses {len(batch)} LoRA adapters, more than max_loras {self.max_loras}")
        loads = []
        for adapter in sorted(batch):
            if adapter in self.device:
                continue
            from_disk = adapter not in self.host
            if from_disk:
                if len(self.host) >= self.max_cpu_loras:
                    victim = _least_recent(self.host, batch)
                    del self.host[victim]
                    self.device.pop(victim, None)  # vLLM's remove_adapter deactivates it too
                self.host[adapter] = step
            if len(self.device) >= self.max_loras:
                del self.device[_least_recent(self.device, batch)]
            self.device[adapter] = step
            loads.append(AdapterLoad(adapter, from_disk))
        self.touch(batch, step)
        return loads

    def touch(self, adapters: Iterable[int], step: int) -> None:
        """Note ``adapters`` (all active) as used in ``step``."""
        device, host = self.device, self.host
        for adapter in adapters:
            device[adapter] = host[adapter] = step


def _least_recent(cache: dict[int, int], keep: Collection[int]) -> int:
    return min((last_used, adapter) for adapter, last_used in cache.items() if adapter not in keep)[1]
