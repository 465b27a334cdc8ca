"""Multi-LoRA serving's settings (vLLM's ``enable_lora``, ``max_loras``, ``max_lora_rank``, ``max_cpu_loras``).

The runner holds ``max_loras`` adapters on the device at once (one slot each, every slot padded to
``max_lora_rank``), and up to ``max_cpu_loras`` loaded adapters in host memory, so that an adapter coming back
into the batch is copied from memory rather than read from disk again.
"""

from __future__ import annotations

from dataclasses import dataclass


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class LoRAConfig:
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None  # None: max_loras

    def __post_init__(self) -> None:
        if not _is_int(self.max_loras) or self.max_loras < 1:
            raise ValueError(f"max_loras must be an integer >= 1, got {self.max_loras!r}")
        if not _is_int(self.max_lora_rank) or self.max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be an integer >= 1, got {self.max_lora_rank!r}")
        if self.max_cpu_loras is not None and (not _is_int(self.max_cpu_loras)
                                               or self.max_cpu_loras < self.max_loras):
            # vLLM's rule: every adapter on the device is also in the host cache.
            raise ValueError(f"max_cpu_loras must be None or an integer >= max_loras ({self.max_loras}), "
                             f"got {self.max_cpu_loras!r}")

    @property
    def host_cache_size(self) -> int:
        return self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras
