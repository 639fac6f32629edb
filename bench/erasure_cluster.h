// The cluster half of scenario "erasure" (erasure_cluster.cc).
#pragma once

#include <string>

#include "bench/bench_util.h"

namespace ftrun::bench {

struct ErasureClusterParams {
  int data = 4, parity = 2;
  std::string state = "128MiB";  // per rank
  std::string budget = "3GiB";   // per node's store
  int step_ms = 500;
};

int RunErasureCluster(const ErasureClusterParams& p, Result* out);

}  // namespace ftrun::bench
