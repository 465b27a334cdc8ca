"""An EAGLE-3 draft head (vLLM's ``speculative_config={"method": "eagle3", "model": ...}``), the proposer most deployments
of Llama 3, Qwen3 and gpt-oss run now.

EAGLE-3 (Li et al., 2025) reads three of the target's layers instead of its final feature: the residual stream entering
layers 2, L / 2 and L - 3 (vLLM's choice for an L-layer target), concatenated and projected to the width by ``fc``
(3 x hidden -> hidden). Its one decoder layer attends over the embedding of the next token (``input_layernorm``) beside
that feature (``hidden_norm``), concatenated: q, k and v read 2 x hidden. The layer's output goes through a final
``norm`` to its own ``lm_head`` over a draft vocabulary (``draft_vocab_size``, 32,000 in the published heads), whose ids
map to the target's by ``d2t`` (target id = draft id + d2t[draft id]). When it drafts further ahead it feeds back its
output before that norm in place of the projected feature.

Checkpoint (the published heads', e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, in safetensors): config.json with
``draft_vocab_size``, and ``fc.weight``, ``midlayer.{input_layernorm, hidden_norm, self_attn, post_attention_layernorm,
mlp}.*``, ``norm.weight``, ``lm_head.weight``, ``d2t`` (``t2d`` is not read), optionally ``embed_tokens.weight`` (else
the target's embedding).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import nn

from engine.models.config import ModelConfig
from engine.models.eagle import head_tensor_names
from engine.models.layers import RMSNorm, SwiGLUMLP
from engine.models.llama import (LlamaAttention, LlamaForCausalLM, LlamaModel, expected_fused_weight_keys,
                                 gate_or_up_rows)
from engine.models.loader import iterate_weights, resolve_dtype, safetensors_files
from engine.models.rotary_embedding import RotaryEmbedding
from engine.runner.attention import AttentionBackend, get_attention_backend


def aux_layers(num_layers: int) -> tuple[int, int, int]:
    """The target layers whose input an EAGLE-3 head reads (vLLM's default for an L-layer target)."""
    return (2, num_layers // 2, num_layers - 3)


class Eagle3Head(nn.Module):
    def __init__(self, config: ModelConfig, draft_vocab_size: int, attention_backend: str | AttentionBackend = "torch",
                 *, own_embedding: bool = False) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden) if own_embedding else None
        self.fc = nn.Linear(3 * hidden, hidden, bias=False)
        self.input_layernorm = RMSNorm(hidden, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(hidden, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, get_attention_backend(attention_backend), config.attention_bias,
                                        config.attention_bias)
        # q, k and v read the embedding and the feature side by side.
        self.self_attn.qkv_proj = nn.Linear(2 * hidden, self.self_attn.qkv_proj.out_features,
                                            bias=config.attention_bias)
        self.post_attention_layernorm = RMSNorm(hidden, config.rms_norm_eps)
        self.mlp = SwiGLUMLP(hidden, config.intermediate_size, config.mlp_bias, config.hidden_act)
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.rotary_emb = RotaryEmbedding(config.rotary_dim, config.rope_theta, config.rope_scaling)

    @property
    def max_model_len_limit(self) -> int:
        return self.config.max_model_len_limit

    def fit_context(self, max_model_len: int) -> None:
        LlamaForCausalLM.fit_context(self, max_model_len)

    def combine(self, aux_hidden_states: list[torch.Tensor]) -> torch.Tensor:
        """The target's three layers' features as one feature of the head's width."""
        return self.fc(torch.cat(aux_hidden_states, dim=-1))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, features: torch.Tensor, kv_caches,
                attn_metadata, embed: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The head's output before its final norm (what it feeds back) at ``positions``; ``features`` the combined
        target feature (or its own earlier output) there, ``input_ids`` the tokens one past them."""
        embeds = self.embed_tokens(input_ids) if self.embed_tokens is not None else embed(input_ids)
        features = features.to(embeds.dtype)
        cos, sin = self.rotary_emb.cos_sin(positions, embeds.dtype)
        attended = self.self_attn(torch.cat([self.input_layernorm(embeds), self.hidden_norm(features)], dim=-1),
                                  cos, sin, kv_caches[0], attn_metadata)
        residual = features + attended
        return residual + self.mlp(self.post_attention_layernorm(residual))

    def greedy_target_ids(self, prenorm: torch.Tensor) -> list[int]:
        """The target-vocabulary id of each row's most likely draft token."""
        draft_ids = self.lm_head(self.norm(prenorm)).argmax(dim=-1)
        return (draft_ids + self.d2t[draft_ids]).tolist()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = {**dict(self.named_parameters()), "d2t": self.d2t}
        attn = self.self_attn
        rows = {"q_proj": (0, attn.q_size), "k_proj": (attn.q_size, attn.kv_size),
                "v_proj": (attn.q_size + attn.kv_size, attn.kv_size)}
        loaded: set[str] = set()
        for name, tensor in weights:
            name = name.removeprefix("midlayer.")
            projection = name.split(".")[-2] if "." in name else ""
            if projection in rows:
                start, size = rows[projection]
                target = name.replace(projection, "qkv_proj")
                destination = params[target].data[start:start + size]
            elif projection in ("gate_proj", "up_proj"):
                target = name.replace(projection, "gate_up_proj")
                destination = gate_or_up_rows(params[target].data, "gate" if projection == "gate_proj" else "up")
            elif name in params:
                target, destination = name, params[name].data
            else:
                continue  # t2d, and what a head of another layout carries
            if destination.shape != tensor.shape:
                raise ValueError(f"EAGLE-3 head tensor {name!r} has shape {tuple(tensor.shape)}, expected "
                                 f"{tuple(destination.shape)}; does its config.json match its weights?")
            destination.copy_(tensor)
            loaded.add(f"{target}#{projection.removesuffix('_proj')}" if target != name else name)
        return loaded

    def expected_weight_keys(self) -> set[str]:
        return {"d2t", *expected_fused_weight_keys(self)}


def reads_aux_hidden_states(target) -> str | None:
    """Why ``target`` cannot hand an EAGLE-3 head its layers' inputs (None: it can: its layers run in LlamaModel's
    forward, which keeps them when asked)."""
    model = getattr(target, "model", None)
    if not isinstance(model, LlamaModel) or type(model).forward is not LlamaModel.forward:
        return f"{type(target).__name__} runs its layers in a forward of its own"
    if len(model.layers) < 4:
        return f"it has {len(model.layers)} layers; an EAGLE-3 head reads layers 2, L / 2 and L - 3"
    return None


def load_eagle3_head(path: str | Path, dtype, device, *, attention_backend, target_config: ModelConfig) -> Eagle3Head:
    raw = json.loads((Path(path) / "config.json").read_text())
    config = ModelConfig.from_dict({**raw, "architectures": ["LlamaForCausalLM"]})
    where = f"speculative_config.model {str(path)!r}"
    if config.hidden_size != target_config.hidden_size:
        raise ValueError(f"{where} has hidden_size {config.hidden_size}, the target {target_config.hidden_size}: an "
                         "EAGLE-3 head reads the target's features")
    files = safetensors_files(path)
    names = set(head_tensor_names(files))
    if "midlayer.self_attn.q_proj.weight" not in names or "d2t" not in names:
        raise ValueError(f"{where} is not an EAGLE-3 head (no midlayer.* or d2t tensors); an EAGLE-1 head is "
                         "method eagle")
    draft_vocab_size = int(raw.get("draft_vocab_size") or config.vocab_size)
    with torch.device("meta"):
        head = Eagle3Head(dataclasses.replace(config, vocab_size=target_config.vocab_size), draft_vocab_size,
                          attention_backend, own_embedding="embed_tokens.weight" in names)
    head = head.to(dtype=resolve_dtype(dtype, config)).to_empty(device=torch.device(device))
    head.d2t = torch.zeros(draft_vocab_size, dtype=torch.long, device=torch.device(device))
    with torch.no_grad():
        loaded = head.load_weights(iterate_weights(files))
    missing = sorted(head.expected_weight_keys() - loaded)
    if missing:
        raise ValueError(f"{where} is missing {len(missing)} weight(s), e.g. {missing[:5]}")
    if int((torch.arange(draft_vocab_size, device=head.d2t.device) + head.d2t).max()) >= target_config.vocab_size:
        raise ValueError(f"{where}: its d2t maps draft ids past the target's vocabulary of {target_config.vocab_size}")
    return head.eval().requires_grad_(False)


def make_eagle3_head(target: str | Path, path: str | Path, *, draft_vocab_size: int, seed: int = 0) -> Path:
    """A random EAGLE-3 head for the target checkpoint ``target``, written to ``path``: draft id i is target id 2 i
    (d2t[i] = i), so every draft it makes is an even id (for tests and tools that make heads)."""
    from engine.models.eagle import write_eagle_head

    config = json.loads((Path(target) / "config.json").read_text())
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or hidden // heads
    intermediate = config["intermediate_size"]
    if 2 * draft_vocab_size > config["vocab_size"]:
        raise ValueError(f"draft_vocab_size {draft_vocab_size} maps past the target's {config['vocab_size']} ids")
    generator = torch.Generator().manual_seed(seed)

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.05

    layer = "midlayer."
    tensors = {
        "fc.weight": random(hidden, 3 * hidden), "norm.weight": torch.ones(hidden),
        "lm_head.weight": random(draft_vocab_size, hidden), "d2t": torch.arange(draft_vocab_size),
        "t2d": torch.zeros(config["vocab_size"], dtype=torch.bool),
        layer + "input_layernorm.weight": torch.ones(hidden), layer + "hidden_norm.weight": torch.ones(hidden),
        layer + "self_attn.q_proj.weight": random(heads * head_dim, 2 * hidden),
        layer + "self_attn.k_proj.weight": random(kv_heads * head_dim, 2 * hidden),
        layer + "self_attn.v_proj.weight": random(kv_heads * head_dim, 2 * hidden),
        layer + "self_attn.o_proj.weight": random(hidden, heads * head_dim),
        layer + "post_attention_layernorm.weight": torch.ones(hidden),
        layer + "mlp.gate_proj.weight": random(intermediate, hidden),
        layer + "mlp.up_proj.weight": random(intermediate, hidden),
        layer + "mlp.down_proj.weight": random(hidden, intermediate),
    }
    path = write_eagle_head(path, config, tensors)
    written = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**written, "architectures": ["LlamaForCausalLMEagle3"],
                                                  "draft_vocab_size": draft_vocab_size}, indent=2))
    return path

