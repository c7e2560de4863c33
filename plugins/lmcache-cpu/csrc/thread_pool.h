// A tiny fork-aware worker pool for splitting large host copies.
//
// Why not OpenMP: the wheel must not pull a runtime (libgomp/libiomp) that could clash with
// the one torch ships.  The calling thread always takes part, so a pool of N threads means
// N-1 workers plus the caller.
#pragma once

#include <cstdint>
#include <functional>

namespace lmcache_cpu {

using RangeFn = std::function<void(int64_t begin, int64_t end)>;

// Runs fn over [0, n) split into chunks of at least `grain` items.  Work smaller than two
// grains, or a call made while another parallel_for is running (nested or from a second
// Python thread), runs inline on the calling thread.
void parallel_for(int64_t n, int64_t grain, const RangeFn& fn);

// Threads used by parallel_for (workers + caller).  Read once from LMCACHE_CPU_THREADS,
// defaulting to the number of physical cores this process may run on.
int num_threads();

// Resizes the pool (tests and benchmarks); values < 1 mean "default".
void set_num_threads(int n);

// Physical cores in this process's CPU affinity mask (1 if it cannot be determined).
int physical_cores();

}  // namespace lmcache_cpu
