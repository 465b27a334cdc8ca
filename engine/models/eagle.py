"""An EAGLE draft head for a Llama-family target (vLLM's ``speculative_config={"method": "eagle", "model": ...}``).

EAGLE (Li et al., 2024) drafts from the target's own features: at position p it reads the target's final hidden state
there (after the final norm: what the target's lm_head reads) beside the embedding of the token at p + 1, fuses the two
with a linear ``fc`` (2 x hidden -> hidden), runs one Llama decoder layer over the result and scores it with the
target's lm_head: a guess at the token at p + 2. Its own output then stands in for the target's feature when it drafts
further ahead. The layer has its own KV cache, in the target's block layout (engine/runner/spec_decode/eagle.py).

Checkpoint (the published EAGLE heads', e.g. yuhuili/EAGLE-LLaMA3-Instruct-8B, in safetensors): a Llama config.json
with one hidden layer, and tensors ``fc.weight`` (and ``fc.bias``), ``layers.0.*``, optionally ``embed_tokens.weight``
(else the target's embedding is used, as vLLM shares it). The first layer's ``input_layernorm`` is left out by EAGLE
(the fused features go straight into attention); a head that has one uses it. No final norm, no lm_head: the target's.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import nn

from engine.models.config import ModelConfig
from engine.models.llama import LlamaForCausalLM
from engine.models.loader import iterate_weights, resolve_dtype, safetensors_files
from engine.runner.attention import AttentionBackend


class EagleHead(LlamaForCausalLM):
    def __init__(self, config: ModelConfig, attention_backend: str | AttentionBackend = "torch", *,
                 fc_bias: bool = True, input_norm: bool = False, own_embedding: bool = True) -> None:
        # Tied: no lm_head parameter of its own (the target's scores its drafts).
        super().__init__(dataclasses.replace(config, tie_word_embeddings=True), attention_backend)
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=fc_bias)
        if not input_norm:
            self.model.layers[0].input_layernorm = nn.Identity()
        self.model.norm = nn.Identity()  # the head's features go to the target's lm_head as they are
        self.own_embedding = own_embedding
        if not own_embedding:
            self.model.embed_tokens = None  # the target's is used: no copy of its vocabulary here

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, target_hidden: torch.Tensor,
                kv_caches, attn_metadata, embed: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The head's features at ``positions``: ``input_ids`` the tokens one past them, ``target_hidden`` the
        target's (or the head's own) features at them; ``embed`` the target's embedding (used without one's own)."""
        embeds = self.model.embed_tokens(input_ids) if self.own_embedding else embed(input_ids)
        hidden = self.fc(torch.cat([embeds, target_hidden.to(embeds.dtype)], dim=-1))
        cos, sin = self.model.rotary_emb.cos_sin(positions, hidden.dtype)
        return self.model.layers[0](hidden, cos, sin, kv_caches[0], attn_metadata)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        # The head's tensors are named without the "model." prefix of a whole model's. A copy of the target's lm_head
        # that some heads carry is not read: the target's own scores the drafts.
        return super().load_weights((name if name.startswith("fc.") else f"model.{name}", tensor)
                                    for name, tensor in weights if name != "lm_head.weight")


