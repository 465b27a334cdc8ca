"""The shape of a decoder-only transformer, as far as cost and memory are concerned.

A ``ModelShape`` holds only the figures that decide how many FLOPs a step costs and how many bytes it
moves: layer count, widths, head counts, vocabulary. Weights themselves never matter to the simulator.
Shapes come from presets (``sim/model_presets.py``, copied from the models' published Hugging Face
``config.json`` files) or from a ``config.json`` on disk (``sim/hf_model_config.py``); ``resolve_model``
(in ``sim.model_presets``) turns a workload's ``model:`` into one.

``kv_cache_num_blocks`` (sim/kv_cache_capacity.py) answers from a shape how many KV-cache blocks fit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from sim.latent_attention import (check_latent_attention, latent_attention_norm_parameters,
                                  latent_attention_projection_parameters, latent_kv_width)
from sim.model_shape_checks import check_attention_span, check_experts
from sim.weight_quantization import quantized_parameters, weight_quantization

GIB = 1024**3

# Bytes per element of each dtype name the project accepts (torch's spellings and the usual short ones).
_DTYPE_BYTES = {
    "float16": 2, "fp16": 2, "half": 2,
    "bfloat16": 2, "bf16": 2,
    "float32": 4, "fp32": 4, "float": 4,
    "float8": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype``; a ValueError naming the field for an unknown name."""
    try:
        return _DTYPE_BYTES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"dtype: unknown dtype {dtype!r}; known: {', '.join(sorted(_DTYPE_BYTES))}") from None


