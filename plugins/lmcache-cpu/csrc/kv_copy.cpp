#include "kv_copy.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "thread_pool.h"

namespace lmcache_cpu {
namespace {

// Below this many bytes per parallel chunk the dispatch costs more than it saves.
constexpr int64_t kMinChunkBytes = 256 * 1024;
constexpr int64_t kMemcpyPiece = 1 << 20;

struct Strides {
  int64_t tok;
  int64_t head;
};

// Copies ntok tokens x nh heads x row bytes; collapses to as few memcpy calls as the two
// layouts allow (a whole NHD block is one call, an HND<->NHD block is ntok*nh calls).
inline void copy_tile(char* dst, const char* src, int64_t ntok, int64_t nh, int64_t row,
                      Strides d, Strides s) {
  const int64_t tok_bytes = nh * row;
  if (d.head == row && s.head == row) {
    if (d.tok == tok_bytes && s.tok == tok_bytes) {
      std::memcpy(dst, src, static_cast<size_t>(ntok * tok_bytes));
      return;
    }
    for (int64_t t = 0; t < ntok; ++t) {
      std::memcpy(dst + t * d.tok, src + t * s.tok, static_cast<size_t>(tok_bytes));
    }
    return;
  }
  if (d.tok == row && s.tok == row) {  // both head-major: each head's tokens are contiguous
    for (int64_t h = 0; h < nh; ++h) {
      std::memcpy(dst + h * d.head, src + h * s.head, static_cast<size_t>(ntok * row));
    }
    return;
  }
  for (int64_t t = 0; t < ntok; ++t) {
    char* dt = dst + t * d.tok;
    const char* st = src + t * s.tok;
    for (int64_t h = 0; h < nh; ++h) {
      std::memcpy(dt + h * d.head, st + h * s.head, static_cast<size_t>(row));
    }
  }
}

int64_t grain_for(int64_t bytes_per_item) {
  return std::max<int64_t>(1, kMinChunkBytes / std::max<int64_t>(1, bytes_per_item));
}

}  // namespace

void block_copy(const EngineSide& eng, const TileShape& tile, const ObjectSide& obj,
                const int64_t* block_ids, int64_t n_block_ids, int64_t skip,
                int64_t blocks_per_object, bool to_engine) {
  if (blocks_per_object <= 0) throw std::invalid_argument("blocks_per_object must be positive");
  const size_t n_lp_sz = eng.bases.size();
  if (obj.lp_slab.size() != n_lp_sz || obj.lp_col.size() != n_lp_sz) {
    throw std::invalid_argument("object slabs and engine bases disagree on layer*plane count");
  }
  if (obj.tokens.size() != obj.ptrs.size()) {
    throw std::invalid_argument("one token capacity per LMCache object is required");
  }
  skip = std::max<int64_t>(0, skip);
  if (n_block_ids <= skip || n_lp_sz == 0) return;
  // Validate everything before the first byte moves.
  for (int64_t j = skip; j < n_block_ids; ++j) {
    const int64_t b = block_ids[j];
    if (b < 0) continue;  // padding
    if (b >= eng.num_blocks) {
      throw std::out_of_range("block_ids[" + std::to_string(j) + "] = " + std::to_string(b) +
                              " is out of range for " + std::to_string(eng.num_blocks) +
                              " engine blocks");
    }
    const int64_t o = j / blocks_per_object;
    if (o >= static_cast<int64_t>(obj.ptrs.size())) {
      throw std::out_of_range("block position " + std::to_string(j) + " needs LMCache object " +
                              std::to_string(o) + ", got " + std::to_string(obj.ptrs.size()));
    }
    if ((j % blocks_per_object + 1) * tile.bs > obj.tokens[o]) {
      throw std::out_of_range("LMCache object " + std::to_string(o) + " holds " +
                              std::to_string(obj.tokens[o]) + " tokens; block position " +
                              std::to_string(j) + " does not fit");
    }
  }

  const int64_t n_lp = static_cast<int64_t>(n_lp_sz);
  const int64_t n = n_block_ids - skip;
  const Strides e{eng.tok_stride, eng.head_stride};
  const Strides o{obj.tok_stride, obj.head_stride};
  const int64_t tile_bytes = tile.bs * tile.nh * tile.row_bytes;
  parallel_for(n_lp * n, grain_for(tile_bytes), [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      const int64_t lp = w / n;
      const int64_t j = skip + w % n;
      const int64_t b = block_ids[j];
      if (b < 0) continue;
      const int64_t oi = j / blocks_per_object;
      char* eng_ptr = reinterpret_cast<char*>(eng.bases[lp]) + b * eng.block_stride;
      char* obj_ptr = reinterpret_cast<char*>(obj.ptrs[oi]) +
                      (obj.lp_slab[lp] * obj.tokens[oi] + (j % blocks_per_object) * tile.bs) *
                          obj.tok_stride +
                      obj.lp_col[lp];
      if (to_engine) {
        copy_tile(eng_ptr, obj_ptr, tile.bs, tile.nh, tile.row_bytes, e, o);
      } else {
        copy_tile(obj_ptr, eng_ptr, tile.bs, tile.nh, tile.row_bytes, o, e);
      }
    }
  });
}

