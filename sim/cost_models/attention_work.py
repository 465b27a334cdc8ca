"""One layer's attention in counts (projection widths, FLOPs, bytes), for the two kinds of attention the
simulator models; the analytical cost model (analytical.py) turns them into seconds and step_physics.py into a
step's totals, so both read one description.

Grouped-query attention (Llama, Qwen, Mistral, Gemma): a fused QKV projection, RoPE on q and k, the new K and V
written to the paged cache, attention over the cached K and V, the output projection.

Multi-head latent attention (DeepSeek-V2/V3, Kimi K2; sim/latent_attention.py has the shapes) caches one
latent of ``kv_lora_rank + qk_rope_head_dim`` numbers per token and layer, and vLLM computes it two ways:

* decode (and the verification of drafts): in the latent space. Each head's unrotated query is multiplied into
  the latent's space by ``kv_b_proj``'s key half (W_UK), attention scores the query against the cached latent
  and rotary key (``kv_lora_rank + qk_rope_head_dim`` wide, one "KV head" that every query head reads), its
  output is a latent that ``kv_b_proj``'s value half (W_UV) takes to ``v_head_dim``. The two products cost one
  pass of ``kv_b_proj`` per query row, and the cache is read once for all heads: with 128 heads on one GPU,
  about 240 FLOPs per byte read, compute-bound on an H100 where grouped-query decode is bound by bytes.
* prefill: with the keys and values decompressed. ``kv_b_proj`` turns the latent of every token the chunk
  attends to (its own and, for a chunk after a cached context, every earlier one: vLLM up-projects the context
  again at each chunk) into ``heads x (qk_nope_head_dim + v_head_dim)``, then ordinary attention runs with
  ``head_dim``-wide queries and keys and ``v_head_dim``-wide values.

Counts are for one GPU's shard (``ModelShape.shard``): latent attention's heads are split, its latent and
down-projections are whole on every GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.latent_attention import latent_kv_width
from sim.model_shapes import ModelShape

# The attention kernels of a grouped-query layer: QKV, RoPE, KV-cache write, attention, O.
GROUPED_QUERY_KERNELS = 5


@dataclass(frozen=True, slots=True)
class Projection:
    name: str
    in_features: int
    out_features: int

    @property
    def parameters(self) -> int:
        return self.in_features * self.out_features


@dataclass(frozen=True, slots=True)
class AttentionWork:
    """One layer's attention on one GPU. ``projections`` run on every scheduled token; ``context_projection``
    (latent attention's ``kv_b_proj``) also on every cached token a prefill chunk attends to. A decode's pair is a
    (query row, cached token) it scores; a prefill's, a (query, key) under the causal mask."""
    projections: tuple[Projection, ...]
    context_projection: Projection | None
    elementwise_bytes_per_token: dict[str, int]
    decode_flops_per_pair: int
    kv_bytes_per_cached_token: int      # what attention reads of the cache per token it attends to
    decode_bytes_per_request: int       # the query read, the output written
    prefill_flops_per_pair: int
    prefill_bytes_per_context_token: int
    prefill_bytes_per_token: int
    kernels: int


def attention_work(shard: ModelShape, element_bytes: int, kv_element_bytes: int) -> AttentionWork:
    """The attention of one layer of ``shard`` in the model's ``element_bytes``, its cache in ``kv_element_bytes``."""
    if shard.is_mla:
        return _latent_attention_work(shard, element_bytes, kv_element_bytes)
    q_size, kv_size, h = shard.q_size, shard.kv_size, shard.hidden_size
    kv_bytes = 2 * kv_size * kv_element_bytes
    return AttentionWork(
        projections=(Projection("qkv_proj", h, q_size + 2 * kv_size), Projection("o_proj", q_size, h)),
        context_projection=None,
        # RoPE rewrites q and k; the cache write reads the new K and V and stores them in the paged cache.
        elementwise_bytes_per_token={"rope": 2 * (q_size + kv_size) * element_bytes,
                                     "kv_cache_write": 2 * kv_size * (element_bytes + kv_element_bytes)},
        decode_flops_per_pair=4 * q_size,  # QK^T and PV: 2 FLOPs per multiply-add, head_dim per head
        kv_bytes_per_cached_token=kv_bytes,
        decode_bytes_per_request=2 * q_size * element_bytes,
        prefill_flops_per_pair=4 * q_size,
        prefill_bytes_per_context_token=kv_bytes,
        prefill_bytes_per_token=2 * q_size * element_bytes + 2 * kv_size * kv_element_bytes,
        kernels=GROUPED_QUERY_KERNELS)


def _latent_attention_work(shard: ModelShape, element_bytes: int, kv_element_bytes: int) -> AttentionWork:
    h, heads = shard.hidden_size, shard.num_attention_heads
    rank, rope, value = shard.kv_lora_rank, shard.qk_rope_head_dim, shard.v_head_dim
    latent = latent_kv_width(shard)
    qk = shard.head_dim  # a head's query and key: unrotated and rotary parts
    if shard.q_lora_rank:
        # vLLM fuses the two down-projections (q_a_proj, kv_a_proj_with_mqa) into one replicated GEMM.
        projections = (Projection("fused_qkv_a_proj", h, shard.q_lora_rank + latent),
                       Projection("q_b_proj", shard.q_lora_rank, heads * qk))
        norms = {"q_a_layernorm": 2 * shard.q_lora_rank * element_bytes}
    else:
        projections = (Projection("q_proj", h, heads * qk), Projection("kv_a_proj_with_mqa", h, latent))
        norms = {}
    norms["kv_a_layernorm"] = 2 * rank * element_bytes
    return AttentionWork(
        projections=projections + (Projection("o_proj", heads * value, h),),
        context_projection=Projection("kv_b_proj", rank, heads * (qk - rope + value)),
        elementwise_bytes_per_token={
            **norms,
            "rope": 2 * (heads + 1) * rope * element_bytes,  # every head's rotary query part, the one rotary key
            "kv_cache_write": latent * (element_bytes + kv_element_bytes)},
        # In the latent space: scores over the latent and rotary key, the output a latent per head.
        decode_flops_per_pair=2 * heads * (latent + rank),
        kv_bytes_per_cached_token=latent * kv_element_bytes,
        decode_bytes_per_request=heads * (latent + rank) * element_bytes,
        # Decompressed: qk-wide scores, value-wide outputs, every head its own keys and values.
        prefill_flops_per_pair=2 * heads * (qk + value),
        prefill_bytes_per_context_token=latent * kv_element_bytes + heads * (qk + value) * element_bytes,
        prefill_bytes_per_token=heads * (2 * qk + 2 * value) * element_bytes,
        # Beyond grouped-query attention's five: the latent's norm, W_UK and W_UV around the attention (kv_b_proj
        # in a prefill), a second projection before it (q_b_proj, or kv_a beside q_proj), the query rank's norm.
        kernels=GROUPED_QUERY_KERNELS + 4 + (1 if shard.q_lora_rank else 0))
