"""Putting LoRA slots into a loaded model: each decoder layer's qkv_proj, o_proj, gate_up_proj and down_proj
becomes a LoRALinear around the same nn.Linear (its weights untouched, never merged with an adapter's).

Mixtures of experts are refused: their experts are not one gate_up_proj per layer, and vLLM's expert LoRA
is not reproduced here; so is latent attention (DeepSeek), which has no q/k/v projections. The check runs when the engine starts, before any request.
"""

from __future__ import annotations

from torch import nn

from engine.models.lora_checkpoint import LoRATargetShapes
from engine.runner.lora.lora_linear import LoRALinear, LoRAStepContext


def check_lora_support(model: nn.Module) -> None:
    """A ValueError when the model's layers are not the dense Llama family's."""
    architecture = type(model).__name__
    for index, layer in enumerate(model.model.layers):
        mlp = layer.mlp
        if not hasattr(layer.self_attn, "qkv_proj"):
            raise ValueError(f"enable_lora is not supported for {architecture}: layer {index}'s attention is "
                             f"{type(layer.self_attn).__name__}, without the q/k/v projections adapters target; run "
                             "it without LoRA")
        if hasattr(mlp, "experts"):
            raise ValueError(f"enable_lora is not supported for mixture-of-experts models ({architecture}: layer "
                             f"{index}'s MLP is {type(mlp).__name__}); run it without LoRA")
        if not (hasattr(mlp, "gate_up_proj") and hasattr(mlp, "down_proj")):
            raise ValueError(f"enable_lora is not supported for {architecture}: layer {index}'s MLP is "
                             f"{type(mlp).__name__}, not the gated gate/up/down MLP adapters target; run it without LoRA")


def target_shapes(model: nn.Module) -> LoRATargetShapes:
    """Each adaptable projection's (in_features, out_features), as PEFT sees the unfused model."""
    attention = model.model.layers[0].self_attn
    mlp = model.model.layers[0].mlp
    hidden = attention.o_proj.out_features
    intermediate = mlp.down_proj.in_features
    return LoRATargetShapes(len(model.model.layers), {
        "q_proj": (hidden, attention.q_size), "k_proj": (hidden, attention.kv_size),
        "v_proj": (hidden, attention.kv_size), "o_proj": (attention.q_size, hidden),
        "gate_proj": (hidden, intermediate), "up_proj": (hidden, intermediate), "down_proj": (intermediate, hidden)})


def wrap_model(model: nn.Module, max_loras: int, max_lora_rank: int, context: LoRAStepContext) -> list[LoRALinear]:
    """Replace the adaptable projections in place; returns every LoRALinear, layer by layer."""
    check_lora_support(model)
    wrapped: list[LoRALinear] = []

    def wrap(parent: nn.Module, attribute: str, layer_index: int, names: tuple[str, ...],
             sizes: tuple[int, ...]) -> None:
        module = LoRALinear(getattr(parent, attribute), layer_index, names, sizes, max_loras, max_lora_rank,
                            context)
        setattr(parent, attribute, module)
        wrapped.append(module)

    for index, layer in enumerate(model.model.layers):
        attention, mlp = layer.self_attn, layer.mlp
        wrap(attention, "qkv_proj", index, ("q_proj", "k_proj", "v_proj"),
             (attention.q_size, attention.kv_size, attention.kv_size))
        wrap(attention, "o_proj", index, ("o_proj",), (attention.o_proj.out_features,))
        intermediate = mlp.down_proj.in_features
        wrap(mlp, "gate_up_proj", index, ("gate_proj", "up_proj"), (intermediate, intermediate))
        wrap(mlp, "down_proj", index, ("down_proj",), (mlp.down_proj.out_features,))
    return wrapped
