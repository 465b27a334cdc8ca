"""A roofline cost model: a step's time from the model's shape and the device's datasheet.

Every operator of a step either computes or moves bytes, and on a GPU it takes about as long as the
slower of the two: max(FLOPs / achievable FLOP/s, bytes / achievable bandwidth). Summed over one step:

* linear layers (QKV, O, gate+up, down; per layer) read their weights once per step whatever the
  batch, and compute 2 FLOPs per weight per token. A decode batch of a few requests is therefore bound
  by reading the weights and costs the same as a batch of one; past the ridge point (achievable FLOP/s
  over achievable bytes/s, times bytes per weight over 2 FLOPs per weight: ~143 tokens for fp16 on an
  A100) the step grows with the token count. This max() is what makes small batches inefficient;
  nothing else models it.
* element-wise operators (norms, RoPE, residual adds, SiLU-and-multiply, KV-cache write) only stream
  activations.
* attention: a decode reads its whole KV cache (memory-bound); a prefill chunk computes 4 * heads *
  head_dim FLOPs per query-key pair under the causal mask and reads the KV of its earlier chunks. The
  cache's bytes are ``kv_cache_dtype``'s (an fp8 cache: one byte an element).
* lm_head computes logits for one row per request (only the last position is sampled), and sampling
  makes a few passes over those logits in FP32.
* multi-LoRA serving (``price_lora``): on a step with adapter tokens, each adapted projection's shrink and
  expand over the batch's adapters (``sim/cost_models/lora_cost.py``: FLOPs per adapter token, each distinct
  adapter's weights read once); a step without adapter tokens costs what it did before LoRA existed.
* multimodal models (``price_vision``): on a step that encodes images, the vision encoder's pass over their
  patches (``sim/cost_models/vision_encoder_cost.py``); a step without encoder tokens costs what it did before.
* speculative decoding's verification of d drafts is a decode with d + 1 query rows
  (``StepFeatures.num_spec_tokens``): d + 1 rows through every linear layer, the request's KV read once and
  scored by every row, logits and sampling at every row.
* a fixed cost per kernel (launch gap and minimum duration) and per step (CPU scheduling and I/O).
* with tensor parallelism (``tensor_parallel_size`` GPUs per engine), every count above is one GPU's
  shard (``ModelShape.shard``: heads, MLP columns and vocabulary split; norms and residuals whole), and
  the GPUs all-reduce the hidden state twice per layer (after O and after down) and gather the logits
  (``HardwareSpec.allreduce_time``). The GPUs run in lockstep, so a step takes one GPU's time.
* a mixture of experts (``ModelShape.is_moe``: Mixtral, Qwen-MoE) replaces each layer's MLP by a router
  (a projection to one logit per expert, in the model's dtype), the routed experts as a grouped GEMM
  (``sim/cost_models/routed_experts.py``: T * k rows of compute, and the weights of the experts the step's
  tokens are routed to, E * (1 - (1 - k/E)^T) of them on average under uniform routing) and, for Qwen2-MoE,
  a shared expert every token runs (ordinary projections, plus its [hidden, 1] gate). Element-wise, the
  activation runs on T * k rows of the expert width, the hidden state is permuted to the experts' rows and
  combined back, and top-k reads the router's logits. Routing is assumed uniform; real routers are skewed
  and touch fewer experts at mid batch sizes, so the model is pessimistic there (a skew parameter is future
  work). Tensor parallelism splits every expert's width (vLLM without expert parallelism), so the
  all-reduces stay two per layer; fp8 applies to the experts and the shared expert, not the router, mxfp4 to
  the routed experts alone (sim/weight_quantization.py). DeepSeek's first layers keep a dense MLP
  (``layer_kinds``: each kind of layer priced over its own count).
* multi-head latent attention (DeepSeek, Kimi K2; ``attention_work.py``: decode in the latent space, prefill
  decompressed) and data-parallel ranks with expert parallelism (``expert_parallel.py``: a rank's step without
  the routed experts, which the lockstep adds for all ranks' tokens); sim/cost_models/README.md has the figures.
* with pipeline parallelism (``pipeline_parallel_size`` stages, each of ``tensor_parallel_size`` GPUs),
  ``pipeline_stage_times`` splits a batch's GPU time by stage: each stage runs its layers' share of every
  per-layer cost (``ModelShape.pipeline_stage_layers``; the MLPs of a model with dense and MoE layers by
  which kind each stage holds), the last stage lm_head and sampling, and every
  stage but the last sends the batch's hidden states and residual to the next over the link (each of its
  tensor-parallel GPUs its share, all-gathered on the other side). The engine's
  own step overhead (scheduling, input preparation) is apart, paid once per batch; the simulator
  (sim/pipeline_stages.py) runs the stages as a pipeline.

The FLOP and byte counts are exact for the shape; the efficiency factors in ``HardwareSpec`` carry all
the empiricism. ``benchmarks/cost_model_vs_a100.py`` checks the per-operator times against measured A100
kernels. ``step_time`` is a few dozen float operations after ``step_features``: all per-model constants
are computed once here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from sim.cost_models.analytical_description import describe_analytical
from sim.cost_models.attention_work import attention_work
from sim.cost_models.expert_parallel import expert_parallel_moe
from sim.cost_models.linear_cost import LinearCost, linear_costs
from sim.cost_models.mlp_cost import dense_mlp_cost, moe_mlp_cost
from sim.cost_models.pipeline_split import stage_kind_fractions, stage_layer_work
from sim.cost_models.lora_cost import LoRACost
from sim.cost_models.step_batch import StepBatch, StepFeatures, step_features
from sim.cost_models.step_physics import step_flops_and_bytes
from sim.cost_models.vision_encoder_cost import VisionEncoderCost
from sim.hardware import HardwareSpec
from sim.model_shapes import ModelShape, dtype_bytes, kv_cache_storage_dtype
from sim.vision_encoders import VisionEncoderShape
from sim.weight_quantization import weight_quantization

if TYPE_CHECKING:
    from sim.expert_popularity import ExpertPopularity

# Sampling converts the logits to FP32 and makes a few passes over them (temperature, softmax,
# top-k/top-p, the draw). Four passes is between greedy (one argmax) and a full top-p sort.
SAMPLING_PASSES_OVER_LOGITS = 4
LOGIT_BYTES = 4

# Kernels a transformer layer launches besides its attention's (attention_work.py) and its MLP's (mlp_cost.py), in
# the profiled (unfused) stack: input norm, residual add, post-attention norm, residual add. A Llama layer's total
# is 12 (attention 5, MLP 3), a Mixtral layer's 16 (the fused MoE sequence is 7).
KERNELS_AROUND_ATTENTION_AND_MLP = 4
# Outside the layers: embedding, final norm, lm_head, and about four for sampling.
KERNELS_OUTSIDE_LAYERS = 7

# What ``AnalyticalCostModel.breakdown`` reports, in the order ``component_times`` returns them.
COMPONENTS = ("linear_layers", "elementwise", "attention_decode", "attention_prefill", "lm_head", "sampling",
              "fixed_overhead", "tensor_parallel_communication")
# All-reduces per layer under tensor parallelism: after the attention output projection and after the
# MLP down projection (Megatron's row-parallel layers).
ALLREDUCES_PER_LAYER = 2


class AnalyticalCostModel:
    name = "analytical"
    sampling_passes_over_logits = SAMPLING_PASSES_OVER_LOGITS

    def __init__(self, model: ModelShape, hardware: HardwareSpec, dtype: str = "bfloat16",
                 tensor_parallel_size: int = 1, kv_cache_dtype: str | None = None,
                 quantization: str | None = None, pipeline_parallel_size: int = 1,
                 data_parallel_size: int = 1) -> None:
        self.model = model
        self.pipeline_parallel_size = pipeline_parallel_size
        stage_layers = model.pipeline_stage_layers(pipeline_parallel_size)
        # Quantized weights (sim/weight_quantization.py): fp8 in every projection and expert, the products at
        # the device's fp8 rate, or at its 16-bit rate on one without fp8 tensor cores (weight-only: the
        # weights are widened as they are read); mxfp4 in the routed experts alone, weight-only everywhere.
        # Embedding, lm_head and routers stay in dtype.
        self.quantization = quantization
        scheme = self.weight_quantization = weight_quantization(quantization, model)
        self.hardware = hardware
        self.dtype = dtype
        self.tensor_parallel_size = tensor_parallel_size
        # None or "auto": the cache holds the model's dtype. Attention computes in the model's dtype
        # either way (an fp8 cache is widened as it is read), so only the bytes change.
        self.kv_cache_dtype = kv_cache_storage_dtype(dtype, kv_cache_dtype)
        kv_element_bytes = dtype_bytes(self.kv_cache_dtype)
        full_vocab_size = model.vocab_size
        model = model.shard(tensor_parallel_size)  # from here on, one GPU's part
        # Every all-reduce of a step costs latency + bytes * per_byte (0 and 0 on one GPU).
        self._allreduce_latency_s, self._allreduce_s_per_byte = (
            hardware.allreduce_coefficients(tensor_parallel_size) if tensor_parallel_size > 1 else (0.0, 0.0))
        element_bytes = dtype_bytes(dtype)
        attention_flops = hardware.achievable_attention_flops(dtype)
        bandwidth = hardware.achievable_bandwidth
        h = model.hidden_size
        self._element_bytes = element_bytes
        self._bandwidth = bandwidth

        linear = linear_costs(hardware, dtype, scheme)
        # --- one layer, operator by operator (the benchmark compares these with measured kernels) ---
        # Which projections the scheme covers: fp8 all of them, mxfp4 the routed experts alone.
        quantized = scheme is not None and not scheme.experts_only
        experts_quantized = scheme is not None
        attention = attention_work(model, element_bytes, kv_element_bytes)
        self.attention = attention
        attention_linears = tuple(linear(p.name, p.in_features, p.out_features, quantized)
                                  for p in attention.projections)
        # Latent attention's kv_b_proj: also over the cached tokens a prefill chunk attends to (attention_work.py).
        context = attention.context_projection
        self.context_linear = None if context is None else linear(context.name, context.in_features,
                                                                  context.out_features, quantized)
        dense_mlp = dense_mlp_cost(model, linear, quantized, element_bytes)
        moe_mlp = moe_mlp_cost(model, linear, quantized, experts_quantized, element_bytes) if model.is_moe else None
        typical_mlp = moe_mlp or dense_mlp  # an MoE model's typical layer is an MoE layer
        self.routed_experts = typical_mlp.routed_experts
        self.layer_linears = attention_linears + typical_mlp.linears + (
            (self.context_linear,) if self.context_linear else ())
        # Bytes each element-wise operator streams per token: a norm reads and writes the hidden state, an add
        # reads two and writes one; attention's own (RoPE, the cache write) and the MLP's (the activation, the
        # experts' permutation) come from their parts.
        around_attention = {"input_norm": 2 * h * element_bytes, **attention.elementwise_bytes_per_token,
                            "residual_add": 3 * h * element_bytes, "post_attention_norm": 2 * h * element_bytes}
        self.layer_elementwise_bytes_per_token: dict[str, int] = {**around_attention,
                                                                  **typical_mlp.elementwise_bytes_per_token}
        # Two residual adds per layer.
        common_elementwise_bytes = sum(around_attention.values()) + around_attention["residual_add"]
        outside_elementwise_bytes = 2 * h * element_bytes + 2 * h * element_bytes  # embedding, final norm

        # --- per-step constants for step_time, summed over layers (DeepSeek's dense and MoE layers apart) ---
        layers, dense_layers, moe_layers = model.num_layers, model.num_dense_mlp_layers, model.num_moe_layers
        # (layers, their MLP) of each kind: dense MLPs (all of a dense model's layers), then the MoE layers.
        self.layer_kinds = ((dense_layers, dense_mlp),) + (((moe_layers, moe_mlp),) if moe_mlp else ())

        def all_layers(count: int, c: LinearCost) -> tuple[float, float, float]:
            return count * c.compute_s_per_row, count * c.weight_read_s, count * c.activation_s_per_row

        # Each kind's MLP projections over its layers (pipeline stages split them by kind: _mlp_times).
        self._mlp_linears_all_layers = tuple(tuple(all_layers(count, c) for c in mlp.linears) if count else ()
                                             for count, mlp in self.layer_kinds)
        self._linears_all_layers = tuple(all_layers(layers, c) for c in attention_linears) + tuple(
            term for terms in self._mlp_linears_all_layers for term in terms)
        self._context_linear_all_layers = self.context_linear and (
            layers * self.context_linear.compute_s_per_row, layers * self.context_linear.weight_read_s,
            layers * self.context_linear.activation_s_per_row)
        self._experts_all_layers = moe_mlp.routed_experts.scaled(moe_layers) if moe_mlp else None
        # Data-parallel ranks (sim/cost_models/expert_parallel.py): a rank's step is priced without the routed
        # experts, which the lockstep step adds for all ranks' tokens.
        self.expert_parallel = None
        if data_parallel_size > 1:
            if moe_mlp is None or pipeline_parallel_size > 1:
                raise ValueError(f"engine.data_parallel_size: {data_parallel_size} ranks are priced for a mixture of "
                                 "experts on one pipeline stage")
            self.expert_parallel = expert_parallel_moe(
                self._experts_all_layers, data_parallel_size, tensor_parallel_size, moe_layers,
                model.num_experts_per_token, h * element_bytes, *hardware.send_coefficients())
            self._experts_all_layers = None
        self._elementwise_s_per_token = (layers * common_elementwise_bytes + sum(
            count * sum(mlp.elementwise_bytes_per_token.values()) for count, mlp in self.layer_kinds)
            + outside_elementwise_bytes) / bandwidth
        a = attention
        # Decode: per KV token read, the slower of its FLOPs and its bytes (bytes win by ~100x for grouped-query
        # attention; latent attention's heads all score one cached latent, and can be compute-bound).
        self._decode_s_per_context_token = layers * max(a.decode_flops_per_pair / attention_flops,
                                                        a.kv_bytes_per_cached_token / bandwidth)
        # The two sides apart, for verifications of drafts: several query rows per KV token read.
        self._decode_s_per_pair = layers * a.decode_flops_per_pair / attention_flops
        self._decode_s_per_kv_token = layers * a.kv_bytes_per_cached_token / bandwidth
        self._decode_s_per_request = layers * a.decode_bytes_per_request / bandwidth  # read q, write output
        self._prefill_s_per_pair = layers * a.prefill_flops_per_pair / attention_flops
        self._prefill_s_per_context_token = layers * a.prefill_bytes_per_context_token / bandwidth
        self._prefill_s_per_token = layers * a.prefill_bytes_per_token / bandwidth
        self.lm_head = linear("lm_head", h, model.vocab_size)
        # Sampling reads the whole vocabulary's logits, gathered from every GPU's part.
        self._sampling_s_per_request = SAMPLING_PASSES_OVER_LOGITS * full_vocab_size * LOGIT_BYTES / bandwidth
        # Kernels: the layer's own around attention and MLP, attention's, the MLP's.
        self.kernels_per_layer = KERNELS_AROUND_ATTENTION_AND_MLP + attention.kernels + typical_mlp.kernels
        self._kernels_all_layers = sum(count * (KERNELS_AROUND_ATTENTION_AND_MLP + attention.kernels + mlp.kernels)
                                       for count, mlp in self.layer_kinds)
        # (An all-reduce's own launch is in its latency: HardwareSpec.allreduce_latency_s.)
        self._fixed_s = hardware.step_overhead_s + hardware.kernel_launch_overhead_s * (
            self._kernels_all_layers + KERNELS_OUTSIDE_LAYERS)
        self.shard = model
        # Multi-LoRA serving's shrink and expand kernels (price_lora); None: no step has adapter tokens.
        self.lora: LoRACost | None = None
        self.vision: VisionEncoderCost | None = None  # price_vision; None: no step encodes images
        self._allreduces_per_step = layers * ALLREDUCES_PER_LAYER
        self._hidden_bytes_per_token = h * element_bytes
        self._logit_bytes_per_request = full_vocab_size * element_bytes
        # Pipeline stages: each one's share of the per-layer costs, and the hand-over between stages (vLLM
        # sends the hidden states and the residual, two rows of hidden_size per token).
        self.stage_layer_fractions = tuple(count / layers for count in stage_layers)
        # Each stage's share of each kind of layer (DeepSeek's dense layers are its first ones, on the first
        # stage): the MLPs of a model with both kinds are split between stages by these, the rest per layer.
        self._stage_kind_fractions = stage_kind_fractions(stage_layers, [count for count, _ in self.layer_kinds])
        self._launch_s_all_layers = hardware.kernel_launch_overhead_s * self._kernels_all_layers
        self._launch_s_outside_layers = hardware.kernel_launch_overhead_s * KERNELS_OUTSIDE_LAYERS
        self._send_latency_s, self._send_s_per_byte = (
            hardware.send_coefficients() if pipeline_parallel_size > 1 else (0.0, 0.0))
        # With tensor parallelism each GPU of a stage sends its 1/tp of the rows and the next stage's GPUs
        # all-gather them (vLLM's send_tensor_dict with an all-gather group): a gather counted as half an
        # all-reduce, as the logits' gather is.
        self._send_bytes_per_token = 2 * h * element_bytes / tensor_parallel_size
        self._gather_latency_s = self._allreduce_latency_s if pipeline_parallel_size > 1 else 0.0
        self._gather_s_per_token = (2 * h * element_bytes / 2 * self._allreduce_s_per_byte
                                    if pipeline_parallel_size > 1 else 0.0)

    # --- the cost-model interface -----------------------------------------------------------------
    def step_time(self, batch: StepBatch) -> float:
        return self.step_time_from_features(step_features(batch))

    def step_time_from_features(self, features: StepFeatures) -> float:
        """The same as ``step_time`` for callers that already derived the features (the simulator). Under
        pipeline parallelism, a batch's time through an empty pipeline: the engine's overhead and every stage."""
        if self.pipeline_parallel_size > 1:
            return self.engine_overhead_s(features) + sum(self.pipeline_stage_times(features))
        time = sum(self.component_times(features))
        if features.num_lora_tokens:
            time += self.lora.time(features.num_lora_tokens, features.num_active_loras)
        if features.num_encoder_tokens:
            time += self._vision_time(features)
        return time

    def price_lora(self, max_lora_rank: int, target_modules: tuple[str, ...] | list[str]) -> None:
        """Price multi-LoRA serving's kernels on steps with adapter tokens (sim/cost_models/lora_cost.py); a step
        without them keeps its time to the last bit. One engine stage only (the simulator refuses LoRA with
        pipeline parallelism)."""
        if self.pipeline_parallel_size > 1:
            raise ValueError("LoRA is priced on one pipeline stage only")
        self.lora = LoRACost(self.shard, self.hardware, self.dtype, max_lora_rank, target_modules)

    def price_vision(self, encoder: VisionEncoderShape) -> None:
        """Price the vision encoder on steps with encoder tokens (sim/cost_models/vision_encoder_cost.py); a step
        without them keeps its time to the last bit. One pipeline stage only."""
        if self.pipeline_parallel_size > 1:
            raise ValueError("a vision encoder is priced on one pipeline stage only")
        self.vision = VisionEncoderCost(encoder, self.hardware, self.dtype, self.tensor_parallel_size)

    def price_expert_popularity(self, popularity: ExpertPopularity | None, eplb: bool) -> None:
        """A router that favours some experts (sim/expert_popularity.py; None: uniform), and, with data-parallel
        ranks, whether EPLB balances the GPUs. Steps of a model without experts are unchanged."""
        if self.routed_experts is None:
            raise ValueError(f"workload.expert_popularity: {self.model.name!r} has no experts to route to")
        self.routed_experts = replace(self.routed_experts, popularity=popularity)
        if self._experts_all_layers is not None:
            self._experts_all_layers = replace(self._experts_all_layers, popularity=popularity)
        if self.expert_parallel is not None:
            self.expert_parallel = self.expert_parallel.with_popularity(popularity, eplb)

    def _vision_time(self, f: StepFeatures) -> float:
        if self.vision is None:
            raise RuntimeError(f"a step encodes {f.num_encoder_tokens} multimodal tokens, but no vision encoder "
                               f"was priced for {self.model.name!r} (AnalyticalCostModel.price_vision)")
        return self.vision.time(f.num_encoder_tokens, f.encoder_attention_work)

    def engine_overhead_s(self, features: StepFeatures) -> float:
        """The engine's own seconds per step (scheduling, preparing inputs), outside the GPUs' time."""
        return self.hardware.step_overhead_s

    def pipeline_stage_times(self, f: StepFeatures) -> list[float]:
        """GPU seconds of each pipeline stage for a batch with features ``f`` (``engine_overhead_s`` apart)."""
        stages = self.pipeline_parallel_size
        if f.num_tokens == 0:
            return [0.0] * stages
        linear, elementwise, decode, prefill, lm_head, sampling, _fixed, _communication = self.component_times(f)
        layers_allreduce, logits_gather = self._communication_parts(f)
        per_layer_work = linear + elementwise + decode + prefill + self._launch_s_all_layers + layers_allreduce
        send = self._send_latency_s + f.num_tokens * self._send_bytes_per_token * self._send_s_per_byte
        if self.tensor_parallel_size > 1:
            send += self._gather_latency_s + f.num_tokens * self._gather_s_per_token
        both_kinds = len(self.layer_kinds) == 2 and all(count for count, _ in self.layer_kinds)
        layer_work = stage_layer_work(per_layer_work, self.stage_layer_fractions, self._stage_kind_fractions,
                                      self._mlp_times(f.num_tokens) if both_kinds else None)
        times = [work + send for work in layer_work[:-1]]
        times.append(layer_work[-1] + lm_head + sampling + self._launch_s_outside_layers + logits_gather)
        if f.num_encoder_tokens:
            # The encoder runs on the first stage before its layers (priced on one stage only: async scheduling's
            # single stage here; price_vision refuses more).
            times[0] += self._vision_time(f)
        return times

    def _mlp_times(self, tokens: int) -> list[float]:
        """Each kind of layer's MLP seconds over all its layers (``layer_kinds``' order): projections, routed
        experts, element-wise bytes, kernel launches. The same terms ``component_times`` sums with the rest."""
        launch = self.hardware.kernel_launch_overhead_s
        times = []
        for (count, mlp), terms in zip(self.layer_kinds, self._mlp_linears_all_layers):
            seconds = sum(max(tokens * compute, weight_read + tokens * activation)
                          for compute, weight_read, activation in terms)
            if mlp.routed_experts is not None and self._experts_all_layers is not None:
                seconds += self._experts_all_layers.time(tokens)
            seconds += tokens * count * sum(mlp.elementwise_bytes_per_token.values()) / self._bandwidth
            times.append(seconds + launch * count * mlp.kernels)
        return times

    def breakdown(self, batch: StepBatch) -> dict[str, float]:
        """Seconds per component of one step; the values sum to ``step_time(batch)`` on one pipeline stage
        (with more, ``step_time`` adds the sends between stages: ``pipeline_stage_times``)."""
        return dict(zip(COMPONENTS, self.component_times(step_features(batch)), strict=True))

    def component_times(self, f: StepFeatures) -> tuple[float, ...]:
        """Seconds of each of ``COMPONENTS`` for a step with features ``f``."""
        tokens = f.num_tokens
        if tokens == 0:  # nothing scheduled: no kernel runs, only the engine loop's own cost
            return (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, self.hardware.step_overhead_s, 0.0)
        linear_layers = 0.0
        for compute, weight_read, activation in self._linears_all_layers:
            linear_layers += max(tokens * compute, weight_read + tokens * activation)
        if self._experts_all_layers is not None:
            linear_layers += self._experts_all_layers.time(tokens)
        if self._context_linear_all_layers:
            # Latent attention's kv_b_proj: every query row, and every cached token a prefill chunk attends to.
            compute, weight_read, activation = self._context_linear_all_layers
            rows = tokens + f.prefill_context_tokens
            linear_layers += max(rows * compute, weight_read + rows * activation)
        # Rows whose logits are computed and sampled: one per request, and each draft's (speculative decoding:
        # the sampler compares the target's token with the draft at every verified position).
        logit_rows = f.num_reqs + f.num_spec_tokens
        if f.num_spec_tokens:
            # Verifications are decodes with d + 1 query rows: the KV is read once, and scored by every row,
            # still memory-bound for a few drafts (on an H100, compute wins past ~44 rows for Llama-3-8B).
            attention_decode = max((f.decode_context_tokens + f.spec_attention_work) * self._decode_s_per_pair,
                                   f.decode_context_tokens * self._decode_s_per_kv_token) \
                + (f.num_decode_reqs + f.num_spec_tokens) * self._decode_s_per_request
        else:
            attention_decode = f.decode_context_tokens * self._decode_s_per_context_token \
                + f.num_decode_reqs * self._decode_s_per_request
        attention_prefill = 0.0
        if f.num_prefill_reqs:
            attention_prefill = max(f.prefill_attention_work * self._prefill_s_per_pair,
                                    f.prefill_context_tokens * self._prefill_s_per_context_token
                                    + f.num_prefill_tokens * self._prefill_s_per_token)
        communication = sum(self._communication_parts(f)) if self.tensor_parallel_size > 1 else 0.0
        return (linear_layers, tokens * self._elementwise_s_per_token, attention_decode, attention_prefill,
                self.lm_head.time(logit_rows), logit_rows * self._sampling_s_per_request, self._fixed_s,
                communication)

    def _communication_parts(self, f: StepFeatures) -> tuple[float, float]:
        """Tensor parallelism's seconds: (the layers' all-reduces, the logits' gather). Two all-reduces of the
        hidden states per layer; a gather moves half an all-reduce's bytes (no reduce-scatter half), counted
        as one at that size. (0, 0) on one GPU."""
        if self.tensor_parallel_size == 1:
            return 0.0, 0.0
        per_byte = self._allreduce_s_per_byte
        return (self._allreduces_per_step * (self._allreduce_latency_s + f.num_tokens * self._hidden_bytes_per_token
                                             * per_byte),
                self._allreduce_latency_s + (f.num_reqs + f.num_spec_tokens) * self._logit_bytes_per_request / 2
                * per_byte)

    def layer_operator_times(self, num_tokens: int) -> dict[str, float]:
        """Seconds per non-attention operator of one layer for ``num_tokens`` rows, each with its kernel
        overhead: what a per-kernel profiler measures (one residual add of the layer's two)."""
        overhead = self.hardware.kernel_launch_overhead_s
        times = {c.name: c.time(num_tokens) + overhead for c in self.layer_linears}
        if self.routed_experts is not None:  # two grouped GEMMs
            times["routed_experts"] = self.routed_experts.time(num_tokens) + 2 * overhead
        for name, bytes_per_token in self.layer_elementwise_bytes_per_token.items():
            if name != "kv_cache_write":  # belongs to attention
                times[name] = num_tokens * bytes_per_token / self._bandwidth + overhead
        return times

    def describe(self) -> dict:
        return describe_analytical(self)

    def step_flops_and_bytes(self, batch: StepBatch) -> tuple[float, float]:
        """Total FLOPs and HBM bytes of one step (sim/cost_models/step_physics.py), for checking predictions
        against datasheet peaks."""
        return step_flops_and_bytes(self.model, batch, self.dtype, self.kv_cache_dtype)

