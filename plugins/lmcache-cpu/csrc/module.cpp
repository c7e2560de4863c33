// nanobind bindings of the lmcache_cpu native kernels.
//
// The Python wrappers in lmcache_cpu/_ops.py turn the torch_ops call signatures (tensors,
// lists of tensors, enums, PageBufferShapeDesc) into base addresses and byte strides; this
// module only sees integers and DLPack arrays, so it never links against libtorch.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cdf.h"
#include "kv_copy.h"
#include "plan_types.h"
#include "thread_pool.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace lmcache_cpu {
namespace {

using IdArray = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using U64 = std::vector<uint64_t>;
using I64 = std::vector<int64_t>;

EngineSide make_engine(U64 bases, int64_t block_stride, int64_t tok_stride, int64_t head_stride,
                       int64_t num_blocks) {
  EngineSide e;
  e.bases = std::move(bases);
  e.block_stride = block_stride;
  e.tok_stride = tok_stride;
  e.head_stride = head_stride;
  e.num_blocks = num_blocks;
  return e;
}

void block_kv_copy(U64 eng_bases, int64_t eng_block_stride, int64_t eng_tok_stride,
                   int64_t eng_head_stride, int64_t num_blocks, int64_t bs, int64_t nh,
                   int64_t row_bytes, U64 obj_ptrs, I64 obj_tokens, I64 lp_slab, I64 lp_col,
                   int64_t obj_tok_stride, int64_t obj_head_stride, IdArray block_ids, int64_t skip,
                   int64_t blocks_per_object, bool to_engine) {
  EngineSide eng = make_engine(std::move(eng_bases), eng_block_stride, eng_tok_stride,
                               eng_head_stride, num_blocks);
  ObjectSide obj;
  obj.ptrs = std::move(obj_ptrs);
  obj.tokens = std::move(obj_tokens);
  obj.lp_slab = std::move(lp_slab);
  obj.lp_col = std::move(lp_col);
  obj.tok_stride = obj_tok_stride;
  obj.head_stride = obj_head_stride;
  const int64_t n = static_cast<int64_t>(block_ids.shape(0));
  const int64_t* ids = block_ids.data();
  nb::gil_scoped_release release;
  block_copy(eng, TileShape{bs, nh, row_bytes}, obj, ids, n, skip, blocks_per_object, to_engine);
}

void slot_kv_copy(U64 eng_bases, int64_t eng_block_stride, int64_t eng_tok_stride,
                  int64_t eng_head_stride, int64_t num_blocks, int64_t bs, int64_t nh,
                  int64_t row_bytes, U64 lmc_bases, int64_t lmc_tok_stride, int64_t lmc_head_stride,
                  IdArray slots, int64_t skip, bool to_engine) {
  EngineSide eng = make_engine(std::move(eng_bases), eng_block_stride, eng_tok_stride,
                               eng_head_stride, num_blocks);
  const int64_t n = static_cast<int64_t>(slots.shape(0));
  const int64_t* s = slots.data();
  nb::gil_scoped_release release;
  slot_copy(eng, TileShape{bs, nh, row_bytes}, lmc_bases, lmc_tok_stride, lmc_head_stride, s, n,
            skip, to_engine);
}

// One pass over the block ids instead of a dozen small torch ops in the wrapper:
// (valid ids after skip, highest valid id, last block slot each object must hold or -1).
nb::tuple block_summary(IdArray block_ids, int64_t skip, int64_t blocks_per_object) {
  if (blocks_per_object <= 0) throw std::invalid_argument("blocks_per_object must be positive");
  const int64_t n = static_cast<int64_t>(block_ids.shape(0));
  const int64_t* ids = block_ids.data();
  const int64_t objects = (n + blocks_per_object - 1) / blocks_per_object;
  std::vector<int64_t> last_slot(static_cast<size_t>(objects), -1);
  int64_t count = 0;
  int64_t highest = -1;
  for (int64_t j = std::max<int64_t>(0, skip); j < n; ++j) {
    if (ids[j] < 0) continue;
    ++count;
    highest = std::max(highest, ids[j]);
    last_slot[j / blocks_per_object] = j % blocks_per_object;
  }
  return nb::make_tuple(count, highest, last_slot);
}

// (highest slot after skip or None when there is none, valid slots, last valid position).
nb::tuple slot_summary(IdArray slots, int64_t skip) {
  const int64_t n = static_cast<int64_t>(slots.shape(0));
  const int64_t* s = slots.data();
  int64_t count = 0;
  int64_t last = -1;
  int64_t highest = 0;
  bool any = false;
  for (int64_t t = std::max<int64_t>(0, skip); t < n; ++t) {
    highest = any ? std::max(highest, s[t]) : s[t];
    any = true;
    if (s[t] >= 0) {
      ++count;
      last = t;
    }
  }
  return nb::make_tuple(any ? nb::cast(highest) : nb::none(), count, last);
}

void memcpy_bytes(uint64_t dst, uint64_t src, int64_t nbytes) {
  if (nbytes < 0) throw std::invalid_argument("nbytes must be non-negative");
  if (nbytes > 0 && (dst == 0 || src == 0)) throw std::invalid_argument("null pointer");
  nb::gil_scoped_release release;
  parallel_memcpy(dst, src, nbytes);
}

void batched_memcpy_bytes(U64 dsts, U64 srcs, I64 sizes) {
  nb::gil_scoped_release release;
  batched_memcpy(dsts, srcs, sizes);
}

}  // namespace
}  // namespace lmcache_cpu

