"""Where the Triton kernels can run, decided without importing triton.

The project must import, and its tests pass, on a machine with no triton, no GPU and no compiler, so
nothing outside the ``kernels/triton_*.py`` modules imports triton, and those modules are imported only
when a Triton kernel is actually asked for.

Triton decides *when a kernel is decorated* (i.e. when its module is imported) whether it is compiled
for the GPU or run by the CPU interpreter (``TRITON_INTERPRET=1``). Setting the variable later has no
effect on kernels already imported, which is why each kernel module records the mode it was imported in.
"""

from __future__ import annotations

import importlib.util
import os

import torch


class TritonUnavailableError(RuntimeError):
    """A Triton kernel was asked for where it cannot run; the message says what is missing."""


def interpreter_enabled() -> bool:
    """True when ``TRITON_INTERPRET`` is set the way triton reads it (kernels then run on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def triton_unavailable_reason() -> str | None:
    """Why Triton kernels cannot run in this process, or None when they can."""
    if importlib.util.find_spec("triton") is None:
        return "the triton package is not installed (pip install 'servesim[triton]')"
    if not torch.cuda.is_available() and not interpreter_enabled():
        return ("no CUDA device is available (TRITON_INTERPRET=1, set before triton is imported, runs the "
                "kernels on CPU tensors through the slow interpreter)")
    return None


def check_launchable(kernel_name: str, interpreted: bool, *tensors: torch.Tensor) -> None:
    """Refuse, with a clear message, tensors the kernel cannot read: mixed devices, or CPU when compiled."""
    devices = {tensor.device for tensor in tensors}
    if len(devices) != 1:
        raise ValueError(f"{kernel_name}: tensors are on different devices {sorted(str(d) for d in devices)}")
    device = devices.pop()
    if device.type == "cuda" and not interpreted:
        return
    if device.type == "cpu" and interpreted:
        return
    mode = "the CPU interpreter (TRITON_INTERPRET=1 at import)" if interpreted else "CUDA"
    raise TritonUnavailableError(f"{kernel_name} was imported for {mode} and cannot run on {device} tensors")


def next_power_of_2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()
