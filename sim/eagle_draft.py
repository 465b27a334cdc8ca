"""EAGLE and EAGLE-3 draft heads as speculative-decoding proposers (vLLM's ``method: eagle`` and ``eagle3``, the
proposers most production deployments of Llama, Qwen and gpt-oss run).

An EAGLE head is one dense decoder layer (Llama's: attention and a gated MLP) at the target's width, fed the
target's hidden state of the previous position beside the next token's embedding (projected back to the width by a
small ``fc``). EAGLE-1 heads look tokens up in the target's embedding and score drafts with the target's lm_head, so
they hold no vocabulary of their own; EAGLE-3 heads fuse three of the target's layers' hidden states (``fc``: 3 x
hidden -> hidden) and score drafts over a draft vocabulary of their own (32,000 tokens for the heads published for
Llama 3 and Qwen3, mapped back to the target's ids), still with the target's embedding. vLLM runs the head as the
draft: the first pass over the step's tokens (filling its one layer's KV cache, giving each request its first
draft), each later pass over each request's last draft, and every block of the KV pool holds the head's layer too.

The simulator prices the head as a one-layer draft model (``sim/speculation.py``) of that shape: the target's
hidden width, attention heads, KV heads and head width, its MLP width (``intermediate_size``; for a mixture of
experts, the config's dense figure), in the target's dtype, unquantized (heads are published in 16 bits), without
sliding windows or latent attention. Its scoring reads and multiplies an lm_head of the target's vocabulary
(``eagle``) or of ``draft_vocab_size`` (``eagle3``); its weights on the GPU are the layer (and EAGLE-3's own
lm_head). Left out: ``fc`` (one row per token of 2-3 x hidden -> hidden, as MTP's ``eh_proj`` is left out) and
EAGLE-3's wider attention input (its q, k and v projections read 2 x hidden).
"""

from __future__ import annotations

from dataclasses import replace

from sim.model_shapes import ModelShape

# The draft vocabulary of the EAGLE-3 heads published for Llama 3.x and Qwen3 (their config's draft_vocab_size).
EAGLE3_DRAFT_VOCAB_SIZE = 32000
EAGLE_METHODS = ("eagle", "eagle3")


def eagle_draft_shape(model: ModelShape, method: str, draft_vocab_size: int | None = None,
                      head_config: dict | None = None) -> ModelShape:
    """The EAGLE (``method`` eagle) or EAGLE-3 (eagle3) head of ``model`` as a one-layer draft model. ``head_config``:
    the head checkpoint's config.json, when a workload names it (``draft_model``): its heads, head width, MLP width
    and draft vocabulary then replace those taken from the target's shape."""
    if method not in EAGLE_METHODS:
        raise ValueError(f"method must be one of {', '.join(EAGLE_METHODS)}, got {method!r}")
    eagle3 = method == "eagle3"
    head_config = head_config or {}
    if head_config.get("hidden_size", model.hidden_size) != model.hidden_size:
        raise ValueError(f"draft_model: the head's hidden_size {head_config['hidden_size']} is not the target's "
                         f"{model.hidden_size} (an EAGLE head reads the target's features)")
    draft_vocab_size = draft_vocab_size or head_config.get("draft_vocab_size")
    vocab_size = (draft_vocab_size or EAGLE3_DRAFT_VOCAB_SIZE) if eagle3 else model.vocab_size
    heads = head_config.get("num_attention_heads", model.num_attention_heads)
    if head_config.get("head_dim"):
        head_dim = head_config["head_dim"]
    elif "num_attention_heads" in head_config or model.is_mla:
        # Split the width among the heads (latent attention's head_dim is its query-key width, not the head's).
        head_dim = model.hidden_size // heads
    else:
        head_dim = model.head_dim
    return replace(
        model, name=f"{model.name} {'EAGLE-3' if eagle3 else 'EAGLE'} head", num_layers=1, head_dim=head_dim,
        num_attention_heads=heads, num_kv_heads=head_config.get("num_key_value_heads", heads if head_config
                                                                 else model.num_kv_heads),
        intermediate_size=head_config.get("intermediate_size", model.intermediate_size),
        vocab_size=min(vocab_size, model.vocab_size), tied_embeddings=not eagle3, embeddings_from_target=True,
        qkv_bias=False, num_experts=0, num_experts_per_token=0, moe_intermediate_size=0,
        shared_expert_intermediate_size=0, num_dense_layers=0, sliding_window=None, num_sliding_layers=None,
        kv_lora_rank=0, q_lora_rank=0, qk_rope_head_dim=0, v_head_dim=0, num_mtp_layers=0, stored_quantization=None,
        attention_chunk_size=None, num_chunked_layers=None)