NB_MODULE(_native, m) {
  using namespace lmcache_cpu;
  m.doc() = "lmcache_cpu native host kernels (no libtorch; raw addresses and DLPack arrays)";

  m.def("block_kv_copy", &block_kv_copy, "eng_bases"_a, "eng_block_stride"_a, "eng_tok_stride"_a,
        "eng_head_stride"_a, "num_blocks"_a, "bs"_a, "nh"_a, "row_bytes"_a, "obj_ptrs"_a,
        "obj_tokens"_a, "lp_slab"_a, "lp_col"_a, "obj_tok_stride"_a, "obj_head_stride"_a,
        "block_ids"_a, "skip"_a, "blocks_per_object"_a, "to_engine"_a,
        "Block-granular KV copy between engine pages and LMCache objects (byte strides).");
  m.def("slot_kv_copy", &slot_kv_copy, "eng_bases"_a, "eng_block_stride"_a, "eng_tok_stride"_a,
        "eng_head_stride"_a, "num_blocks"_a, "bs"_a, "nh"_a, "row_bytes"_a, "lmc_bases"_a,
        "lmc_tok_stride"_a, "lmc_head_stride"_a, "slots"_a, "skip"_a, "to_engine"_a,
        "Slot-mapped (token-granular) KV copy; negative slots are padding.");
  m.def("block_summary", &block_summary, "block_ids"_a, "skip"_a, "blocks_per_object"_a,
        "(valid ids after skip, highest valid id, per-object last block slot or -1).");
  m.def("slot_summary", &slot_summary, "slots"_a, "skip"_a,
        "(highest slot after skip or None, valid slots, last valid position).");
  m.def("memcpy", &memcpy_bytes, "dst"_a, "src"_a, "nbytes"_a,
        "Copy nbytes between host addresses, split across the thread pool.");
  m.def("batched_memcpy", &batched_memcpy_bytes, "dst_ptrs"_a, "src_ptrs"_a, "sizes"_a,
        "Copy sizes[i] bytes from src_ptrs[i] to dst_ptrs[i] for every i.");
  bind_cdf(m);

  m.def("num_threads", &num_threads, "Threads used by the native kernels (caller included).");
  m.def("set_num_threads", &set_num_threads, "n"_a,
        "Resize the pool; n < 1 restores the default (LMCACHE_CPU_THREADS or physical cores).");
  m.def("physical_cores", &physical_cores, "Physical cores in this process's affinity mask.");

  bind_plan_types(m);
}
