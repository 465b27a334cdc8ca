"""What a multimodal step's vision encoder adds to its time in the analytical model.

Before a step's forward, the engine encodes the images whose placeholder tokens the step schedules (their
encoder tokens: ``StepFeatures.num_encoder_tokens``), all in one pass of the vision encoder
(sim/vision_encoders.py): every patch through every ViT layer, then each token through the projector. Priced
operator class by operator class, at the roofline as the LLM's operators are (sim/cost_models/analytical.py):

- linear layers: 2 FLOPs per weight per row (patches through the tower, tokens through the projector), at the
  achievable GEMM rate; or, if slower, reading the encoder's weights once (every step that runs it: vLLM keeps
  no encoder activations between steps) and each row's input and output;
- attention: full (not causal) within each image, 4 x hidden FLOPs per pair of its patches in every layer
  (QK^T and AV), at the achievable attention rate; or, if slower, reading q, k, v and writing the output. The
  pairs are ``encoder_attention_work`` (each image's tokens squared) times patches_per_token squared, so one
  large image costs more than several small ones of the same tokens in all;
- element-wise operators (two norms, two residual adds, the MLP's activation per layer) stream activations;
- a launch overhead per kernel: ten per layer (two norms, QKV, attention, O, two adds, two MLP matrices, the
  activation), and a few outside the layers (patch embedding, position embedding, final norm, projector).

Tensor parallelism: vLLM shards the ViT like the LLM (heads and MLP columns split, norms and residuals whole),
so FLOPs and weights are one GPU's part; the encoder's all-reduces are not counted (a few per layer of
activations that are small next to its compute). Weights in the model's dtype: the projections of a quantized
LLM are priced at their quantized rate, the encoder's are not (vLLM's fp8 checkpoints usually leave the vision
tower in 16 bits). A step without encoder tokens runs no encoder kernel and costs nothing here.
"""

from __future__ import annotations

from dataclasses import replace

from sim.hardware import HardwareSpec
from sim.model_shapes import dtype_bytes
from sim.vision_encoders import VisionEncoderShape

# Kernels per ViT layer: input norm, QKV, attention, O, residual add, post-attention norm, MLP up, activation,
# MLP down, residual add. (Qwen2-VL's rotary embedding would make eleven: within the other figures' slack.)
KERNELS_PER_ENCODER_LAYER = 10
# Outside the layers: patch embedding, position embedding add, final norm, and about three for the projector
# (pooling or merge, its matrices and activation).
KERNELS_OUTSIDE_ENCODER_LAYERS = 6


