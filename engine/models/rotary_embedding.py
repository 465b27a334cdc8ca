"""Rotary position embedding (RoPE) in the "rotate half" convention of Hugging Face Llama checkpoints.

The inverse frequencies follow the checkpoint's ``rope_scaling``: none (plain RoPE), ``linear``
(positions divided by ``factor``, implemented as frequencies divided by it), ``llama3`` (Llama 3.1's
wavelength-dependent scaling) or ``yarn`` (YaRN: high frequencies kept, low ones divided by ``factor``, a linear
ramp between, and cos/sin scaled by an attention factor; DeepSeek-V3, Kimi K2, Qwen long-context configs) or
``longrope`` (Phi-3-128k, Phi-3.5/Phi-4-mini: per-pair factors, short or long by the engine's context,
long_rope.py). cos/sin are computed per step from the positions rather than from a
precomputed table: the cost is one [num_tokens, head_dim / 2] product per forward, and it stays exact
for any position with no table-size limit.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from engine.models.long_rope import check_longrope_factors, longrope_inv_freq, uses_long_factors


def compute_inv_freq(head_dim: int, rope_theta: float, rope_scaling: dict[str, Any] | None) -> torch.Tensor:
    """[head_dim / 2] float32 inverse frequencies, always built on the CPU (never on a meta device)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").to(torch.float32) / head_dim
    inv_freq = 1.0 / (rope_theta ** exponents)
    rope_type = (rope_scaling or {}).get("rope_type", "default")
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(rope_scaling["factor"])
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope_scaling)
    if rope_type == "yarn":
        return _yarn_inv_freq(inv_freq, head_dim, rope_theta, rope_scaling)
    if rope_type == "longrope":  # until the engine's context is known, the checkpoint's whole context
        check_longrope_factors(rope_scaling, head_dim)
        return longrope_inv_freq(head_dim, rope_theta, rope_scaling, long_context=True)
    raise ValueError(f"unsupported rope_scaling type {rope_type!r}; supported: default, linear, llama3, yarn, "
                     "longrope")


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for a context stretched ``factor`` times (1 when not stretched)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_attention_factor(rope_scaling: dict[str, Any] | None) -> float:
    """What cos and sin are multiplied by: 1, except under YaRN, whose ``attention_factor`` (given, or derived
    from ``factor``, ``mscale`` and ``mscale_all_dim`` as transformers derives it) scales both q and k, and under
    LongRoPE (resolved when the config is parsed, long_rope.py)."""
    rope_type = (rope_scaling or {}).get("rope_type")
    if rope_type == "longrope":
        return float(rope_scaling["attention_factor"])
    if rope_type != "yarn":
        return 1.0
    if rope_scaling.get("attention_factor") is not None:
        return float(rope_scaling["attention_factor"])
    factor, mscale, mscale_all_dim = (float(rope_scaling["factor"]), rope_scaling.get("mscale"),
                                      rope_scaling.get("mscale_all_dim"))
    if mscale and mscale_all_dim:
        return yarn_mscale(factor, float(mscale)) / yarn_mscale(factor, float(mscale_all_dim))
    return yarn_mscale(factor)


