"""Attention backends by name. Backends are stateless, so one instance serves every layer."""

from __future__ import annotations

from collections.abc import Callable

from engine.runner.attention.backend import AttentionBackend


def _torch() -> AttentionBackend:
    from engine.runner.attention.torch_backend import TorchAttentionBackend
    return TorchAttentionBackend()


def _flash_attn() -> AttentionBackend:
    from engine.runner.attention.flash_attn_backend import FlashAttentionBackend
    return FlashAttentionBackend()


def _triton() -> AttentionBackend:
    from engine.runner.attention.triton_backend import TritonAttentionBackend
    return TritonAttentionBackend()


_BACKENDS: dict[str, Callable[[], AttentionBackend]] = {
    "torch": _torch,
    "flash_attn": _flash_attn,
    "triton": _triton,
}


def available_attention_backends() -> list[str]:
    return sorted(_BACKENDS)


def torch_only_error(name: str, feature: str) -> str:
    return f"attention_backend {name!r} cannot run {feature}; use attention_backend 'torch'"


def get_attention_backend(name: str | AttentionBackend, torch_only: str | None = None) -> AttentionBackend:
    """The backend called ``name`` ('torch', 'flash_attn' or 'triton'); an instance is passed through.
    ``torch_only``: what of the model only the torch backend computes (a model class's
    ``torch_attention_only``); another backend is then refused by name before it is built."""
    if torch_only is not None:
        requested = name if isinstance(name, str) else name.name
        if requested != "torch":
            raise ValueError(torch_only_error(requested, torch_only))
    if isinstance(name, AttentionBackend):
        return name
    try:
        factory = _BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown attention backend {name!r}; choose one of {available_attention_backends()}") from None
    return factory()