class VisionEncoderCost:
    def __init__(self, encoder: VisionEncoderShape, hardware: HardwareSpec, dtype: str,
                 tensor_parallel_size: int = 1) -> None:
        if encoder.num_attention_heads % tensor_parallel_size or encoder.intermediate_size % tensor_parallel_size:
            raise ValueError(f"vision_encoder: tensor_parallel_size {tensor_parallel_size} must divide "
                             f"{encoder.name!r}'s num_attention_heads ({encoder.num_attention_heads}) and "
                             f"intermediate_size ({encoder.intermediate_size})")
        self.encoder = encoder
        self.dtype = dtype
        self.tensor_parallel_size = tp = tensor_parallel_size
        layers, h, ppt = encoder.num_layers, encoder.hidden_size, encoder.patches_per_token
        mlp_up = (2 if encoder.gated_mlp else 1) * encoder.intermediate_size  # the up projection's outputs
        element_bytes = dtype_bytes(dtype)
        bandwidth = hardware.achievable_bandwidth
        # Linear layers, per encoder token (patches_per_token patches through the tower, one row through the
        # projector), and the weights read once per step; one GPU's shard of both.
        self.linear_compute_s_per_token = encoder.linear_flops(1) / tp / hardware.achievable_gemm_flops(dtype)
        self.weight_bytes = encoder.num_parameters * element_bytes // tp
        self.weight_read_s = self.weight_bytes / bandwidth
        # Each patch's rows in and out of the shard's four projections (QKV and up column-parallel: whole input,
        # 1/tp of the outputs; O and down row-parallel: 1/tp of the input, whole output). The projector's rows
        # (one per token, not per patch) are left out.
        row_elements = (h + 3 * h // tp) + (h // tp + h) + (h + mlp_up // tp) \
            + (encoder.intermediate_size // tp + h)
        self.linear_activation_s_per_token = layers * ppt * row_elements * element_bytes / bandwidth
        # Attention, per unit of encoder_attention_work (a pair of tokens: patches_per_token**2 pairs of
        # patches), and each patch's q, k, v read and output written by the kernel (1/tp of the heads).
        self.attention_s_per_flop = 1 / tp / hardware.achievable_attention_flops(dtype)
        # A unit of encoder_attention_work (a pair of tokens) in every layer; a windowed encoder's attention is
        # priced by attention_flops with the step's tokens (most of its layers score pairs within windows only).
        self.attention_s_per_work = replace(encoder, window_tokens=None).attention_flops(1) * self.attention_s_per_flop
        self.attention_bytes_s_per_token = layers * ppt * 4 * h // tp * element_bytes / bandwidth
        # Element-wise, per patch and layer: two norms read and write the hidden state, two residual adds read
        # two and write one, the activation reads the up projection's outputs and writes the MLP's width.
        elementwise_elements = 2 * 2 * h + 2 * 3 * h + (mlp_up + encoder.intermediate_size) // tp
        self.elementwise_s_per_token = layers * ppt * elementwise_elements * element_bytes / bandwidth
        self.launch_s = hardware.kernel_launch_overhead_s * (
            layers * KERNELS_PER_ENCODER_LAYER + KERNELS_OUTSIDE_ENCODER_LAYERS)

    def component_times(self, num_encoder_tokens: int, encoder_attention_work: int) -> dict[str, float]:
        """Seconds of each operator class for a step that encodes ``num_encoder_tokens`` tokens whose images'
        tokens squared sum to ``encoder_attention_work``; all 0.0 without encoder tokens."""
        if not num_encoder_tokens:
            return {"linear_layers": 0.0, "attention": 0.0, "elementwise": 0.0, "launch": 0.0}
        return {
            "linear_layers": max(num_encoder_tokens * self.linear_compute_s_per_token,
                                 self.weight_read_s + num_encoder_tokens * self.linear_activation_s_per_token),
            "attention": max(self.encoder.attention_flops(encoder_attention_work, num_encoder_tokens)
                             * self.attention_s_per_flop,
                             num_encoder_tokens * self.attention_bytes_s_per_token),
            "elementwise": num_encoder_tokens * self.elementwise_s_per_token,
            "launch": self.launch_s,
        }

    def time(self, num_encoder_tokens: int, encoder_attention_work: int) -> float:
        """Seconds the step's vision encoder adds; 0.0 for a step without encoder tokens."""
        if not num_encoder_tokens:
            return 0.0
        return sum(self.component_times(num_encoder_tokens, encoder_attention_work).values())

    def describe(self) -> dict:
        encoder = self.encoder
        image_tokens = encoder.tokens_per_image
        return {
            "encoder": encoder.to_dict(),
            "num_parameters": encoder.num_parameters,
            "dtype": self.dtype,
            "tensor_parallel_size": self.tensor_parallel_size,
            "weight_bytes_per_gpu": self.weight_bytes,
            "weight_read_s": self.weight_read_s,
            "linear_compute_s_per_token": self.linear_compute_s_per_token,
            "attention_s_per_work": self.attention_s_per_work,
            "elementwise_s_per_token": self.elementwise_s_per_token,
            "launch_s": self.launch_s,
            # One image alone in a step, for fixed-resolution encoders (None: the workload sizes each image).
            "one_image_s": self.time(image_tokens, image_tokens * image_tokens) if image_tokens else None,
        }
