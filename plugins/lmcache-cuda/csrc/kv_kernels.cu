// Generic strided KV copy between paged engine buffers and LMCache objects.
//
// Every EngineKVFormat reduces, per (KV, layer) plane, to the same addressing: a token row
// at `base + block * block_stride + token * row_stride`, heads at `head_stride`, and a
// contiguous run of `width` bytes per head. The host side computes those numbers from
// torch views, so one kernel serves NHD, HND, MLA, fused K|V and cross-layer layouts.
#include "kv_kernels.h"

#include <algorithm>
#include <cstdint>

namespace lmcache_cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxGridY = 65535;

template <typename V>
__global__ void kv_copy_kernel(KvCopyParams p, int32_t plane_base) {
  const int32_t plane = plane_base + static_cast<int32_t>(blockIdx.y);
  if (plane >= p.num_planes) return;
  const int64_t* pl = p.planes + 4 * static_cast<int64_t>(plane);
  char* const eng_plane = reinterpret_cast<char*>(pl[0]);
  const int64_t kv = pl[1];
  const int64_t layer = pl[2];
  const int64_t col = pl[3];

  const uint32_t units = static_cast<uint32_t>(p.width_bytes / static_cast<int64_t>(sizeof(V)));
  const uint32_t heads = static_cast<uint32_t>(p.num_heads);
  const uint32_t per_item = static_cast<uint32_t>(p.rows) * heads * units;

  const int64_t first = static_cast<int64_t>(blockIdx.x) * p.items_per_cta;
  const int64_t last = first + p.items_per_cta < p.num_work ? first + p.items_per_cta : p.num_work;
  for (int64_t item = first; item < last; ++item) {
    const int64_t* w = p.work + 4 * item;
    char* const eng = eng_plane + w[0];
    char* const obj = reinterpret_cast<char*>(w[1]) + kv * w[2] + layer * w[3] + col;
    for (uint32_t i = threadIdx.x; i < per_item; i += blockDim.x) {
      const uint32_t u = i % units;
      const uint32_t rest = i / units;
      const uint32_t h = rest % heads;
      const uint32_t r = rest / heads;
      V* e = reinterpret_cast<V*>(eng + r * p.eng_row_stride + h * p.eng_head_stride) + u;
      V* o = reinterpret_cast<V*>(obj + r * p.obj_row_stride + h * p.obj_head_stride) + u;
      if (p.to_engine) {
        *e = *o;
      } else {
        *o = *e;
      }
    }
  }
}

template <typename V>
cudaError_t launch_typed(const KvCopyParams& p, cudaStream_t stream) {
  const int64_t ctas = (p.num_work + p.items_per_cta - 1) / p.items_per_cta;
  if (ctas > 0x7fffffff) return cudaErrorInvalidConfiguration;
  for (int32_t base = 0; base < p.num_planes; base += kMaxGridY) {
    const int32_t planes = std::min(p.num_planes - base, kMaxGridY);
    dim3 grid(static_cast<unsigned>(ctas), static_cast<unsigned>(planes));
    kv_copy_kernel<V><<<grid, kThreads, 0, stream>>>(p, base);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

__global__ void noop_kernel(int* out) {
  if (out != nullptr) *out = 1;
}

}  // namespace

cudaError_t launch_kv_copy(const KvCopyParams& p, cudaStream_t stream) {
  if (p.num_work <= 0 || p.num_planes <= 0 || p.width_bytes <= 0 || p.rows <= 0) {
    return cudaSuccess;
  }
  if (p.items_per_cta <= 0) return cudaErrorInvalidValue;
  switch (p.vec) {
    case 16: return launch_typed<uint4>(p, stream);
    case 8: return launch_typed<uint2>(p, stream);
    case 4: return launch_typed<uint32_t>(p, stream);
    case 2: return launch_typed<uint16_t>(p, stream);
    case 1: return launch_typed<uint8_t>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t probe_kernel_image(int device) {
  int previous = 0;
  cudaError_t err = cudaGetDevice(&previous);
  if (err != cudaSuccess) return err;
  err = cudaSetDevice(device);
  if (err != cudaSuccess) return err;
  cudaStream_t stream = nullptr;
  err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err == cudaSuccess) {
    noop_kernel<<<1, 1, 0, stream>>>(nullptr);
    err = cudaGetLastError();
    const cudaError_t sync = cudaStreamSynchronize(stream);
    if (err == cudaSuccess) err = sync;
    cudaStreamDestroy(stream);
  }
  cudaSetDevice(previous);
  return err;
}

}  // namespace lmcache_cuda
