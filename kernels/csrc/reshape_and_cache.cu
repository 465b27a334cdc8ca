// reshape_and_cache as a CUDA kernel: same contract and same bytes as kernels/reshape_and_cache.py.
//
// One thread block per token; padding tokens (slot -1) return at once. Two paths:
//  * vectorized copy: cache dtype == key dtype and every row involved is contiguous and 16-byte
//    aligned, so each thread moves 16 bytes (uint4) per step, the widest global access there is;
//  * element-wise: any strides, and the fp8 conversion (value / scale, saturated to +-448, rounded to
//    nearest even by c10::Float8_e4m3fn, exactly as torch's .to(torch.float8_e4m3fn)).
// Built on first use by kernels/cuda_reshape_and_cache.py (torch.utils.cpp_extension.load) and
// registered as the operator torch.ops.servesim.reshape_and_cache: an operator needs only ATen and
// torch/library.h, where a pybind module needs torch/extension.h, which triples the compile time.

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

// c10's stream header rather than ATen/cuda/CUDAContext.h, which drags in cuBLAS/cuSPARSE headers that
// a minimal CUDA toolkit (nvcc and the runtime only) does not ship.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Float8_e4m3fn.h>

#include <cstdint>

namespace {

constexpr float kFp8Max = 448.0f;
constexpr int kMaxThreads = 256;

struct CacheLayout {
  int64_t block_size;
  int64_t stride_block;
  int64_t stride_offset;
  int64_t stride_head;
  int64_t stride_dim;

