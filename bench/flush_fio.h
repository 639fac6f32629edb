// fio in the flush scenario (bench/flush_bench.cc): the ceiling a version's
// write is compared with, measured in the same directory in the same run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ftrun::bench::flush {

struct FioConfig {
  std::string bs;
  int depth = 16;
  int jobs = 1;
  std::string ToString() const { return "bs " + bs + " qd " + std::to_string(depth) + " x " + std::to_string(jobs); }
};

// "1M:4:1,1M:16:1": block size, io_uring depth, files written at once.
bool ParseFioConfigs(const std::string& text, std::vector<FioConfig>* out);

// fio: `jobs` new files of `bytes` in all in `dir`, each written
// sequentially with O_DIRECT writes of `bs` through io_uring at `depth`, and
// fsync'ed at its end. GB/s over all of them, or < 0 on failure.
double RunFio(const std::string& fio, const std::string& dir, uint64_t bytes, const FioConfig& c,
              const std::string& scratch);

}  // namespace ftrun::bench::flush