@dataclass(frozen=True, slots=True)
class ModelShape:
    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    gated_mlp: bool = True          # SwiGLU: gate and up projections, then act(gate) * up
    tied_embeddings: bool = False   # lm_head shares the embedding matrix (no extra weights)
    qkv_bias: bool = False          # Qwen2 adds a bias to the q, k and v projections
    # Mixture of experts (Mixtral, Qwen-MoE): every layer's MLP is ``num_experts`` routed experts, each a
    # gated SwiGLU MLP of width ``moe_intermediate_size``, of which a router picks ``num_experts_per_token``
    # (top-k) per token. 0 experts: a dense model, and the other three must be 0 too. An MoE shape has no
    # dense MLP in any layer (configs where some layers are dense are refused), so its ``intermediate_size``
    # is only the config's figure and prices nothing.
    num_experts: int = 0
    num_experts_per_token: int = 0
    moe_intermediate_size: int = 0
    # Qwen2-MoE's shared expert: one more gated MLP every token runs, scaled by sigmoid(x @ gate) with a
    # [hidden, 1] gate. 0: none.
    shared_expert_intermediate_size: int = 0
    # Sliding-window layers attend only their last ``sliding_window`` keys: ``num_sliding_layers`` of them (None:
    # every layer, as Mistral-7B-v0.1's 4096), the others the full context (Gemma 3: five of six layers slide).
    # Attention reads at most the window in those layers; when every layer slides the engine also hands back
    # the KV blocks that leave a request's window. None: full attention everywhere.
    sliding_window: int | None = None
    num_sliding_layers: int | None = None
    # DeepSeek-V2/V3's mixtures of experts keep a dense MLP (``intermediate_size`` wide) in their first
    # ``num_dense_layers`` layers (the config's first_k_dense_replace) and run experts in the rest. 0: experts in
    # every layer. Only with experts.
    num_dense_layers: int = 0
    # Qwen2-MoE scales its shared expert by a sigmoid gate; DeepSeek's shared experts are added as they are.
    shared_expert_gate: bool = True
    # Multi-head latent attention (DeepSeek-V2/V3, Kimi K2; sim/latent_attention.py says what it computes):
    # keys and values are one compressed latent of ``kv_lora_rank`` per token plus a shared rotary key of
    # ``qk_rope_head_dim``, which is all the KV cache holds; each head's query and key are ``head_dim`` wide
    # (its ``head_dim - qk_rope_head_dim`` unrotated part comes from the latent) and its value ``v_head_dim``.
    # Queries go through a low-rank ``q_lora_rank`` projection first (0: one full-rank projection, as
    # DeepSeek-V2-Lite). kv_lora_rank 0: ordinary attention, and the other three must be 0.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # Multi-token-prediction layers trained beside the model (DeepSeek-V3's one; a config's
    # num_nextn_predict_layers): a speculative-decoding proposer (method mtp, sim/mtp_draft.py), not part of the
    # served model, so not counted in its parameters.
    num_mtp_layers: int = 0
    # The scheme the checkpoint's weights are stored in (its config.json's quantization_config, read by
    # sim/hf_checkpoint_quantization.py): vLLM runs them in it, and a simulation with engine.quantization null on
    # the analytical cost model prices them so. None: stored in the model's dtype.
    stored_quantization: str | None = None
    # Chunked local attention (Llama 4): ``num_chunked_layers`` layers (None: every layer) read only the keys of
    # their query's own chunk of ``attention_chunk_size`` tokens; with the hybrid KV cache (sim/kv_cache_groups.py)
    # their blocks before a request's current chunk are handed back. None: no chunked layer.
    attention_chunk_size: int | None = None
    num_chunked_layers: int | None = None
    # A speculative-decoding head that looks tokens up in the target's embedding (EAGLE's, sim/eagle_draft.py): no
    # embedding weights of its own (and none for its lm_head too when tied_embeddings says it uses the target's).
    embeddings_from_target: bool = False

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"model.{name} must be a positive integer, got {value!r}")
        check_attention_span(self)
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(f"model.num_kv_heads must divide num_attention_heads ({self.num_attention_heads}), "
                             f"got {self.num_kv_heads}")
        check_experts(self)
        check_latent_attention(self)
        if self.stored_quantization is not None:
            try:
                weight_quantization(self.stored_quantization, self)
            except ValueError as error:
                raise ValueError(str(error).replace("engine.quantization", "model.stored_quantization")) from None
        if not isinstance(self.num_mtp_layers, int) or isinstance(self.num_mtp_layers, bool) or self.num_mtp_layers < 0:
            raise ValueError(f"model.num_mtp_layers must be an integer >= 0, got {self.num_mtp_layers!r}")

    @property
    def sliding_window_fraction(self) -> float:
        """The share of layers that slide (1.0 without a window)."""
        if self.sliding_window is None or self.num_sliding_layers is None:
            return 1.0
        return self.num_sliding_layers / self.num_layers

    @property
    def attention_chunk_fraction(self) -> float:
        """The share of layers that attend within chunks (1.0 without chunks)."""
        if self.attention_chunk_size is None or self.num_chunked_layers is None:
            return 1.0
        return self.num_chunked_layers / self.num_layers

    # --- widths of the projections -------------------------------------------------------------
    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of K (or of V) for one token in one layer: grouped-query attention shrinks it."""
        return self.num_kv_heads * self.head_dim

    @property
    def mlp_up_size(self) -> int:
        """Output width of the first MLP projection (gate and up fused when the MLP is gated)."""
        return (2 if self.gated_mlp else 1) * self.intermediate_size

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (sim/latent_attention.py)."""
        return self.kv_lora_rank > 0

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is experts: all but the first ``num_dense_layers`` of a mixture of experts, none of a
        dense model."""
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def num_dense_mlp_layers(self) -> int:
        """Layers with a dense MLP of ``intermediate_size``: every layer of a dense model, DeepSeek's first few."""
        return self.num_layers - self.num_moe_layers

    # --- parameters (per layer first) ------------------------------------------------------------
    @property
    def attention_projection_parameters(self) -> int:
        """Weights of one layer's QKV and O projections (biases apart); latent attention's five projections."""
        if self.is_mla:
            return latent_attention_projection_parameters(self)
        h = self.hidden_size
        return h * (self.q_size + 2 * self.kv_size) + self.q_size * h

    @property
    def dense_mlp_parameters(self) -> int:
        """Weights of one dense MLP (gate+up, down), in the layers that have one (``num_dense_mlp_layers``)."""
        return self.hidden_size * self.mlp_up_size + self.intermediate_size * self.hidden_size

    @property
    def expert_parameters(self) -> int:
        """Weights of one routed expert: gate, up and down, each hidden x moe_intermediate_size."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def router_parameters(self) -> int:
        """One MoE layer's router: a hidden -> num_experts projection (kept in the model's dtype under fp8)."""
        return self.hidden_size * self.num_experts

    @property
    def shared_expert_parameters(self) -> int:
        """One MoE layer's shared expert (gate, up, down; DeepSeek's several as one, as vLLM fuses them), without
        Qwen2-MoE's [hidden, 1] sigmoid gate."""
        return 3 * self.hidden_size * self.shared_expert_intermediate_size

    @property
    def shared_expert_gate_parameters(self) -> int:
        return self.hidden_size if self.shared_expert_intermediate_size and self.shared_expert_gate else 0

    @property
    def moe_layer_linear_parameters(self) -> int:
        """One MoE layer's weights that fp8 quantization stores in one byte: the attention projections, every
        expert and the shared expert. Not the router nor the shared expert's gate (vLLM keeps both in the model's
        dtype), nor norms. 0 for a dense model."""
        if not self.is_moe:
            return 0
        return self.attention_projection_parameters + self.num_experts * self.expert_parameters \
            + self.shared_expert_parameters

    @property
    def dense_layer_linear_parameters(self) -> int:
        """One dense layer's weights that fp8 stores in one byte: the attention projections and the dense MLP."""
        return self.attention_projection_parameters + self.dense_mlp_parameters

    @property
    def layer_linear_parameters(self) -> int:
        """``moe_layer_linear_parameters`` for a mixture of experts (its typical layer), else the dense layer's."""
        return self.moe_layer_linear_parameters if self.is_moe else self.dense_layer_linear_parameters

    @property
    def _layer_other_parameters(self) -> int:
        """One layer's weights that fp8 leaves in the model's dtype besides an MoE layer's router and gate: norms
        (latent attention's two more) and biases."""
        bias = self.q_size + 2 * self.kv_size if self.qkv_bias else 0
        return 2 * self.hidden_size + bias + latent_attention_norm_parameters(self)

    @property
    def moe_layer_parameters(self) -> int:
        if not self.is_moe:
            return 0
        return self.moe_layer_linear_parameters + self.router_parameters + self.shared_expert_gate_parameters \
            + self._layer_other_parameters

    @property
    def dense_layer_parameters(self) -> int:
        return self.dense_layer_linear_parameters + self._layer_other_parameters

    @property
    def layer_parameters(self) -> int:
        """``moe_layer_parameters`` for a mixture of experts (its typical layer), else the dense layer's."""
        return self.moe_layer_parameters if self.is_moe else self.dense_layer_parameters

    def _layers_parameters(self, num_dense_mlp_layers: int, num_moe_layers: int) -> tuple[int, int]:
        """(linear, other) weights of that many layers of each kind."""
        linear = num_dense_mlp_layers * self.dense_layer_linear_parameters \
            + num_moe_layers * self.moe_layer_linear_parameters
        total = num_dense_mlp_layers * self.dense_layer_parameters + num_moe_layers * self.moe_layer_parameters
        return linear, total - linear

    @property
    def num_parameters(self) -> int:
        embedding = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tied_embeddings else embedding
        if self.embeddings_from_target:
            embedding = 0
        final_norm = self.hidden_size
        return embedding + sum(self._layers_parameters(self.num_dense_mlp_layers, self.num_moe_layers)) \
            + final_norm + lm_head

    @property
    def active_parameters(self) -> int:
        """What one token computes with: ``num_parameters`` less the routed experts it is not sent to
        (num_experts - num_experts_per_token per MoE layer). Equal to ``num_parameters`` for a dense model."""
        idle_experts = self.num_experts - self.num_experts_per_token
        return self.num_parameters - self.num_moe_layers * idle_experts * self.expert_parameters

    @property
    def linear_parameters(self) -> int:
        """Weights of the projections of all layers (``layer_linear_parameters`` of each): what weight quantization
        (vLLM's ``quantization: fp8``) stores in fewer bytes. Embedding, lm_head, norms, biases and routers stay."""
        return self._layers_parameters(self.num_dense_mlp_layers, self.num_moe_layers)[0]

    def weight_bytes(self, dtype: str, quantization: str | None = None) -> float:
        """Bytes of all weights in ``dtype``, those ``quantization`` covers in its bytes when given
        (sim/weight_quantization.py: fp8 every projection, mxfp4 the experts)."""
        return self._weight_bytes(dtype, quantization, self.num_dense_mlp_layers, self.num_moe_layers,
                                  self.num_parameters)

    def _weight_bytes(self, dtype: str, quantization: str | None, num_dense_mlp_layers: int, num_moe_layers: int,
                      num_parameters: int) -> float:
        scheme = weight_quantization(quantization)
        if scheme is None:
            return num_parameters * dtype_bytes(dtype)
        quantized = quantized_parameters(self, scheme, num_dense_mlp_layers, num_moe_layers)
        return (num_parameters - quantized) * dtype_bytes(dtype) + quantized * scheme.bytes_per_weight

    # --- KV cache -----------------------------------------------------------------------------
    def kv_bytes_per_token_per_layer(self, dtype: str) -> int:
        if self.is_mla:  # one latent and one rotary key per token, whatever the heads
            return latent_kv_width(self) * dtype_bytes(dtype)
        return 2 * self.kv_size * dtype_bytes(dtype)  # K and V

    def kv_bytes_per_token(self, dtype: str) -> int:
        """2 (K and V) * layers * kv_heads * head_dim * dtype bytes; latent attention's latent width * layers *
        dtype bytes (the same on every tensor-parallel GPU: the latent is copied, not split)."""
        return self.num_layers * self.kv_bytes_per_token_per_layer(dtype)

    # --- tensor parallelism -------------------------------------------------------------------
    def shard(self, tensor_parallel_size: int) -> ModelShape:
        """What one of ``tensor_parallel_size`` GPUs holds and computes, Megatron-style as vLLM shards:
        attention heads and MLP columns (every expert's too) split evenly, the vocabulary (embedding and lm_head) split in
        ceil-sized parts, the hidden width and norms whole on every GPU. KV heads split too, or, when
        there are fewer KV heads than GPUs, each GPU keeps one (vLLM replicates them).

        A ValueError names ``engine.tensor_parallel_size`` when the model cannot be split that way."""
        tp = tensor_parallel_size
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise ValueError(f"engine.tensor_parallel_size must be a positive integer, got {tp!r}")
        if tp == 1:
            return self
        problems = []
        if self.num_attention_heads % tp:
            problems.append(f"the {self.num_attention_heads} attention heads")
        if not self.is_mla and self.num_kv_heads >= tp and self.num_kv_heads % tp:  # latent attention has no KV heads
            problems.append(f"the {self.num_kv_heads} KV heads")
        if self.num_dense_mlp_layers and self.intermediate_size % tp:
            problems.append(f"the MLP width {self.intermediate_size}")
        if self.moe_intermediate_size % tp:
            problems.append(f"the expert width moe_intermediate_size {self.moe_intermediate_size}")
        if self.shared_expert_intermediate_size % tp:
            problems.append(f"the shared expert's width shared_expert_intermediate_size "
                            f"{self.shared_expert_intermediate_size}")
        if problems:
            listed = problems[0] if len(problems) == 1 else f"{', '.join(problems[:-1])} or {problems[-1]}"
            raise ValueError(f"engine.tensor_parallel_size: {tp} does not divide {listed} of model {self.name!r}")
        if not self.is_mla and self.num_kv_heads < tp and tp % self.num_kv_heads:
            # Fewer KV heads than GPUs: each GPU keeps one, so the GPUs must share them out evenly.
            raise ValueError(f"engine.tensor_parallel_size: {tp} is not a multiple of the {self.num_kv_heads} KV heads "
                             f"of model {self.name!r} (with fewer KV heads than GPUs, each KV head is copied to "
                             "the same number of GPUs)")
        # vLLM's tensor-parallel MoE (no expert parallelism) gives every GPU every expert, each cut to 1/tp of
        # its width like a dense MLP; the shared expert too. Routers and the shared expert's gate stay whole.
        # An MoE shape's intermediate_size prices nothing without dense layers, so it is only rounded up there.
        # Latent attention splits its heads (q_b, kv_b, o); the latent and the down-projections stay whole.
        return replace(self, name=f"{self.name} (1/{tp} tensor-parallel shard)",
                       num_attention_heads=self.num_attention_heads // tp,
                       num_kv_heads=max(1, self.num_kv_heads // tp),
                       intermediate_size=-(-self.intermediate_size // tp),
                       vocab_size=-(-self.vocab_size // tp),
                       moe_intermediate_size=self.moe_intermediate_size // tp,
                       shared_expert_intermediate_size=self.shared_expert_intermediate_size // tp)

    # --- pipeline parallelism ------------------------------------------------------------------
    def pipeline_stage_layers(self, pipeline_parallel_size: int) -> list[int]:
        """Layers of each pipeline stage, split as vLLM's default partition does: evenly, the remainder one
        each to the stages before the last (which also runs the final norm and lm_head).

        A ValueError names ``engine.pipeline_parallel_size`` when there are more stages than layers."""
        pp = pipeline_parallel_size
        if not isinstance(pp, int) or isinstance(pp, bool) or pp < 1:
            raise ValueError(f"engine.pipeline_parallel_size must be a positive integer, got {pp!r}")
        if pp > self.num_layers:
            raise ValueError(f"engine.pipeline_parallel_size: {pp} stages, but model {self.name!r} has only "
                             f"{self.num_layers} layers to split between them")
        layers = [self.num_layers // pp] * pp
        for stage in range(pp - 1 - self.num_layers % pp, pp - 1):
            layers[stage] += 1
        return layers

    def pipeline_stage_weight_bytes(self, stage: int, pipeline_parallel_size: int, dtype: str,
                                    quantization: str | None = None) -> float:
        """Bytes of weights one GPU of pipeline ``stage`` holds: its layers, the embedding on the first stage,
        the final norm and lm_head on the last (both, tied or not, on a one-stage pipeline)."""
        stage_layers = self.pipeline_stage_layers(pipeline_parallel_size)
        element = dtype_bytes(dtype)
        # The first num_dense_mlp_layers layers of a mixture of experts are its dense ones (DeepSeek's).
        first = sum(stage_layers[:stage])
        dense = max(0, min(first + stage_layers[stage], self.num_dense_mlp_layers) - first) if self.is_moe \
            else stage_layers[stage]
        # Every expert of a layer counts, quantized as the scheme says.
        total = self._weight_bytes(dtype, quantization, dense, stage_layers[stage] - dense,
                                   sum(self._layers_parameters(dense, stage_layers[stage] - dense)))
        embedding = self.vocab_size * self.hidden_size * element
        last = stage == pipeline_parallel_size - 1
        if stage == 0:
            total += embedding
        if last:
            total += self.hidden_size * element
            if not self.tied_embeddings or pipeline_parallel_size > 1:
                # Tied weights are one tensor on one GPU; split across stages, each end keeps a copy.
                total += embedding
        return total

    def to_dict(self) -> dict:
        return asdict(self)


def kv_cache_storage_dtype(dtype: str, kv_cache_dtype: str | None) -> str:
    """The dtype the KV cache is stored in: ``engine.kv_cache_dtype``, where None or vLLM's "auto" mean the
    model's ``dtype``."""
    return dtype if kv_cache_dtype in (None, "auto") else kv_cache_dtype
