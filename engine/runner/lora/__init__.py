"""Multi-LoRA serving in the real runner (vLLM's ``enable_lora``), one idea per file:

    config.py          LoRAConfig: max_loras, max_lora_rank, max_cpu_loras
    lora_linear.py     LoRALinear: a projection plus its adapters' slots; rows grouped by adapter
    model_wrapping.py  which projections get slots (q/k/v, o, gate/up, down); mixtures of experts refused
    host_cache.py      LoRAHostCache: adapters read from disk and checked, least recently used out
    device_slots.py    LoRASlots: max_loras device slots assigned to each step's adapters
    manager.py         LoRAManager: the runner's entry points (add_lora, prepare_step, finish_step)

Adapters are read by engine/models/lora_checkpoint.py (PEFT's format) and generated for tests and examples
by ``python -m engine.models.make_lora``. Nothing is imported here (see engine/runner/__init__.py).
"""
