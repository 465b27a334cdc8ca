"""The Llama architecture written for paged attention (Llama 2/3; Qwen2, Qwen3 and Mistral reuse it).

A layer may attend a sliding window instead of the whole context (Mistral's ``sliding_window``, Qwen2's and
Qwen3's sliding layers: ``ModelConfig.layer_sliding_windows``); the attention backend applies it.

The forward pass works on a flat batch of tokens, not on [batch, seq] tensors: ``input_ids`` and
``positions`` are [num_tokens], and which request a token belongs to, and which cached keys it may see,
is described entirely by the attention metadata. q/k/v and gate/up are fused into single matmuls; the
loader splits a checkpoint's separate projections into the fused weights (see ``load_weights``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.config import ModelConfig
from engine.models.layers import RMSNorm, SwiGLUMLP
from engine.models.rotary_embedding import RotaryEmbedding, rotate_pairs
from engine.runner.attention import AttentionBackend, AttentionMetadata, KVCache, get_attention_backend


class LlamaAttention(nn.Module):
    # RoPE on interleaved pairs (features 2i and 2i+1 together: Cohere, GLM-4, ERNIE 4.5, Llama 4) rather than halves.
    interleaved_rope = False
    # The per-head q/k norms after RoPE (Hunyuan) rather than before it (Qwen3).
    qk_norm_after_rope = False

    def __init__(self, config: ModelConfig, backend: AttentionBackend, qkv_bias: bool, o_proj_bias: bool,
                 qk_norm: bool = False, sliding_window: int | None = None,
                 logits_soft_cap: float | None = None) -> None:
        super().__init__()
        self.sliding_window = sliding_window  # this layer's window (AttentionBackend.forward); None: full context
        self.logits_soft_cap = logits_soft_cap  # a tanh cap on attention scores (Gemma 2); None: none
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim ** -0.5
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=qkv_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=o_proj_bias)
        # Qwen3: an RMSNorm over each head's head_dim features of q and of k, before RoPE.
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if qk_norm else None
        # gpt-oss's attention sinks, one logit per head (gpt_oss.py makes them a parameter); None: none.
        self.sinks: nn.Parameter | None = None
        # False for a layer without RoPE (ModelConfig.layer_uses_rope): its keys and queries carry no position.
        self.use_rope = True
        self.backend = backend

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """RoPE on [num_tokens, heads, head_dim]: rotate-half pairs, or interleaved ones (``interleaved_rope``)."""
        return rotate_pairs(x, cos, sin) if self.interleaved_rope else RotaryEmbedding.apply(x, cos, sin)

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        num_tokens = hidden_states.shape[0]
        q, k, v = self.qkv_proj(hidden_states).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and not self.qk_norm_after_rope:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.use_rope:
            q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        if self.q_norm is not None and self.qk_norm_after_rope:
            q, k = self.q_norm(q), self.k_norm(k)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        out = self.backend.forward(q, k, v, kv_cache, attn_metadata, self.scale, self.sliding_window,
                                   self.logits_soft_cap, self.sinks)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend, qkv_bias: bool, o_proj_bias: bool,
                 mlp: nn.Module, qk_norm: bool = False, sliding_window: int | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, backend, qkv_bias, o_proj_bias, qk_norm, sliding_window)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = mlp  # [T, hidden] -> [T, hidden]: SwiGLU, or a mixture of experts (moe.py)

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        hidden_states = hidden_states + self.self_attn(self.input_layernorm(hidden_states), cos, sin, kv_cache,
                                                       attn_metadata)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class LlamaModel(nn.Module):
    # Layers whose input (the residual stream entering them) the forward keeps in ``aux_hidden_states``, for an
    # EAGLE-3 head (engine/models/eagle3.py); empty: none kept.
    aux_hidden_state_layers: tuple[int, ...] = ()

    def __init__(self, config: ModelConfig, backend: AttentionBackend, qkv_bias: bool, o_proj_bias: bool,
                 make_mlp: Callable[[int], nn.Module], qk_norm: bool = False,
                 make_layer: Callable[[int], nn.Module] | None = None) -> None:
        """``make_layer``: layer ``index`` of a family whose blocks differ from Llama's (OLMo 2, GLM-4, EXAONE 4: the
        embedding, final norm, RoPE and forward stay Llama's), or None for Llama's layer there."""
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)

        def layer(index: int) -> nn.Module:
            own = make_layer(index) if make_layer is not None else None
            return own if own is not None else LlamaDecoderLayer(config, backend, qkv_bias, o_proj_bias, make_mlp(index),
                                                                 qk_norm, config.layer_sliding_windows[index])
        self.layers = nn.ModuleList(layer(index) for index in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.rotary_dim, config.rope_theta, config.rope_scaling)
        for layer, uses_rope in zip(self.layers, config.layer_uses_rope):
            layer.self_attn.use_rope = uses_rope

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: Sequence[KVCache],
                attn_metadata: AttentionMetadata, inputs_embeds: torch.Tensor | None = None,
                deepstack: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``inputs_embeds``: the step's token embeddings with images' encoder outputs in their placeholders' rows
        (engine/runner/encoder_outputs.py); None: ``input_ids``' embeddings. ``deepstack``: (rows, [levels, rows,
        hidden]) Qwen3-VL's DeepStack, level i added to those rows' hidden states after layer i."""
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"got {len(kv_caches)} kv caches for {len(self.layers)} layers")
        hidden_states = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        # One cos/sin per step, shared by every layer.
        cos, sin = self.rotary_emb.cos_sin(positions, hidden_states.dtype)
        keep, entering = self.aux_hidden_state_layers, {}  # empty unless an EAGLE-3 head is loaded
        for index, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            if keep and index in keep:
                entering[index] = hidden_states
            hidden_states = layer(hidden_states, cos, sin, kv_cache, attn_metadata)
            if deepstack is not None and index < deepstack[1].shape[0]:
                rows, levels = deepstack
                hidden_states = hidden_states.index_add(0, rows, levels[index].to(hidden_states.dtype))
        if keep:  # in the order asked (a layer may be asked twice)
            self.aux_hidden_states = [entering[index] for index in keep]
        return self.norm(hidden_states)


