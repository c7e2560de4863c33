#include "thread_pool.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace lmcache_cpu {
namespace {

int read_int_file(const std::string& path, int fallback) {
  std::ifstream in(path);
  int value = fallback;
  if (in) in >> value;
  return in ? value : fallback;
}

int default_threads() {
  const char* env = std::getenv("LMCACHE_CPU_THREADS");
  if (env != nullptr && *env != '\0') {
    char* end = nullptr;
    long value = std::strtol(env, &end, 10);
    if (end != env && value >= 1) return static_cast<int>(std::min(value, 256L));
  }
  return physical_cores();
}

class Pool {
 public:
  explicit Pool(int threads) : threads_(std::max(1, threads)) {
    for (int i = 1; i < threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
  }

  // Never destroyed on purpose (see pool()): joining at interpreter exit races with
  // static destruction, and a forked child must not join threads it does not own.
  ~Pool() = delete;

  int threads() const { return threads_; }

  void run(int64_t chunks, const std::function<void(int64_t)>& chunk_fn) {
    std::unique_lock<std::mutex> busy(busy_mu_, std::try_to_lock);
    if (!busy.owns_lock() || threads_ == 1) {
      for (int64_t c = 0; c < chunks; ++c) chunk_fn(c);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &chunk_fn;
      total_ = chunks;
      next_.store(0);
      active_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    cv_.notify_all();
    drain(chunk_fn);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return active_ == 0; });
    job_ = nullptr;
  }

 private:
  void drain(const std::function<void(int64_t)>& fn) {
    for (int64_t c = next_.fetch_add(1); c < total_; c = next_.fetch_add(1)) fn(c);
  }

  void worker_loop() {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int64_t)>* job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        job = job_;
      }
      drain(*job);
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) done_cv_.notify_one();
    }
  }

  const int threads_;
  std::vector<std::thread> workers_;
  std::mutex busy_mu_;  // one parallel job at a time
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t total_ = 0;
  std::atomic<int64_t> next_{0};
  int active_ = 0;
  uint64_t generation_ = 0;
};

std::mutex g_pool_mu;
Pool* g_pool = nullptr;
pid_t g_pool_pid = 0;
int g_requested = 0;  // 0 = default

Pool& pool() {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  // A forked child inherits the pointer but not the threads: build a fresh pool (the old
  // one is leaked deliberately; its threads do not exist in this process).
  if (g_pool == nullptr || g_pool_pid != getpid()) {
    g_pool = new Pool(g_requested > 0 ? g_requested : default_threads());
    g_pool_pid = getpid();
  }
  return *g_pool;
}

}  // namespace

int physical_cores() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) {
    return std::max(1u, std::thread::hardware_concurrency());
  }
  std::set<std::pair<int, int>> cores;
  int logical = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &mask)) continue;
    ++logical;
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    int package = read_int_file(base + "physical_package_id", 0);
    int core = read_int_file(base + "core_id", cpu);
    cores.emplace(package, core);
  }
  int n = static_cast<int>(cores.size());
  return std::max(1, n > 0 ? n : logical);
}

int num_threads() { return pool().threads(); }

void set_num_threads(int n) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  g_requested = n > 0 ? n : 0;
  g_pool = nullptr;  // leak the old pool; see pool()
}

void parallel_for(int64_t n, int64_t grain, const RangeFn& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  Pool& p = pool();
  int64_t max_chunks = (n + grain - 1) / grain;
  // A few chunks per thread balance uneven runs without much dispatch overhead.
  int64_t chunks = std::min<int64_t>(max_chunks, static_cast<int64_t>(p.threads()) * 4);
  if (chunks <= 1 || p.threads() == 1) {
    fn(0, n);
    return;
  }
  const int64_t per = (n + chunks - 1) / chunks;
  std::function<void(int64_t)> chunk_fn = [&](int64_t c) {
    int64_t begin = c * per;
    int64_t end = std::min(n, begin + per);
    if (begin < end) fn(begin, end);
  };
  p.run(chunks, chunk_fn);
}

}  // namespace lmcache_cpu
