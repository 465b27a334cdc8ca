"""reshape_and_cache as a CUDA kernel (``kernels/csrc/reshape_and_cache.cu``), built on first use.

The source is compiled with ``torch.utils.cpp_extension.load`` the first time the kernel is called in a
process (about 20-60 s, once per machine: the build directory is a cache keyed by the torch and CUDA
versions, under ``$SERVESIM_EXTENSIONS_DIR`` or ``$XDG_CACHE_HOME/servesim/torch_extensions``, default
``~/.cache/servesim/torch_extensions``). It registers the operator ``torch.ops.servesim.reshape_and_cache``.

Where it cannot be built or run, ``CudaKernelUnavailableError`` names everything that is missing: a
torch built with CUDA, a CUDA device, the CUDA toolkit (``nvcc``), a C++ compiler, ninja.

The cache dtype must equal the key dtype or be float8_e4m3fn (the torch reference also casts between
other float dtypes; this kernel refuses that instead of guessing a rounding).
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import torch

from kernels.fp8 import Scale, check_scale, is_fp8
from kernels.reshape_and_cache import check_reshape_and_cache_args

SOURCE = Path(__file__).parent / "csrc" / "reshape_and_cache.cu"
EXTENSION_NAME = "servesim_reshape_and_cache"


class CudaKernelUnavailableError(RuntimeError):
    """The CUDA kernel cannot be built or run here; the message lists what is missing."""


def missing_requirements() -> list[str]:
    """What this machine lacks to build and run the kernel, in words (empty when nothing is missing)."""
    from torch.utils import cpp_extension

    missing = []
    if torch.version.cuda is None:
        missing.append(f"a CUDA build of torch (this is {torch.__version__}, built without CUDA)")
    elif not torch.cuda.is_available():
        missing.append("a CUDA device (torch.cuda.is_available() is False)")
    # torch leaves CUDA_HOME unset in CPU builds, so look for the toolkit independently of it.
    cuda_home = cpp_extension.CUDA_HOME or os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = str(Path(cuda_home) / "bin" / "nvcc") if cuda_home else shutil.which("nvcc")
    if nvcc is None or not Path(nvcc).exists():
        where = f"in {cuda_home}/bin" if cuda_home else "on PATH, and CUDA_HOME is not set"
        missing.append(f"the CUDA toolkit (nvcc not found {where})")
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        missing.append(f"a C++ compiler ({compiler!r} is not on PATH; set CXX or install g++)")
    if shutil.which("ninja") is None and not _ninja_module_available():
        missing.append("ninja (pip install ninja)")
    return missing


def build_directory() -> Path:
    root = os.environ.get("SERVESIM_EXTENSIONS_DIR")
    if root is None:
        cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(cache) / "servesim" / "torch_extensions")
    # Keyed by versions: an object built against another torch or CUDA must never be loaded.
    return Path(root) / f"{EXTENSION_NAME}_torch{torch.__version__}_cuda{torch.version.cuda}".replace("+", "_")


@functools.cache
def load_extension() -> None:
    """Build (once per machine) and load the operator; raises CudaKernelUnavailableError when it can't."""
    missing = missing_requirements()
    if missing:
        raise CudaKernelUnavailableError("the CUDA reshape_and_cache kernel cannot be built or run here; missing: "
                                         + "; ".join(missing))
    from torch.utils import cpp_extension

    _put_ninja_on_path()
    directory = build_directory()
    directory.mkdir(parents=True, exist_ok=True)
    try:
        cpp_extension.load(name=EXTENSION_NAME, sources=[str(SOURCE)], build_directory=str(directory),
                           extra_cuda_cflags=["-O3", "-lineinfo"], is_python_module=False, verbose=False)
    except (RuntimeError, OSError, ImportError) as error:
        raise CudaKernelUnavailableError(f"building the CUDA reshape_and_cache kernel in {directory} failed: "
                                         f"{error}") from error


def cuda_reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: Scale = 1.0,
    v_scale: Scale = 1.0,
) -> None:
    """Same arguments and effect as ``kernels.reshape_and_cache.reshape_and_cache``, on CUDA tensors."""
    check_reshape_and_cache_args(key, value, key_cache, value_cache, slot_mapping)
    if is_fp8(key_cache.dtype):
        check_scale("k_scale", k_scale)
        check_scale("v_scale", v_scale)
    load_extension()
    torch.ops.servesim.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping.contiguous(),
                                         float(k_scale), float(v_scale))


def _ninja_module_available() -> bool:
    # torch runs ninja as a program; the pip package puts it in the venv's bin, which may not be on PATH.
    try:
        import ninja
    except ImportError:
        return False
    return Path(ninja.BIN_DIR, "ninja").exists()


def _put_ninja_on_path() -> None:
    if shutil.which("ninja") is None and _ninja_module_available():
        import ninja
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
