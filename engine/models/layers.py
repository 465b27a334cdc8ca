"""Small building blocks shared by the Llama family (and Gemma): RMSNorm and the gated MLP with a fused gate/up."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in float32 and cast back before the weight, as the reference implementation does, so
        # half-precision results round the same way.
        dtype = x.dtype
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# Gate activations by the names configs give them (transformers maps each group to one function).
GATE_ACTIVATIONS = {"silu": F.silu, "swish": F.silu, "gelu_pytorch_tanh": _gelu_tanh, "gelu_tanh": _gelu_tanh}


class SwiGLUMLP(nn.Module):
    """down(act(gate(x)) * up(x)), with gate and up as one [2 * intermediate, hidden] matmul: SiLU for the Llama
    family (SwiGLU), tanh-GELU for Gemma (``hidden_act`` picks it, by ``GATE_ACTIVATIONS``)."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool, hidden_act: str = "silu") -> None:
        super().__init__()
        if hidden_act not in GATE_ACTIVATIONS:
            raise ValueError(f"unsupported hidden_act {hidden_act!r}; supported: {', '.join(GATE_ACTIVATIONS)}")
        self.activation = GATE_ACTIVATIONS[hidden_act]
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(self.activation(gate) * up)
