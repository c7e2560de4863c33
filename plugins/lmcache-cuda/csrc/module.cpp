// nanobind module `lmcache_cuda._native`: thin bindings over the CUDA runtime (linked
// statically, so the wheel needs no libcudart and never links libtorch).
//
// Tensors arrive as DLPack arrays (nb::ndarray) or raw addresses; streams as the integer
// handle torch reports (`torch.cuda.current_stream().cuda_stream`). Every launch releases
// the GIL. Errors come back as RuntimeError with the CUDA error name.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>

#include <cuda_runtime_api.h>

#include "kv_kernels.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using PlaneArray = nb::ndarray<const int64_t, nb::ndim<2>, nb::device::cuda, nb::c_contig>;

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    // Clear the sticky-free error so the next call starts clean.
    cudaGetLastError();
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorName(err) + " (" +
                             cudaGetErrorString(err) + ")");
  }
}

cudaStream_t as_stream(uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

void kv_copy(const PlaneArray& planes, const PlaneArray& work, int32_t rows, int32_t num_heads,
             int64_t width_bytes, int64_t eng_row_stride, int64_t eng_head_stride,
             int64_t obj_row_stride, int64_t obj_head_stride, bool to_engine, int32_t vec,
             int32_t items_per_cta, uintptr_t stream) {
  if (planes.shape(1) != 4 || work.shape(1) != 4) {
    throw std::invalid_argument("kv_copy: planes and work must be [N, 4] int64 arrays");
  }
  if (vec != 1 && vec != 2 && vec != 4 && vec != 8 && vec != 16) {
    throw std::invalid_argument("kv_copy: vec must be 1, 2, 4, 8 or 16");
  }
  if (width_bytes % vec != 0) {
    throw std::invalid_argument("kv_copy: width_bytes is not a multiple of vec");
  }
  lmcache_cuda::KvCopyParams p;
  p.planes = planes.data();
  p.num_planes = static_cast<int32_t>(planes.shape(0));
  p.work = work.data();
  p.num_work = static_cast<int64_t>(work.shape(0));
  p.rows = rows;
  p.num_heads = num_heads;
  p.width_bytes = width_bytes;
  p.eng_row_stride = eng_row_stride;
  p.eng_head_stride = eng_head_stride;
  p.obj_row_stride = obj_row_stride;
  p.obj_head_stride = obj_head_stride;
  p.to_engine = to_engine ? 1 : 0;
  p.vec = vec;
  p.items_per_cta = items_per_cta;
  cudaError_t err;
  {
    nb::gil_scoped_release release;
    err = lmcache_cuda::launch_kv_copy(p, as_stream(stream));
  }
  check(err, "kv_copy kernel launch");
}

// Copies `nbytes` in pieces that never cross a host registration boundary: the LMCache
// host buffer is registered (cudaHostRegister) in `alignment`-byte segments, and one DMA
// spanning two registrations is not allowed to assume both are pinned.
void memcpy_async(uintptr_t dest, uintptr_t src, int64_t nbytes, int direction,
                  int64_t host_offset, int64_t alignment, uintptr_t stream) {
  if (nbytes < 0) throw std::invalid_argument("nbytes must be non-negative");
  if (direction != 0 && direction != 1) {
    throw std::invalid_argument("direction must be 0 (H2D) or 1 (D2H)");
  }
  if (host_offset < 0) throw std::invalid_argument("host_buffer_offset must be non-negative");
  cudaError_t err = cudaSuccess;
  {
    nb::gil_scoped_release release;
    int64_t done = 0;
    while (done < nbytes && err == cudaSuccess) {
      int64_t piece = nbytes - done;
      if (alignment > 0) {
        const int64_t into_segment = (host_offset + done) % alignment;
        piece = std::min<int64_t>(piece, alignment - into_segment);
      }
      err = cudaMemcpyAsync(reinterpret_cast<void*>(dest + done),
                            reinterpret_cast<const void*>(src + done),
                            static_cast<size_t>(piece), cudaMemcpyDefault, as_stream(stream));
      done += piece;
    }
  }
  check(err, "cudaMemcpyAsync");
}

// The device-visible address of `ptr`: itself for device memory, the mapped alias for
// registered/pinned host memory, 0 for pageable host memory the GPU cannot reach.
uintptr_t device_address(uintptr_t ptr) {
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, reinterpret_cast<const void*>(ptr));
  if (err != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (attr.type == cudaMemoryTypeUnregistered) return 0;
  return reinterpret_cast<uintptr_t>(attr.devicePointer);
}

int pointer_device(uintptr_t ptr) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, reinterpret_cast<const void*>(ptr)) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return attr.type == cudaMemoryTypeUnregistered ? -1 : attr.device;
}

int device_count() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

// Empty string when a kernel of this module runs on `device`, else the reason it cannot.
std::string probe(int device) {
  cudaError_t err;
  {
    nb::gil_scoped_release release;
    err = lmcache_cuda::probe_kernel_image(device);
  }
  if (err == cudaSuccess) return {};
  cudaGetLastError();
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

int host_register(uintptr_t ptr, int64_t size, unsigned flags) {
  const cudaError_t err =
      cudaHostRegister(reinterpret_cast<void*>(ptr), static_cast<size_t>(size), flags);
  if (err != cudaSuccess) cudaGetLastError();
  return static_cast<int>(err);
}

int host_unregister(uintptr_t ptr) {
  const cudaError_t err = cudaHostUnregister(reinterpret_cast<void*>(ptr));
  if (err != cudaSuccess) cudaGetLastError();
  return static_cast<int>(err);
}

std::string error_name(int code) { return cudaGetErrorName(static_cast<cudaError_t>(code)); }

std::tuple<int, int> versions() {
  int runtime = 0;
  int driver = 0;
  cudaRuntimeGetVersion(&runtime);
  if (cudaDriverGetVersion(&driver) != cudaSuccess) cudaGetLastError();
  return {runtime, driver};
}

}  // namespace

NB_MODULE(_native, m) {
  m.doc() = "lmcache-cuda native kernels (CUDA runtime linked statically; no libtorch).";
  m.attr("COMPILED_ARCHS") = LMCACHE_CUDA_ARCHS;
  m.def("kv_copy", &kv_copy, "planes"_a, "work"_a, "rows"_a, "num_heads"_a, "width_bytes"_a,
        "eng_row_stride"_a, "eng_head_stride"_a, "obj_row_stride"_a, "obj_head_stride"_a,
        "to_engine"_a, "vec"_a, "items_per_cta"_a, "stream"_a);
  m.def("memcpy_async", &memcpy_async, "dest"_a, "src"_a, "nbytes"_a, "direction"_a,
        "host_offset"_a, "alignment"_a, "stream"_a);
  m.def("device_address", &device_address, "ptr"_a);
  m.def("pointer_device", &pointer_device, "ptr"_a);
  m.def("device_count", &device_count);
  m.def("probe", &probe, "device"_a);
  m.def("host_register", &host_register, "ptr"_a, "size"_a, "flags"_a = 0);
  m.def("host_unregister", &host_unregister, "ptr"_a);
  m.def("error_name", &error_name, "code"_a);
  m.def("versions", &versions);
}
