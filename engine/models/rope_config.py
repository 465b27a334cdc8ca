"""RoPE settings from a ``config.json``, in either spelling: ``rope_theta`` + ``rope_scaling`` (transformers 4.x
checkpoints) or ``rope_parameters`` (transformers 5), and the share of each head that RoPE turns. The scalings
themselves are computed in rotary_embedding.py (LongRoPE's in long_rope.py).
"""

from __future__ import annotations

from typing import Any

from engine.models.long_rope import LONGROPE_TYPES, parse_longrope


def parse_rope(raw: dict[str, Any], default_theta: float) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, scaling dict with 'rope_type' or None) from either config spelling."""
    parameters = dict(raw.get("rope_parameters") or {})
    scaling = dict(raw.get("rope_scaling") or {})
    merged = {**parameters, **scaling}
    # transformers 5 keeps rope_parameters' rope_theta when a config also has the top-level key (it fills
    # rope_parameters with setdefault), so a config with both means rope_parameters' value.
    theta = parameters.get("rope_theta")
    if theta is None:
        theta = raw.get("rope_theta")
    if theta is None:
        theta = merged.get("rope_theta", default_theta)
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    merged["rope_type"] = rope_type
    merged.pop("type", None)
    merged.pop("rope_theta", None)
    if rope_type in LONGROPE_TYPES:
        return float(theta), parse_longrope(merged, raw)
    # The keys transformers requires of each scaling it validates: a missing one is refused by name, not
    # defaulted (a guessed low_freq_factor is another model) nor left to fail later as a KeyError.
    required = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
                "yarn": ("factor",)}.get(rope_type, ())
    missing = [key for key in required if merged.get(key) is None]
    if missing:
        raise ValueError(f"config.json: rope scaling of type {rope_type!r} needs {', '.join(map(repr, missing))} "
                         "(in rope_scaling or rope_parameters)")
    if rope_type in ("llama3", "yarn"):
        merged.setdefault("original_max_position_embeddings", raw.get("max_position_embeddings"))
    return float(theta), merged


def partial_rotary_factor(raw: dict[str, Any], head_dim: int, default: float = 1.0) -> float:
    """``partial_rotary_factor`` (top level, or in rope_parameters as transformers 5 writes it): in (0, 1], turning
    an even number of features."""
    factor = (raw.get("rope_parameters") or {}).get("partial_rotary_factor", raw.get("partial_rotary_factor", default))
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ValueError(f"config.json: partial_rotary_factor must be in (0, 1], got {factor!r}")
    if int(head_dim * factor) % 2:
        raise ValueError(f"config.json: partial_rotary_factor={factor} turns {int(head_dim * factor)} of "
                         f"head_dim={head_dim} features; RoPE turns pairs, so it must be even")
    return float(factor)


def layer_kind_rope(raw: dict[str, Any], global_default_theta: float, model: str
                    ) -> tuple[float, dict[str, Any] | None, float | None]:
    """RoPE of a model whose sliding layers turn by their own (Gemma 3, OLMo 3): (the full layers' rope_theta, their
    scaling or None, the sliding layers' rope_theta or None where the config does not say). transformers 5 keys it by
    layer kind (``rope_parameters: {full_attention: ..., sliding_attention: ...}``); the Hub's spelling,
    ``rope_theta`` with ``rope_scaling``, is the full layers'. The sliding layers turn unscaled: another type there
    is refused by name (``model`` says whose)."""
    parameters = raw.get("rope_parameters") or {}
    if "full_attention" not in parameters and "sliding_attention" not in parameters:
        theta, scaling = parse_rope({key: raw[key] for key in ("rope_theta", "rope_scaling", "max_position_embeddings")
                                     if key in raw}, global_default_theta)
        return theta, scaling, None
    full = dict(parameters.get("full_attention") or {})
    local = dict(parameters.get("sliding_attention") or {})
    theta, scaling = parse_rope({"rope_parameters": full, "max_position_embeddings": raw.get("max_position_embeddings")},
                                global_default_theta)
    if local.get("rope_type", "default") != "default":
        raise ValueError(f"config.json: {model}'s sliding_attention RoPE must be the default type, got "
                         f"{local.get('rope_type')!r}")
    local_theta = local.get("rope_theta")
    return theta, scaling, None if local_theta is None else float(local_theta)


def ntk_alpha_rope(theta: float, scaling: dict[str, Any] | None, head_dim: int
                   ) -> tuple[float, dict[str, Any] | None]:
    """Hunyuan's ``rope_scaling`` type ``dynamic`` with an ``alpha`` (transformers' ntk_alpha): plain RoPE at the
    fixed base ``theta * alpha ** (head_dim / (head_dim - 2))``. Dynamic scaling without an alpha stretches the base
    by each sequence's length, which a paged cache of keys turned once cannot follow: refused by name."""
    if scaling is None or scaling.get("rope_type") != "dynamic":
        return theta, scaling
    alpha = scaling.get("alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
        raise ValueError(f"config.json: rope_scaling type 'dynamic' needs a positive alpha (a fixed NTK stretch), got "
                         f"{alpha!r}; dynamic NTK by the sequence's length is not supported")
    return theta * alpha ** (head_dim / (head_dim - 2)), None
