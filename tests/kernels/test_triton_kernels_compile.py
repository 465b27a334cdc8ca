"""The Triton kernels compile for a Hopper GPU (sm_90) on this machine, GPU or not.

The CPU interpreter runs kernels as Python and skips Triton's compiler, so a kernel can pass every
interpreter test and still be rejected by the compiler (loop-carried types, constexpr misuse, shapes
``tl.dot`` refuses). Compiling ahead of time for a named target needs no GPU, only Triton's bundled
NVIDIA backend, so this closes that gap on CPU-only machines. It runs in a subprocess because the
kernels must be imported with ``TRITON_INTERPRET`` unset, and this process imported them interpreted.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from kernels import triton_paged_attention as attention, triton_reshape_and_cache as cache

    def compile_for_sm90(kernel, types, constexprs, num_warps=4):
        # Every argument not given a type is an int32 (strides, sizes).
        signature = {name: types.get(name, "i32") for name in kernel.arg_names if name not in constexprs}
        signature.update({name: "constexpr" for name in constexprs})
        compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
        assert compiled.asm["cubin"], kernel.__name__

    for fp8, contiguous in ((False, True), (True, False)):
        cache_type = "*fp8e4nv" if fp8 else "*bf16"
        compile_for_sm90(cache._reshape_and_cache_kernel,
                         {"key_ptr": "*bf16", "value_ptr": "*bf16", "key_cache_ptr": cache_type,
                          "value_cache_ptr": cache_type, "slot_mapping_ptr": "*i64", "k_scale": "fp32",
                          "v_scale": "fp32"},
                         dict(BLOCK_SIZE=16, ELEMENTS=1024, FP8=fp8, FP8_MAX_VALUE=448.0, CONTIGUOUS_ROWS=contiguous))

    # Full attention (what every model ran before windows and caps), a sliding window with and without
    # splits, the soft cap (Gemma 2) with and without a window and splits, and sinks (gpt-oss) with a window,
    # with and without splits; spans attended both ways (Gemma 3's images) with a window and a soft cap.
    for dtype, cache_type, splits, block_m, window, soft_cap, sinks, spans in (
            ("bf16", "*bf16", 1, 64, False, False, False, False), ("fp16", "*fp8e4nv", 4, 16, True, False, False, False),
            ("bf16", "*bf16", 1, 64, True, False, False, False), ("bf16", "*bf16", 1, 64, True, True, False, False),
            ("bf16", "*bf16", 4, 16, False, True, False, False), ("bf16", "*bf16", 1, 64, True, False, True, False),
            ("bf16", "*bf16", 4, 16, True, False, True, False), ("bf16", "*bf16", 1, 64, True, True, False, True)):
        compile_for_sm90(attention._paged_attention_kernel,
                         {"output_ptr": "*" + dtype, "query_ptr": "*" + dtype, "key_cache_ptr": cache_type,
                          "value_cache_ptr": cache_type, "block_table_ptr": "*i32", "seq_lens_ptr": "*i32",
                          "query_start_loc_ptr": "*i32", "partial_out_ptr": "*fp32", "partial_max_ptr": "*fp32",
                          "partial_sum_ptr": "*fp32", "sinks_ptr": "*fp32", "span_start_ptr": "*i32",
                          "span_end_ptr": "*i32", "softmax_scale_log2": "fp32", "v_scale": "fp32",
                          "soft_cap_log2": "fp32"},
                         dict(GROUP=4, GROUP_PADDED=4, BLOCK_Q=block_m // 4, BLOCK_M=block_m, HEAD_PADDED=128,
                              BLOCK_SIZE=16, TILE=attention.TILE_N, NUM_SPLITS=splits, DOT_PRECISION="tf32",
                              DOT_IN_FP32=False, HAS_WINDOW=window, HAS_SOFT_CAP=soft_cap, HAS_SINKS=sinks,
                              HAS_SPANS=spans))
    for sinks in (False, True):
        compile_for_sm90(attention._combine_splits_kernel,
                         {"output_ptr": "*fp16", "partial_out_ptr": "*fp32", "partial_max_ptr": "*fp32",
                          "partial_sum_ptr": "*fp32", "query_start_loc_ptr": "*i32", "sinks_ptr": "*fp32"},
                         dict(NUM_SPLITS=4, SPLITS_PADDED=4, HEAD_PADDED=128, HAS_SINKS=sinks), num_warps=2)
    print("ok")
""")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_kernels_compile_for_sm90_without_a_gpu():
    if importlib.util.find_spec("triton.backends.nvidia") is None:
        pytest.skip("this triton has no NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # today's default, stated to silence triton's warning
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr[-4000:]
