// CacheGen CDF: per (layer, channel) symbol histogram over tokens, normalized to a total of
// 32767 with every bin >= 1 and the rounding remainder on the (first) most frequent bin.
#pragma once

#include <nanobind/nanobind.h>

namespace lmcache_cpu {

void bind_cdf(nanobind::module_& m);

}  // namespace lmcache_cpu