def _yarn_inv_freq(inv_freq: torch.Tensor, head_dim: int, rope_theta: float, scaling: dict[str, Any]) -> torch.Tensor:
    """YaRN: the dimensions that turn more than ``beta_fast`` times over the original context keep their
    frequency, those that turn fewer than ``beta_slow`` times are divided by ``factor``, and a linear ramp over
    the dimensions between blends the two."""
    factor = float(scaling["factor"])
    original_context = float(scaling["original_max_position_embeddings"])
    beta_fast, beta_slow = float(scaling.get("beta_fast") or 32), float(scaling.get("beta_slow") or 1)

    def dimension_of(rotations: float) -> float:  # the dimension whose wavelength fits ``rotations`` times
        return head_dim * math.log(original_context / (rotations * 2 * math.pi)) / (2 * math.log(rope_theta))

    low, high = dimension_of(beta_fast), dimension_of(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a ramp of zero width would divide by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    kept = 1 - ramp  # 1: the dimension's own frequency (extrapolated); 0: divided by factor (interpolated)
    return inv_freq / factor * (1 - kept) + inv_freq * kept


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by ``factor``, interpolate smoothly between."""
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling.get("low_freq_factor", 1.0))
    high_freq_factor = float(scaling.get("high_freq_factor", 4.0))
    old_context_len = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on interleaved pairs, in float32: (x[2i], x[2i+1]) turns by angle i; the layout stays interleaved
    (Cohere, GLM-4, ERNIE 4.5, Llama 4). With cos/sin narrower than the head (partial RoPE, GLM-4's half), only the
    first features turn; the rest pass as they are."""
    rotary = cos.shape[-1]
    if rotary != x.shape[-1]:
        return torch.cat((rotate_pairs(x[..., :rotary], cos, sin), x[..., rotary:]), dim=-1)
    half = rotary // 2  # cos/sin repeat their angles over the two halves (RotaryEmbedding.cos_sin)
    cos, sin = cos[..., :half].float(), sin[..., :half].float()
    x32 = x.float()
    evens, odds = x32[..., 0::2], x32[..., 1::2]
    return torch.stack((evens * cos - odds * sin, odds * cos + evens * sin), dim=-1).flatten(-2).to(x.dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, rope_theta: float, rope_scaling: dict[str, Any] | None) -> None:
        super().__init__()
        self.head_dim = head_dim
        # A plain attribute, not a buffer: it is derived from the config, never loaded, and must survive
        # the meta-device construction the loader uses.
        self._inv_freq_cpu = compute_inv_freq(head_dim, rope_theta, rope_scaling)
        self._inv_freq_by_device: dict[torch.device, torch.Tensor] = {}
        self.attention_factor = rope_attention_factor(rope_scaling)
        self._rope_theta, self._rope_scaling = rope_theta, rope_scaling
        # M-RoPE (Qwen2-VL): consecutive sections of the rotary half turned by a token's temporal, height and width
        # positions (positions [3, num_tokens]); set by the runner for a checkpoint whose images it encodes. Text
        # tokens have three equal positions, which is plain RoPE.
        self.mrope_section: list[int] | None = None
        # Qwen3-VL's interleaved M-RoPE: feature j of the rotary half turns by the height position where j % 3 == 1
        # and j < 3 x mrope_section[1], by the width position where j % 3 == 2 and j < 3 x mrope_section[2], by the
        # temporal one elsewhere (so every axis keeps low and high frequencies).
        self.mrope_interleaved = False
        self._mrope_axis_by_device: dict[torch.device, torch.Tensor] = {}

    def _mrope_axis(self, device: torch.device) -> torch.Tensor:
        """Interleaved M-RoPE: which position (0 temporal, 1 height, 2 width) turns each feature of the rotary half;
        built once per device (the sections never change once set)."""
        if device not in self._mrope_axis_by_device:
            features = torch.arange(len(self._inv_freq_cpu))
            axis = torch.zeros_like(features)
            for index in (1, 2):
                axis[(features % 3 == index) & (features < 3 * self.mrope_section[index])] = index
            self._mrope_axis_by_device[device] = axis.to(device)
        return self._mrope_axis_by_device[device]

    def fit_context(self, max_model_len: int) -> None:
        """Called once the engine's ``max_model_len`` is known, before any step: LongRoPE takes its short factors
        when no sequence can outgrow the pretraining context (long_rope.py). Other scalings do not depend on it."""
        if (self._rope_scaling or {}).get("rope_type") != "longrope":
            return
        long_context = uses_long_factors(self._rope_scaling, max_model_len)
        self._inv_freq_cpu = longrope_inv_freq(self.head_dim, self._rope_theta, self._rope_scaling, long_context)
        self._inv_freq_by_device.clear()

    def _inv_freq(self, device: torch.device) -> torch.Tensor:
        if device not in self._inv_freq_by_device:
            self._inv_freq_by_device[device] = self._inv_freq_cpu.to(device)
        return self._inv_freq_by_device[device]

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape [num_tokens, 1, head_dim] (broadcast over heads), computed in float32. ``positions``
        [num_tokens], or [3, num_tokens] for M-RoPE (``mrope_section``)."""
        if positions.dim() == 2:
            all_freqs = positions.to(torch.float32)[:, :, None] * self._inv_freq(positions.device)[None, None, :]
            if self.mrope_interleaved:
                features = torch.arange(all_freqs.shape[-1], device=positions.device)
                freqs = all_freqs[self._mrope_axis(positions.device), :, features].transpose(0, 1)
            else:
                sections = all_freqs.split(self.mrope_section, dim=-1)
                freqs = torch.cat([section[index % 3] for index, section in enumerate(sections)], dim=-1)
        else:
            freqs = positions.to(torch.float32)[:, None] * self._inv_freq(positions.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        if self.attention_factor != 1.0:
            return (emb.cos() * self.attention_factor).to(dtype), (emb.sin() * self.attention_factor).to(dtype)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [num_tokens, num_heads, head_dim] rotated by its token's angle. With cos/sin narrower than the head
        (partial RoPE), only the first features turn; the rest pass as they are."""
        rotary = cos.shape[-1]
        if rotary == x.shape[-1]:
            return x * cos + rotate_half(x) * sin
        turned = x[..., :rotary]
        return torch.cat((turned * cos + rotate_half(turned) * sin, x[..., rotary:]), dim=-1)


def cos_sin_per_layer(global_rotary: RotaryEmbedding, local_rotary: RotaryEmbedding, layers, positions: torch.Tensor,
                      dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (cos, sin) for a model whose sliding layers turn by their own RoPE (Gemma 3's local base, OLMo
    3's unscaled one): ``local_rotary`` for a layer whose ``self_attn.sliding_window`` is set, ``global_rotary``
    for the others; one computation per kind and step (the same object twice: one in all)."""
    global_cos_sin = global_rotary.cos_sin(positions, dtype)
    local_cos_sin = global_cos_sin if local_rotary is global_rotary else local_rotary.cos_sin(positions, dtype)
    return [local_cos_sin if layer.self_attn.sliding_window is not None else global_cos_sin for layer in layers]
