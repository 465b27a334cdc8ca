"""Multi-head latent attention (MLA: DeepSeek-V2, DeepSeek-V3/R1, Kimi K2), as far as a model's shape goes.

Ordinary attention caches every KV head's key and value for every token. MLA caches one compressed latent per
token and layer instead: ``kv_lora_rank`` numbers (512 for DeepSeek-V3) plus one rotary key of
``qk_rope_head_dim`` (64) that every head shares, 576 numbers against 2 x 128 heads x 128 = 32,768 for the same
heads uncompressed. A layer's projections:

* queries: ``q_a_proj`` (hidden -> ``q_lora_rank``), a norm, ``q_b_proj`` (-> heads x ``head_dim``); with
  ``q_lora_rank`` 0 one ``q_proj`` (hidden -> heads x head_dim). A head's query and key are ``head_dim`` wide:
  ``head_dim - qk_rope_head_dim`` unrotated numbers (``qk_nope_head_dim``) and the rotary ones.
* the latent: ``kv_a_proj_with_mqa`` (hidden -> kv_lora_rank + qk_rope_head_dim), a norm on the latent part.
* ``kv_b_proj`` (kv_lora_rank -> heads x (qk_nope_head_dim + ``v_head_dim``)) turns the latent into each head's
  unrotated key and value; ``o_proj`` (heads x v_head_dim -> hidden).

Under tensor parallelism vLLM splits the heads (q_b_proj, kv_b_proj, o_proj) and copies the rest: the two
down-projections and the latent cache are whole on every GPU (there is one latent per token, not one per head),
so a GPU's KV cache per token does not shrink with more GPUs as grouped-query attention's does.
``sim/cost_models/attention_work.py`` counts the two ways vLLM computes it (decodes in the latent space,
prefills with the keys and values decompressed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the shape imports this module
    from sim.model_shapes import ModelShape

_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim")


def check_latent_attention(shape: ModelShape) -> None:
    """Refuse, naming the field, latent-attention figures that describe no model: all four 0 (ordinary
    attention) or a latent with a rotary part narrower than ``head_dim`` and a value width."""
    for name in _FIELDS:
        value = getattr(shape, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"model.{name} must be an integer >= 0, got {value!r}")
    if shape.kv_lora_rank == 0:
        for name in _FIELDS[1:]:
            if getattr(shape, name):
                raise ValueError(f"model.{name} is {getattr(shape, name)}, but model.kv_lora_rank is 0 (ordinary "
                                 "attention); set kv_lora_rank for multi-head latent attention")
        return
    if not 1 <= shape.qk_rope_head_dim < shape.head_dim:
        raise ValueError(f"model.qk_rope_head_dim must be 1..head_dim - 1 ({shape.head_dim - 1}) with multi-head "
                         f"latent attention (head_dim is the rotary and unrotated parts together), got "
                         f"{shape.qk_rope_head_dim}")
    if shape.v_head_dim < 1:
        raise ValueError(f"model.v_head_dim must be a positive integer with multi-head latent attention, got "
                         f"{shape.v_head_dim}")
    if shape.sliding_window is not None:
        raise ValueError(f"model.sliding_window is {shape.sliding_window}, but sliding windows with multi-head latent "
                         "attention (kv_lora_rank) describe no published model and are not modelled")
    if shape.qkv_bias:
        raise ValueError("model.qkv_bias: multi-head latent attention's projections have no biases in the modelled "
                         "models; set qkv_bias false")


def latent_kv_width(shape: ModelShape) -> int:
    """Numbers one token's latent holds in one layer's cache: the compressed latent and the shared rotary key."""
    return shape.kv_lora_rank + shape.qk_rope_head_dim


def latent_attention_projection_parameters(shape: ModelShape) -> int:
    """Weights of one layer's latent-attention projections (for a tensor-parallel shard: its heads' share of
    q_b_proj, kv_b_proj and o_proj, with the down-projections whole, as vLLM holds them)."""
    h, heads = shape.hidden_size, shape.num_attention_heads
    if shape.q_lora_rank:
        query = h * shape.q_lora_rank + shape.q_lora_rank * heads * shape.head_dim
    else:
        query = h * heads * shape.head_dim
    latent = h * latent_kv_width(shape)
    up = shape.kv_lora_rank * heads * (shape.head_dim - shape.qk_rope_head_dim + shape.v_head_dim)
    output = heads * shape.v_head_dim * h
    return query + latent + up + output


def latent_attention_norm_parameters(shape: ModelShape) -> int:
    """The norms on the query's low-rank and the latent (q_a_layernorm, kv_a_layernorm)."""
    return shape.q_lora_rank + shape.kv_lora_rank