def load_eagle_head(path: str | Path, dtype: torch.dtype | str | None, device: torch.device | str, *,
                    attention_backend: str | AttentionBackend, target_config: ModelConfig) -> EagleHead:
    """The head in ``path`` in eval mode; a ValueError naming what does not fit the target."""
    config = ModelConfig.from_pretrained(path)
    where = f"speculative_config.model {str(path)!r}"
    if config.num_hidden_layers != 1:
        raise ValueError(f"{where} is not an EAGLE head: it has {config.num_hidden_layers} layers (an EAGLE head has "
                         "one); for a smaller model of the same vocabulary use method draft_model")
    if config.hidden_size != target_config.hidden_size:
        raise ValueError(f"{where} has hidden_size {config.hidden_size}, the target {target_config.hidden_size}: an "
                         "EAGLE head reads the target's features")
    files = safetensors_files(path)
    names = set(head_tensor_names(files))
    if "fc.weight" not in names:
        raise ValueError(f"{where} has no fc.weight: not an EAGLE head (EAGLE-3 heads, with midlayer.* tensors, are "
                         "not supported)")
    own_embedding = "embed_tokens.weight" in names
    if own_embedding and config.vocab_size != target_config.vocab_size:
        raise ValueError(f"{where} has vocab_size {config.vocab_size}, the target {target_config.vocab_size}")
    with torch.device("meta"):
        head = EagleHead(config, attention_backend, fc_bias="fc.bias" in names,
                         input_norm="layers.0.input_layernorm.weight" in names, own_embedding=own_embedding)
    head = head.to(dtype=resolve_dtype(dtype, config)).to_empty(device=torch.device(device))
    loaded = head.load_weights(iterate_weights(files))
    missing = sorted(head.expected_weight_keys() - loaded)
    if missing:
        raise ValueError(f"{where} is missing {len(missing)} weight(s), e.g. "
                         f"{[head.checkpoint_name(key) for key in missing[:5]]}")
    return head.eval().requires_grad_(False)


def head_tensor_names(files: list[Path]) -> Iterable[str]:
    from safetensors import safe_open

    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as reader:
            yield from reader.keys()


def write_eagle_head(path: str | Path, target_config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    """A head checkpoint in ``path``: a one-layer Llama config.json of the target's width and ``tensors`` (for tests
    and tools that make heads)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    # A plain Llama layer whatever the target's family (the published heads for gpt-oss, Qwen3-MoE and Llama 4 are
    # Llama layers too): the target's width, heads and positions, no biases, no experts, no windows.
    kept = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "rms_norm_eps", "rope_theta", "rope_scaling", "max_position_embeddings", "vocab_size", "torch_dtype")
    config = {key: target_config[key] for key in kept if target_config.get(key) is not None}
    config.update(architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=1, attention_bias=False,
                  tie_word_embeddings=False, hidden_act="silu")
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, str(path / "model.safetensors"))
    return path


def make_eagle_head(target: str | Path, path: str | Path, *, seed: int = 0, copying: bool = False) -> Path:
    """A random EAGLE head for the target checkpoint ``target`` (its width, heads and MLP), written to ``path``.
    ``copying``: a head whose features are the target's own (fc passes the target's half through, the layer adds
    nothing), so that each draft is the last token again: drafts a greedy target accepts while it repeats a token."""
    config = json.loads((Path(target) / "config.json").read_text())
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or hidden // heads
    intermediate = config["intermediate_size"]
    generator = torch.Generator().manual_seed(seed)

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.05

    layer = "layers.0."
    tensors = {
        "fc.weight": torch.cat([torch.zeros(hidden, hidden), torch.eye(hidden)], dim=1) if copying
        else random(hidden, 2 * hidden),
        "fc.bias": torch.zeros(hidden),
        layer + "self_attn.q_proj.weight": random(heads * head_dim, hidden),
        layer + "self_attn.k_proj.weight": random(kv_heads * head_dim, hidden),
        layer + "self_attn.v_proj.weight": random(kv_heads * head_dim, hidden),
        layer + "self_attn.o_proj.weight": torch.zeros(hidden, heads * head_dim) if copying
        else random(hidden, heads * head_dim),
        layer + "mlp.gate_proj.weight": random(intermediate, hidden),
        layer + "mlp.up_proj.weight": random(intermediate, hidden),
        layer + "mlp.down_proj.weight": torch.zeros(hidden, intermediate) if copying else random(hidden, intermediate),
        layer + "post_attention_layernorm.weight": torch.ones(hidden),
    }
    return write_eagle_head(path, config, tensors)