void slot_copy(const EngineSide& eng, const TileShape& tile, const std::vector<uint64_t>& lmc_bases,
               int64_t lmc_tok_stride, int64_t lmc_head_stride, const int64_t* slots,
               int64_t n_slots, int64_t skip, bool to_engine) {
  if (tile.bs <= 0) throw std::invalid_argument("block size must be positive");
  if (lmc_bases.size() != eng.bases.size()) {
    throw std::invalid_argument("LMCache bases and engine bases disagree on layer*plane count");
  }
  skip = std::max<int64_t>(0, skip);
  if (n_slots <= skip || eng.bases.empty()) return;
  const int64_t num_slots = eng.num_blocks * tile.bs;
  for (int64_t t = skip; t < n_slots; ++t) {
    if (slots[t] >= num_slots) {
      throw std::out_of_range("slot_mapping[" + std::to_string(t) + "] = " +
                              std::to_string(slots[t]) + " is out of range for " +
                              std::to_string(num_slots) + " engine slots");
    }
  }

  const int64_t n_lp = static_cast<int64_t>(eng.bases.size());
  const int64_t tok_bytes = tile.nh * tile.row_bytes;
  // Consecutive slots inside one block merge into one memcpy when both sides keep a token's
  // heads contiguous and tokens back to back.
  const bool mergeable = eng.head_stride == tile.row_bytes && lmc_head_stride == tile.row_bytes &&
                         eng.tok_stride == tok_bytes && lmc_tok_stride == tok_bytes;
  const Strides e{eng.tok_stride, eng.head_stride};
  const Strides l{lmc_tok_stride, lmc_head_stride};
  constexpr int64_t kTile = 64;  // tokens per work item
  const int64_t n = n_slots - skip;
  const int64_t tiles = (n + kTile - 1) / kTile;
  parallel_for(n_lp * tiles, grain_for(kTile * tok_bytes), [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      const int64_t lp = w / tiles;
      const int64_t t0 = skip + (w % tiles) * kTile;
      const int64_t t1 = std::min(n_slots, t0 + kTile);
      char* eng_base = reinterpret_cast<char*>(eng.bases[lp]);
      char* lmc_base = reinterpret_cast<char*>(lmc_bases[lp]);
      int64_t t = t0;
      while (t < t1) {
        const int64_t s = slots[t];
        if (s < 0) {  // padding slot
          ++t;
          continue;
        }
        int64_t run = 1;
        if (mergeable) {
          const int64_t room = tile.bs - s % tile.bs;
          while (run < room && t + run < t1 && slots[t + run] == s + run) ++run;
        }
        char* eng_ptr = eng_base + (s / tile.bs) * eng.block_stride + (s % tile.bs) * eng.tok_stride;
        char* lmc_ptr = lmc_base + t * lmc_tok_stride;
        if (to_engine) {
          copy_tile(eng_ptr, lmc_ptr, run, tile.nh, tile.row_bytes, e, l);
        } else {
          copy_tile(lmc_ptr, eng_ptr, run, tile.nh, tile.row_bytes, l, e);
        }
        t += run;
      }
    }
  });
}

void parallel_memcpy(uint64_t dst, uint64_t src, int64_t nbytes) {
  if (nbytes <= 0) return;
  char* d = reinterpret_cast<char*>(dst);
  const char* s = reinterpret_cast<const char*>(src);
  const int64_t pieces = (nbytes + kMemcpyPiece - 1) / kMemcpyPiece;
  parallel_for(pieces, 1, [&](int64_t begin, int64_t end) {
    const int64_t lo = begin * kMemcpyPiece;
    const int64_t hi = std::min(nbytes, end * kMemcpyPiece);
    std::memcpy(d + lo, s + lo, static_cast<size_t>(hi - lo));
  });
}

void batched_memcpy(const std::vector<uint64_t>& dsts, const std::vector<uint64_t>& srcs,
                    const std::vector<int64_t>& sizes) {
  if (dsts.size() != srcs.size() || dsts.size() != sizes.size()) {
    throw std::invalid_argument("src_ptrs, dst_ptrs and sizes must have the same length");
  }
  // Split every copy into <= 1 MiB pieces so one huge entry still uses every thread.
  struct Piece {
    uint64_t dst, src;
    int64_t bytes;
  };
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 0) throw std::invalid_argument("sizes[" + std::to_string(i) + "] is negative");
  }
  std::vector<Piece> pieces;
  int64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const uint64_t gap = dsts[i] > srcs[i] ? dsts[i] - srcs[i] : srcs[i] - dsts[i];
    if (gap < static_cast<uint64_t>(sizes[i])) {
      // Overlapping ranges: one memmove, like the baseline, never split across threads.
      std::memmove(reinterpret_cast<void*>(dsts[i]), reinterpret_cast<const void*>(srcs[i]),
                   static_cast<size_t>(sizes[i]));
      continue;
    }
    for (int64_t off = 0; off < sizes[i]; off += kMemcpyPiece) {
      pieces.push_back({dsts[i] + off, srcs[i] + off, std::min(kMemcpyPiece, sizes[i] - off)});
    }
    total += sizes[i];
  }
  if (pieces.empty()) return;
  const int64_t avg = std::max<int64_t>(1, total / static_cast<int64_t>(pieces.size()));
  parallel_for(static_cast<int64_t>(pieces.size()), grain_for(avg), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      std::memcpy(reinterpret_cast<void*>(pieces[i].dst), reinterpret_cast<const void*>(pieces[i].src),
                  static_cast<size_t>(pieces[i].bytes));
    }
  });
}

}  // namespace lmcache_cpu
