// Native plan value types.  Exposing them from the native module lets
// DeviceOps.bind_native overlay the NotImplementedError stubs of ops_types.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lmcache_cpu {

struct StagingCopy {
  uint64_t dest = 0;
  uint64_t src = 0;
  uint64_t nbytes = 0;
  uint64_t host_offset = 0;  // offset inside the LMCache host allocator (src for H2D, dest for D2H)
};

struct LaunchVar {
  int64_t group_idx = 0;
  int64_t block_ids_offset = 0;
  int64_t total_blocks = 0;
  int64_t num_objects = 0;
  int64_t skip_prefix_n_blocks = 0;
};

struct BatchStep {
  std::vector<StagingCopy> staging;
  std::vector<LaunchVar> launches;
};

struct KernelGroupSpec {
  uint64_t paged_buffer_ptrs = 0;
  std::vector<uint64_t> lmcache_objects_ptrs;
  nanobind::object shape_desc;  // the caller's PageBufferShapeDesc, kept as is
  int64_t lmcache_chunk_size = 0;
  int64_t engine_kv_format = 0;
  int64_t block_ids_base = 0;
  int64_t block_ids_capacity = 0;
};

inline void bind_plan_types(nanobind::module_& m) {
  namespace nb = nanobind;
  using namespace nb::literals;

  nb::class_<StagingCopy>(m, "StagingCopy", "One host<->device staging copy of a transfer plan.")
      .def(nb::init<>())
      .def(
          "__init__",
          [](StagingCopy* self, uint64_t dest, uint64_t src, uint64_t nbytes, uint64_t host_offset) {
            new (self) StagingCopy{dest, src, nbytes, host_offset};
          },
          "dest"_a, "src"_a, "nbytes"_a, "host_offset"_a)
      .def_rw("dest", &StagingCopy::dest)
      .def_rw("src", &StagingCopy::src)
      .def_rw("nbytes", &StagingCopy::nbytes)
      .def_rw("host_offset", &StagingCopy::host_offset)
      .def("__repr__", [](const StagingCopy& s) {
        return "StagingCopy(dest=" + std::to_string(s.dest) + ", src=" + std::to_string(s.src) +
               ", nbytes=" + std::to_string(s.nbytes) +
               ", host_offset=" + std::to_string(s.host_offset) + ")";
      });

  nb::class_<LaunchVar>(m, "LaunchVar", "One kernel launch of a transfer plan.")
      .def(nb::init<>())
      .def(
          "__init__",
          [](LaunchVar* self, int64_t group_idx, int64_t block_ids_offset, int64_t total_blocks,
             int64_t num_objects, int64_t skip) {
            new (self) LaunchVar{group_idx, block_ids_offset, total_blocks, num_objects, skip};
          },
          "group_idx"_a, "block_ids_offset"_a, "total_blocks"_a, "num_objects"_a,
          "skip_prefix_n_blocks"_a)
      .def_rw("group_idx", &LaunchVar::group_idx)
      .def_rw("block_ids_offset", &LaunchVar::block_ids_offset)
      .def_rw("total_blocks", &LaunchVar::total_blocks)
      .def_rw("num_objects", &LaunchVar::num_objects)
      .def_rw("skip_prefix_n_blocks", &LaunchVar::skip_prefix_n_blocks)
      .def("__repr__", [](const LaunchVar& v) {
        return "LaunchVar(group_idx=" + std::to_string(v.group_idx) +
               ", block_ids_offset=" + std::to_string(v.block_ids_offset) +
               ", total_blocks=" + std::to_string(v.total_blocks) +
               ", num_objects=" + std::to_string(v.num_objects) +
               ", skip_prefix_n_blocks=" + std::to_string(v.skip_prefix_n_blocks) + ")";
      });

  nb::class_<BatchStep>(m, "BatchStep",
                        "One plan step: H2D stages before its launches, D2H after them.")
      .def(nb::init<>())
      .def(
          "__init__",
          [](BatchStep* self, std::vector<StagingCopy> staging, std::vector<LaunchVar> launches) {
            new (self) BatchStep{std::move(staging), std::move(launches)};
          },
          "staging"_a, "launches"_a)
      .def_rw("staging", &BatchStep::staging)
      .def_rw("launches", &BatchStep::launches)
      .def("__repr__", [](const BatchStep& b) {
        return "BatchStep(" + std::to_string(b.staging.size()) + " staging copies, " +
               std::to_string(b.launches.size()) + " launches)";
      });

  nb::class_<KernelGroupSpec>(m, "KernelGroupSpec",
                              "Backend-agnostic descriptor of one blocked-transfer kernel group.")
      .def(
          "__init__",
          [](KernelGroupSpec* self, uint64_t paged_buffer_ptrs, std::vector<uint64_t> objects,
             nb::object shape_desc, int64_t chunk, int64_t fmt, int64_t base, int64_t capacity) {
            new (self) KernelGroupSpec{paged_buffer_ptrs, std::move(objects), std::move(shape_desc),
                                       chunk, fmt, base, capacity};
          },
          "paged_buffer_ptrs"_a, "lmcache_objects_ptrs"_a, "shape_desc"_a, "lmcache_chunk_size"_a,
          "engine_kv_format"_a, "block_ids_base"_a, "block_ids_capacity"_a)
      .def_rw("paged_buffer_ptrs", &KernelGroupSpec::paged_buffer_ptrs)
      .def_rw("lmcache_objects_ptrs", &KernelGroupSpec::lmcache_objects_ptrs)
      .def_rw("shape_desc", &KernelGroupSpec::shape_desc)
      .def_rw("lmcache_chunk_size", &KernelGroupSpec::lmcache_chunk_size)
      .def_rw("engine_kv_format", &KernelGroupSpec::engine_kv_format)
      .def_rw("block_ids_base", &KernelGroupSpec::block_ids_base)
      .def_rw("block_ids_capacity", &KernelGroupSpec::block_ids_capacity)
      .def("__repr__", [](const KernelGroupSpec& k) {
        return "KernelGroupSpec(engine_kv_format=" + std::to_string(k.engine_kv_format) +
               ", objects=" + std::to_string(k.lmcache_objects_ptrs.size()) +
               ", lmcache_chunk_size=" + std::to_string(k.lmcache_chunk_size) +
               ", block_ids_base=" + std::to_string(k.block_ids_base) +
               ", block_ids_capacity=" + std::to_string(k.block_ids_capacity) + ")";
      });
}

}  // namespace lmcache_cpu
