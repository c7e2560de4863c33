#include "cdf.h"

#include <nanobind/ndarray.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "thread_pool.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace lmcache_cpu {
namespace {

constexpr int64_t kCdfTotal = 32767;

using Input = nb::ndarray<nb::ndim<3>, nb::device::cpu, nb::ro>;
using Output = nb::ndarray<int16_t, nb::ndim<3>, nb::c_contig, nb::device::cpu>;

template <typename T>
void histogram_layer(const T* base, int64_t tokens, int64_t channels, int64_t st, int64_t sc,
                     int64_t num_bins, int64_t* counts, std::atomic<bool>& bad) {
  for (int64_t t = 0; t < tokens; ++t) {
    const T* row = base + t * st;
    for (int64_t c = 0; c < channels; ++c) {
      const int64_t s = static_cast<int64_t>(row[c * sc]);
      if (s < 0 || s >= num_bins) {
        bad.store(true, std::memory_order_relaxed);
        return;
      }
      ++counts[c * num_bins + s];
    }
  }
}

void normalize(const int64_t* counts, int64_t tokens, int64_t num_bins, int16_t* out) {
  const int64_t denom = std::max<int64_t>(tokens, 1);
  int64_t sum = 0;
  int64_t argmax = 0;
  std::vector<int64_t> freq(static_cast<size_t>(num_bins));
  for (int64_t b = 0; b < num_bins; ++b) {
    freq[b] = counts[b] * (kCdfTotal - num_bins) / denom + 1;
    sum += freq[b];
    if (counts[b] > counts[argmax]) argmax = b;
  }
  freq[argmax] += kCdfTotal - sum;
  int64_t acc = 0;
  out[0] = 0;
  for (int64_t b = 0; b < num_bins; ++b) {
    acc += freq[b];
    out[b + 1] = static_cast<int16_t>(acc);
  }
}

template <typename T>
void run_cdf(const Input& in, int64_t num_bins, int16_t* out) {
  const int64_t layers = static_cast<int64_t>(in.shape(0));
  const int64_t tokens = static_cast<int64_t>(in.shape(1));
  const int64_t channels = static_cast<int64_t>(in.shape(2));
  const T* data = static_cast<const T*>(in.data());
  const int64_t sl = in.stride(0), st = in.stride(1), sc = in.stride(2);
  std::atomic<bool> bad{false};
  {
    nb::gil_scoped_release release;
    parallel_for(layers, 1, [&](int64_t begin, int64_t end) {
      std::vector<int64_t> counts(static_cast<size_t>(channels * num_bins));
      for (int64_t l = begin; l < end; ++l) {
        std::fill(counts.begin(), counts.end(), 0);
        histogram_layer(data + l * sl, tokens, channels, st, sc, num_bins, counts.data(), bad);
        if (bad.load(std::memory_order_relaxed)) return;
        for (int64_t c = 0; c < channels; ++c) {
          normalize(counts.data() + c * num_bins, tokens, num_bins,
                    out + (l * channels + c) * (num_bins + 1));
        }
      }
    });
  }
  if (bad.load()) {
    throw std::invalid_argument("symbols must lie in [0, " + std::to_string(num_bins) + ")");
  }
}

void calculate_cdf_into(const Input& in, int64_t num_bins, Output& out) {
  if (num_bins < 1 || num_bins > kCdfTotal / 2) {
    throw std::invalid_argument("num_bins must be in [1, " + std::to_string(kCdfTotal / 2) +
                                "], got " + std::to_string(num_bins));
  }
  if (out.shape(0) != in.shape(0) || out.shape(1) != in.shape(2) ||
      static_cast<int64_t>(out.shape(2)) != num_bins + 1) {
    throw std::invalid_argument("output must be int16 [nlayers, nchannels, num_bins + 1]");
  }
  const nb::dlpack::dtype dt = in.dtype();
  int16_t* o = out.data();
  if (dt == nb::dtype<uint8_t>()) return run_cdf<uint8_t>(in, num_bins, o);
  if (dt == nb::dtype<int8_t>()) return run_cdf<int8_t>(in, num_bins, o);
  if (dt == nb::dtype<int16_t>()) return run_cdf<int16_t>(in, num_bins, o);
  if (dt == nb::dtype<int32_t>()) return run_cdf<int32_t>(in, num_bins, o);
  if (dt == nb::dtype<int64_t>()) return run_cdf<int64_t>(in, num_bins, o);
  throw nb::type_error("input_tensor must hold integer symbols (uint8/int8/int16/int32/int64)");
}

}  // namespace

void bind_cdf(nb::module_& m) {
  m.def("calculate_cdf_into", &calculate_cdf_into, "input"_a, "num_bins"_a, "out"_a,
        "Write the normalized int16 CDF [L, C, num_bins + 1] of input [L, T, C] into out.");
}

}  // namespace lmcache_cpu
