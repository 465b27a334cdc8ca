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


def get_attention_backend(name: str | AttentionBackend) -> AttentionBackend:
    """The backend called ``name`` ('torch', 'flash_attn' or 'triton'); an instance is passed through."""
    if isinstance(name, AttentionBackend):
        return name
    try:
        factory = _BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown attention backend {name!r}; choose one of {available_attention_backends()}") from None
    return factory()
