// How the linear kernels share a call's weight tiles among torch's threads (linear_kernels.cpp,
// int8_gemm.cpp). Included by AVX2-compiled files only (a template: each caller's own instance).
#pragma once
#include <ATen/Parallel.h>
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

namespace specdec_kernels {

// Run compute_tile(tile) for every tile in [0, tiles). Each thread owns a contiguous run of tiles and
// takes them front to back; a thread done with its own run takes the next run's tiles from the back.
// Why: on a shared 2-core machine one core often runs slower for a while, and with fixed halves the other
// waited at the end of every call (a 0.5B draft step: ~18 % of its samples in the OpenMP barrier). Single
// tiles handed out in turn broke each thread's weight stream into 24-140 KB pieces and lost far more: the
// prefetchers follow one long stream. Which thread computes a tile changes no bit of it.
template <typename ComputeTile>
void run_tiles(int64_t tiles, ComputeTile compute_tile) {
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), tiles));
  std::vector<std::atomic<int64_t>> claimed(threads);  // tiles of each run taken, from either end
  std::vector<std::atomic<int64_t>> stolen(threads);   // of those, taken from the back by another thread
  for (int64_t t = 0; t < threads; ++t) { claimed[t] = 0; stolen[t] = 0; }
  auto run_start = [&](int64_t t) { return t * tiles / threads; };
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t count = run_start(t + 1) - run_start(t);
      for (int64_t taken = 0; claimed[t].fetch_add(1) < count; ++taken) compute_tile(run_start(t) + taken);
      for (int64_t step = 1; step < threads; ++step) {  // then the other runs' last tiles
        const int64_t other = (t + step) % threads, other_count = run_start(other + 1) - run_start(other);
        while (claimed[other].fetch_add(1) < other_count)
          compute_tile(run_start(other + 1) - 1 - stolen[other].fetch_add(1));
      }
    }
  });
}

}  // namespace specdec_kernels
