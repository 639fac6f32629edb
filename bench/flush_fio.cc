#include "bench/flush_fio.h"

#include <unistd.h>

#include <cstdio>
#include <sstream>

#include "bench/bench_util.h"
#include "bench/flush_host.h"

namespace ftrun::bench::flush {

bool ParseFioConfigs(const std::string& text, std::vector<FioConfig>* out) {
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    FioConfig c;
    char bs[32];
    if (std::sscanf(item.c_str(), "%31[^:]:%d:%d", bs, &c.depth, &c.jobs) != 3 || c.depth < 1 || c.jobs < 1)
      return false;
    c.bs = bs;
    out->push_back(c);
  }
  return !out->empty();
}

double RunFio(const std::string& fio, const std::string& dir, uint64_t bytes, const FioConfig& c,
              const std::string& scratch) {
  const std::string name = "ftrun-bench-fio." + std::to_string(::getpid());
  const std::string json = scratch + ".fio.json", log = scratch + ".fio.log";
  uint64_t per_job = (bytes / static_cast<uint64_t>(c.jobs) + (1u << 20) - 1) >> 20 << 20;
  pid_t pid =
      StartProgram(fio,
                   {"--name=" + name, "--directory=" + dir, "--rw=write", "--bs=" + c.bs,
                    "--size=" + std::to_string(per_job), "--numjobs=" + std::to_string(c.jobs), "--group_reporting",
                    "--direct=1", "--ioengine=io_uring", "--iodepth=" + std::to_string(c.depth), "--end_fsync=1",
                    "--fallocate=none", "--output-format=json", "--output=" + json},
                   log);
  int rc = WaitExitFor(pid, std::chrono::seconds(300));
  for (int i = 0; i < c.jobs; ++i) ::unlink((dir + "/" + name + "." + std::to_string(i) + ".0").c_str());
  nlohmann::json j;
  double gbs = -1;
  if (rc == 0 && ReadJson(json, &j) && j.contains("jobs") && !j["jobs"].empty()) {
    gbs = j["jobs"][0]["write"]["bw_bytes"].get<double>() / 1e9;
  } else {
    std::fprintf(stderr, "ftrun-bench flush: fio failed (exit %d): %s\n", rc, ReadAll(log).c_str());
  }
  ::unlink(json.c_str());
  ::unlink(log.c_str());
  return gbs;
}

}  // namespace ftrun::bench::flush
