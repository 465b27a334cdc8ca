"""Which LoRA adapter a request runs with (vLLM's ``LoRARequest``, with its field names).

Multi-LoRA serving runs many fine-tuned variants of one base model in one batch: each request names an
adapter, and the runner adds that adapter's low-rank update to the base layers' output for the request's
tokens only. The core needs to know the adapter for two reasons:

- the prefix cache: KV computed under one adapter is not another's (or the base model's), so the adapter's
  name and id are an extra key of the first block's hash, and the chain carries it into every later block
  (the id too because a server may unload a name and load it again from other weights: the new adapter gets
  a new id, never reused, so it can never hit the KV the old one left in the cache);
- the batch: the runner holds at most ``SchedulerConfig.max_loras`` adapters on the device at once, so the
  running requests may use at most that many distinct adapters (engine/core/waiting_admission.py).

Pure Python; the runner loads the adapter from ``lora_path`` (engine/runner/lora/).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoRARequest:
    """An adapter: a name (what users and the server's ``model`` field call it), a positive integer id (the
    runner's key; two adapters must not share one), and the folder holding it (PEFT's ``adapter_config.json``
    and ``adapter_model.safetensors``; empty for the simulator, which only prices adapters)."""
    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"LoRARequest.lora_name must be a non-empty string, got {self.lora_name!r}")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            # 0 is the base model's id in the runner's per-token adapter index (vLLM reserves it the same way).
            raise ValueError(f"LoRARequest.lora_int_id must be an integer >= 1, got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str):
            raise ValueError(f"LoRARequest.lora_path must be a string, got {self.lora_path!r}")


def encode_lora(lora_request: LoRARequest | None) -> bytes:
    """The adapter's part of the first block's extra keys (empty for the base model): its id, then its name
    (the id is digits ended by ``:``, so no two (id, name) pairs encode alike)."""
    if lora_request is None:
        return b""
    return b"lora:%d:" % lora_request.lora_int_id + lora_request.lora_name.encode("utf-8")