  __device__ __forceinline__ int64_t slot_base(int64_t slot) const {
    return (slot / block_size) * stride_block + (slot % block_size) * stride_offset;
  }
};

struct TokenLayout {
  int64_t stride_token;
  int64_t stride_head;
  int64_t stride_dim;
};

template <typename scalar_t, typename cache_t, bool kFp8>
__device__ __forceinline__ cache_t convert(scalar_t x, float scale) {
  if constexpr (kFp8) {
    // IEEE division (nvcc's default -prec-div=true), as the torch reference does it.
    float v = static_cast<float>(x) / scale;
    if (!isnan(v)) v = fminf(fmaxf(v, -kFp8Max), kFp8Max);
    return cache_t(v);
  } else {
    return x;
  }
}

template <typename slot_t>
__global__ void copy_rows_kernel(const uint4* __restrict__ key, const uint4* __restrict__ value,
                                 uint4* __restrict__ key_cache, uint4* __restrict__ value_cache,
                                 const slot_t* __restrict__ slot_mapping, int64_t key_stride_token,
                                 int64_t value_stride_token, CacheLayout cache, int vectors_per_row) {
  // Strides and the cache layout are given in 16-byte vectors here.
  const int64_t token = blockIdx.x;
  const int64_t slot = static_cast<int64_t>(slot_mapping[token]);
  if (slot < 0) return;
  const uint4* key_row = key + token * key_stride_token;
  const uint4* value_row = value + token * value_stride_token;
  const int64_t base = cache.slot_base(slot);
  for (int i = threadIdx.x; i < vectors_per_row; i += blockDim.x) {
    key_cache[base + i] = key_row[i];
    value_cache[base + i] = value_row[i];
  }
}

template <typename scalar_t, typename cache_t, bool kFp8, typename slot_t>
__global__ void reshape_and_cache_kernel(const scalar_t* __restrict__ key, const scalar_t* __restrict__ value,
                                         cache_t* __restrict__ key_cache, cache_t* __restrict__ value_cache,
                                         const slot_t* __restrict__ slot_mapping, TokenLayout key_layout,
                                         TokenLayout value_layout, CacheLayout cache, int head_size,
                                         int num_elements, float k_scale, float v_scale) {
  const int64_t token = blockIdx.x;
  const int64_t slot = static_cast<int64_t>(slot_mapping[token]);
  if (slot < 0) return;
  const int64_t base = cache.slot_base(slot);
  for (int i = threadIdx.x; i < num_elements; i += blockDim.x) {
    const int64_t head = i / head_size;
    const int64_t dim = i % head_size;
    const int64_t target = base + head * cache.stride_head + dim * cache.stride_dim;
    const scalar_t k = key[token * key_layout.stride_token + head * key_layout.stride_head +
                           dim * key_layout.stride_dim];
    const scalar_t v = value[token * value_layout.stride_token + head * value_layout.stride_head +
                             dim * value_layout.stride_dim];
    key_cache[target] = convert<scalar_t, cache_t, kFp8>(k, k_scale);
    value_cache[target] = convert<scalar_t, cache_t, kFp8>(v, v_scale);
  }
}

TokenLayout token_layout(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

bool row_vectorizable(const at::Tensor& t, int64_t head_size, int64_t row_bytes) {
  const int64_t element = t.element_size();
  const int rank = t.dim();
  bool ok = t.stride(rank - 1) == 1 && t.stride(rank - 2) == head_size && row_bytes % 16 == 0 &&
            reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  // Every stride that moves between rows must land on a 16-byte boundary too.
  for (int d = 0; d < rank - 2; ++d) ok = ok && (t.stride(d) * element) % 16 == 0;
  return ok;
}

int threads_for(int64_t work) {
  int threads = 32;
  while (threads < kMaxThreads && threads < work) threads *= 2;
  return threads;
}

template <typename slot_t>
void launch(const at::Tensor& key, const at::Tensor& value, const at::Tensor& key_cache,
            const at::Tensor& value_cache, const at::Tensor& slot_mapping, double k_scale, double v_scale) {
  const int64_t num_tokens = slot_mapping.size(0);
  const int64_t head_size = key_cache.size(3);
  const int64_t num_elements = key_cache.size(2) * head_size;
  const CacheLayout cache{key_cache.size(1), key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
                          key_cache.stride(3)};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool fp8 = key_cache.scalar_type() == at::ScalarType::Float8_e4m3fn;
  const int64_t row_bytes = num_elements * key.element_size();

  if (!fp8 && row_vectorizable(key, head_size, row_bytes) && row_vectorizable(value, head_size, row_bytes) &&
      row_vectorizable(key_cache, head_size, row_bytes) && row_vectorizable(value_cache, head_size, row_bytes)) {
    const int64_t per_vector = 16 / key.element_size();
    const CacheLayout vector_cache{cache.block_size, cache.stride_block / per_vector,
                                   cache.stride_offset / per_vector, 0, 0};
    const int vectors_per_row = static_cast<int>(row_bytes / 16);
    copy_rows_kernel<slot_t><<<num_tokens, threads_for(vectors_per_row), 0, stream>>>(
        static_cast<const uint4*>(key.data_ptr()), static_cast<const uint4*>(value.data_ptr()),
        static_cast<uint4*>(key_cache.data_ptr()), static_cast<uint4*>(value_cache.data_ptr()),
        slot_mapping.data_ptr<slot_t>(), key.stride(0) / per_vector, value.stride(0) / per_vector, vector_cache,
        vectors_per_row);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }

  AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, key.scalar_type(),
                                  "reshape_and_cache", [&] {
    const int threads = threads_for(num_elements);
    if (fp8) {
      reshape_and_cache_kernel<scalar_t, c10::Float8_e4m3fn, true, slot_t><<<num_tokens, threads, 0, stream>>>(
          key.data_ptr<scalar_t>(), value.data_ptr<scalar_t>(),
          static_cast<c10::Float8_e4m3fn*>(key_cache.data_ptr()),
          static_cast<c10::Float8_e4m3fn*>(value_cache.data_ptr()), slot_mapping.data_ptr<slot_t>(),
          token_layout(key), token_layout(value), cache, static_cast<int>(head_size),
          static_cast<int>(num_elements), static_cast<float>(k_scale), static_cast<float>(v_scale));
    } else {
      reshape_and_cache_kernel<scalar_t, scalar_t, false, slot_t><<<num_tokens, threads, 0, stream>>>(
          key.data_ptr<scalar_t>(), value.data_ptr<scalar_t>(), key_cache.data_ptr<scalar_t>(),
          value_cache.data_ptr<scalar_t>(), slot_mapping.data_ptr<slot_t>(), token_layout(key),
          token_layout(value), cache, static_cast<int>(head_size), static_cast<int>(num_elements), 1.0f, 1.0f);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

// Shapes were checked in Python (kernels/reshape_and_cache.check_reshape_and_cache_args); these checks
// guard what only the C++ side relies on.
void reshape_and_cache(const at::Tensor& key, const at::Tensor& value, const at::Tensor& key_cache,
                       const at::Tensor& value_cache, const at::Tensor& slot_mapping, double k_scale,
                       double v_scale) {
  TORCH_CHECK(key.is_cuda() && value.is_cuda() && key_cache.is_cuda() && value_cache.is_cuda() &&
                  slot_mapping.is_cuda(),
              "reshape_and_cache (CUDA): every tensor must be on a CUDA device");
  TORCH_CHECK(key.dim() == 3 && value.dim() == 3 && key_cache.dim() == 4 && value_cache.dim() == 4,
              "reshape_and_cache (CUDA): key/value are [tokens, heads, head_size], caches 4-d");
  TORCH_CHECK(key_cache.strides() == value_cache.strides(), "reshape_and_cache (CUDA): cache strides differ");
  TORCH_CHECK(key.scalar_type() == value.scalar_type(), "reshape_and_cache (CUDA): key and value dtypes differ");
  const bool fp8 = key_cache.scalar_type() == at::ScalarType::Float8_e4m3fn;
  TORCH_CHECK(fp8 || key_cache.scalar_type() == key.scalar_type(),
              "reshape_and_cache (CUDA): the cache dtype must equal the key dtype or be float8_e4m3fn, got ",
              key_cache.scalar_type(), " for keys of ", key.scalar_type());
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.is_contiguous(), "slot_mapping must be 1-d and contiguous");
  if (slot_mapping.size(0) == 0) return;
  const c10::cuda::CUDAGuard device_guard(key.device());
  if (slot_mapping.scalar_type() == at::ScalarType::Long) {
    launch<int64_t>(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale);
  } else {
    TORCH_CHECK(slot_mapping.scalar_type() == at::ScalarType::Int, "slot_mapping must be int32 or int64");
    launch<int32_t>(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale);
  }
}

TORCH_LIBRARY(servesim, m) {
  m.def(
      "reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
      "Tensor slot_mapping, float k_scale, float v_scale) -> ()");
}

TORCH_LIBRARY_IMPL(servesim, CUDA, m) { m.impl("reshape_and_cache", &reshape_and_cache); }
