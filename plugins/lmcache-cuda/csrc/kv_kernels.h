// Plain-C++ interface of the CUDA copy kernels: no nanobind and no torch here, so the .cu
// file compiles with nvcc alone and module.cpp with the host compiler alone.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace lmcache_cuda {

// One launch moves `rows` token rows per work item, for every (work item, plane) pair.
// A plane is one (KV, layer) slab of the engine cache: planes[p] = {engine_base, kv, layer,
// col_bytes}. A work item is one engine block (block ops) or one token (slot ops):
// work[w] = {engine_offset, object_base, object_kv_stride, object_layer_stride}, all bytes.
// Every address and stride is a multiple of `vec` bytes (the host side checks that).
struct KvCopyParams {
  const int64_t* planes = nullptr;
  int32_t num_planes = 0;
  const int64_t* work = nullptr;
  int64_t num_work = 0;
  int32_t rows = 1;
  int32_t num_heads = 1;
  int64_t width_bytes = 0;
  int64_t eng_row_stride = 0;
  int64_t eng_head_stride = 0;
  int64_t obj_row_stride = 0;
  int64_t obj_head_stride = 0;
  int32_t to_engine = 0;
  int32_t vec = 1;
  int32_t items_per_cta = 1;
};

cudaError_t launch_kv_copy(const KvCopyParams& params, cudaStream_t stream);

// A no-op kernel launched and synchronized on a private stream: surfaces "no kernel image
// for this device" and driver problems before any real work is routed to the native path.
cudaError_t probe_kernel_image(int device);

}  // namespace lmcache_cuda
