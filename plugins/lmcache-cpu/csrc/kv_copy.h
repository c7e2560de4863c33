// Layout-agnostic host KV copy kernels.
//
// Every engine layout the torch baseline supports reduces to: for each (layer, plane) pair
// `lp` a base address, and inside it blocks of `bs` tokens x `nh` heads x `row_bytes`
// bytes addressed by three byte strides (block, token, head).  The LMCache side is a token
// matrix with its own token and head strides.  The kernels copy whole contiguous runs with
// memcpy and only fall back to per-row copies when the two sides disagree on layout.
#pragma once

#include <cstdint>
#include <vector>

namespace lmcache_cpu {

struct EngineSide {
  std::vector<uint64_t> bases;  // one per lp = layer * kv_size + plane
  int64_t block_stride = 0;     // bytes between blocks
  int64_t tok_stride = 0;       // bytes between tokens of one block
  int64_t head_stride = 0;      // bytes between heads of one token
  int64_t num_blocks = 0;       // valid block ids are [0, num_blocks)
};

struct TileShape {
  int64_t bs = 0;         // tokens per block
  int64_t nh = 0;         // heads per token
  int64_t row_bytes = 0;  // contiguous bytes per head (head_size * element_size)
};

struct ObjectSide {
  std::vector<uint64_t> ptrs;     // one per LMCache object
  std::vector<int64_t> tokens;    // token capacity of each object
  std::vector<int64_t> lp_slab;   // per lp: index of its [T, row] slab (plane * NL + layer)
  std::vector<int64_t> lp_col;    // per lp: byte offset inside a token row (MLA planes)
  int64_t tok_stride = 0;         // bytes per token row (NH * head_width * itemsize)
  int64_t head_stride = 0;        // bytes per head inside a row
};

// Block-granular copy (multi_layer_block_kv_transfer).  Block position j of `block_ids`
// (j >= skip, id >= 0; negative ids are padding) lives in object j / blocks_per_object at
// token (j % bpo) * bs.  Throws std::out_of_range before copying anything when a block id,
// an object index or an object's capacity is out of range.
void block_copy(const EngineSide& eng, const TileShape& tile, const ObjectSide& obj,
                const int64_t* block_ids, int64_t n_block_ids, int64_t skip,
                int64_t blocks_per_object, bool to_engine);

// Token-granular copy (slot-mapped ops).  Token t >= skip with slot s >= 0 is engine row
// (s / bs, s % bs) and LMCache row lmc_bases[lp] + t * lmc_tok_stride.  Slots >= bs *
// num_blocks throw std::out_of_range before any byte moves.
void slot_copy(const EngineSide& eng, const TileShape& tile, const std::vector<uint64_t>& lmc_bases,
               int64_t lmc_tok_stride, int64_t lmc_head_stride, const int64_t* slots,
               int64_t n_slots, int64_t skip, bool to_engine);

// Byte copies split across the pool.
void parallel_memcpy(uint64_t dst, uint64_t src, int64_t nbytes);
void batched_memcpy(const std::vector<uint64_t>& dsts, const std::vector<uint64_t>& srcs,
                    const std::vector<int64_t>& sizes);

}  // namespace lmcache_cpu
