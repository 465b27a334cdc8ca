"""Attention backends by name. Backends are stateless, so one instance serves every layer."""

from __future__ import annotations

from collections.abc import Callable, Mapping

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


def check_backend_supports_model(name: str, unsupported: Mapping[str, str]) -> None:
    """``unsupported``: a model class's ``unsupported_attention_backends`` (backend -> what of the model it cannot
    run); ``name`` among them is refused by name, with the backends that can run the model."""
    if name in unsupported:
        others = " or ".join(repr(other) for other in sorted(_BACKENDS, reverse=True) if other not in unsupported)
        raise ValueError(f"attention_backend {name!r} cannot run {unsupported[name]}; use attention_backend {others}")


def get_attention_backend(name: str | AttentionBackend,
                          unsupported: Mapping[str, str] | None = None) -> AttentionBackend:
    """The backend called ``name`` ('torch', 'flash_attn' or 'triton'); an instance is passed through.
    ``unsupported``: as for ``check_backend_supports_model``, checked before the backend is built."""
    check_backend_supports_model(name if isinstance(name, str) else name.name, unsupported or {})
    if isinstance(name, AttentionBackend):
        return name
    try:
        factory = _BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown attention backend {name!r}; choose one of {available_attention_backends()}") from None
    return factory()