class LlamaForCausalLM(nn.Module):
    # Checkpoint projection name -> (our fused parameter, shard id); shard ids select rows in _shard_view.
    stacked_params = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", "gate"),
        "up_proj": ("gate_up_proj", "up"),
    }

    # Why a decode step of this model cannot be captured in a CUDA graph; None: it can (decode_graphs.py).
    cuda_graph_unsafe_reason: str | None = None
    # Whether q and k are RMS-normalized per head before RoPE (Qwen3's q_norm and k_norm).
    qk_norm: bool = False
    # Given to every layer's attention (LlamaAttention's switches of the same names): RoPE on interleaved pairs
    # (ERNIE 4.5), the per-head q/k norms after RoPE (Hunyuan).
    interleaved_rope: bool = False
    qk_norm_after_rope: bool = False
    # Attention backends that cannot run this model -> what of it they cannot run (DeepSeek's latent attention,
    # gpt-oss's sinks); they are refused by name (get_attention_backend) and never chosen by default.
    unsupported_attention_backends: dict[str, str] = {}
    # Parameters (by name suffix) kept in float32 whatever the model's dtype (DeepSeek's router); the loader
    # allocates them so.
    float32_parameters: tuple[str, ...] = ()

    def __init__(self, config: ModelConfig, attention_backend: str | AttentionBackend = "torch") -> None:
        super().__init__()
        self.check_config(config)
        self.config = config
        backend = get_attention_backend(attention_backend, self.unsupported_attention_backends)
        self.model = LlamaModel(config, backend, *self.attention_biases(config),
                                make_mlp=lambda layer_index: self.make_mlp(config, layer_index),
                                qk_norm=self.qk_norm,
                                make_layer=lambda layer_index: self.make_layer(config, backend, layer_index))
        if self.interleaved_rope or self.qk_norm_after_rope:
            for layer in self.model.layers:
                layer.self_attn.interleaved_rope = self.interleaved_rope or layer.self_attn.interleaved_rope
                layer.self_attn.qk_norm_after_rope = self.qk_norm_after_rope
        # Tied checkpoints reuse the embedding matrix as the output projection; no separate parameter
        # exists then, so nothing can untie them by accident.
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size,
                                                                          bias=False)

    @classmethod
    def attention_biases(cls, config: ModelConfig) -> tuple[bool, bool]:
        """(bias on q/k/v, bias on o_proj): Llama's ``attention_bias`` switches both."""
        return config.attention_bias, config.attention_bias

    def make_layer(self, config: ModelConfig, backend: AttentionBackend, layer_index: int) -> nn.Module | None:
        """Layer ``layer_index`` of a family whose blocks differ from Llama's (LlamaModel's ``make_layer``); None:
        Llama's."""
        return None

    @classmethod
    def make_mlp(cls, config: ModelConfig, layer_index: int) -> nn.Module:
        """The MLP of layer ``layer_index`` (mixture-of-experts models choose per layer)."""
        return SwiGLUMLP(config.hidden_size, config.intermediate_size, config.mlp_bias, config.hidden_act)

    @classmethod
    def check_config(cls, config: ModelConfig) -> None:
        """Raise if the config asks for something this implementation cannot do exactly."""

    @property
    def max_model_len_limit(self) -> int:
        """The longest sequence this implementation computes exactly (``ModelConfig.max_model_len_limit``)."""
        return self.config.max_model_len_limit

    def fit_context(self, max_model_len: int) -> None:
        """Tell every RoPE the engine's ``max_model_len`` before the first step (LongRoPE chooses its factors by
        it; long_rope.py)."""
        for module in self.modules():
            if isinstance(module, RotaryEmbedding):
                module.fit_context(max_model_len)

    @property
    def attention_backend(self) -> AttentionBackend:
        return self.model.layers[0].self_attn.backend

    def set_attention_backend(self, attention_backend: str | AttentionBackend) -> None:
        backend = get_attention_backend(attention_backend, self.unsupported_attention_backends)
        for layer in self.model.layers:
            layer.self_attn.backend = backend

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: Sequence[KVCache],
                attn_metadata: AttentionMetadata, inputs_embeds: torch.Tensor | None = None,
                deepstack: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """input_ids, positions [num_tokens] -> final hidden states [num_tokens, hidden_size]; ``inputs_embeds``
        [num_tokens, hidden_size] stand in for input_ids' embeddings (a step that fills images' placeholders);
        ``deepstack``: LlamaModel.forward's."""
        if inputs_embeds is None:
            return self.model(input_ids, positions, kv_caches, attn_metadata)
        if deepstack is None:
            return self.model(input_ids, positions, kv_caches, attn_metadata, inputs_embeds=inputs_embeds)
        return self.model(input_ids, positions, kv_caches, attn_metadata, inputs_embeds=inputs_embeds,
                          deepstack=deepstack)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The token embeddings the decoder's first layer reads (what images' encoder outputs replace)."""
        return self.model.embed_tokens(input_ids)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[N, hidden_size] -> [N, vocab_size]; the runner selects each request's last token first."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden_states, weight)

    # ---- weight loading -------------------------------------------------------------------------

    def _shard_view(self, target: str, destination: torch.Tensor, shard: str) -> torch.Tensor:
        """The part of fused parameter ``target`` that checkpoint shard ``shard`` fills."""
        if target.rsplit(".", 2)[-2] == "qkv_proj":
            attn = self.model.layers[0].self_attn
            offsets = {"q": (0, attn.q_size), "k": (attn.q_size, attn.kv_size),
                       "v": (attn.q_size + attn.kv_size, attn.kv_size)}
            start, size = offsets[shard]
            return destination[start:start + size]
        return gate_or_up_rows(destination, shard)

    def _map_weight_name(self, name: str) -> tuple[str, str | None]:
        """A checkpoint name -> (our parameter name, fused shard id or None)."""
        for projection, (fused, shard) in self.stacked_params.items():
            if f".{projection}." in name:
                return name.replace(f".{projection}.", f".{fused}."), shard
        return name, None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors (HF names) into our parameters; returns the keys filled.

        A fused parameter is filled shard by shard and reported as ``name#shard`` for each; compare
        with ``expected_weight_keys()`` to detect missing tensors. Names we have no parameter for are
        collected in ``self.unexpected_weights``.
        """
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        self.unexpected_weights: list[str] = []
        stored_head = None
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue  # derived from the config; some old checkpoints store it
            if name == "lm_head.weight" and self.lm_head is None:
                stored_head = tensor  # tied: usually a copy of the embedding, checked below
                continue
            target, shard = self._map_weight_name(name)
            if target not in params:
                self.unexpected_weights.append(name)
                continue
            destination = params[target].data
            if shard is not None:
                destination = self._shard_view(target, destination, shard)
            _copy_checked(destination, tensor, name)
            loaded.add(target if shard is None else f"{target}#{shard}")
        if stored_head is not None:
            embedding = params["model.embed_tokens.weight"].data
            if stored_head.shape != embedding.shape or not torch.equal(stored_head.to(embedding.dtype), embedding):
                # transformers then unties them and uses the stored head; tying would be another model.
                raise ValueError("config.json has tie_word_embeddings=true, but the checkpoint's lm_head.weight "
                                 "differs from model.embed_tokens.weight (transformers would use it untied); set "
                                 "tie_word_embeddings to false in config.json to load it as a separate head")
        return loaded

    def checkpoint_name(self, key: str) -> str:
        """The checkpoint's own tensor name for a key of ``expected_weight_keys`` ("...qkv_proj.weight#k"
        -> "...k_proj.weight"), for messages about missing tensors."""
        target, _, shard = key.partition("#")
        if not shard:
            return target
        for projection, (fused, fused_shard) in self.stacked_params.items():
            if fused_shard == shard and f".{fused}." in target:
                return target.replace(f".{fused}.", f".{projection}.")
        return key

    def expected_weight_keys(self) -> set[str]:
        """The keys ``load_weights`` reports once every parameter (and every fused shard) is filled."""
        return expected_fused_weight_keys(self)


def expected_fused_weight_keys(module: nn.Module) -> set[str]:
    """Every parameter of ``module`` by name, a fused one once per checkpoint tensor it is filled from (``name#q``,
    ``name#k``, ``name#v``; ``name#gate``, ``name#up``): what a loader reports once everything was read."""
    expected = set()
    for name, _ in module.named_parameters():
        if "qkv_proj." in name:
            expected.update(f"{name}#{shard}" for shard in ("q", "k", "v"))
        elif "gate_up_proj." in name:
            expected.update(f"{name}#{shard}" for shard in ("gate", "up"))
        else:
            expected.add(name)
    return expected


def gate_or_up_rows(gate_up: torch.Tensor, shard: str) -> torch.Tensor:
    """The gate (first half of the rows) or up (second half) of a fused [2 * intermediate, ...] weight."""
    size = gate_up.shape[0] // 2
    return gate_up[:size] if shard == "gate" else gate_up[size:]


def _copy_checked(destination: torch.Tensor, source: torch.Tensor, name: str) -> None:
    if destination.shape != source.shape:
        raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(source.shape)}, the model expects "
                         f"{tuple(destination.shape)}; does config.json match the weights?")
    with torch.no_grad():
        destination.copy_(source)
