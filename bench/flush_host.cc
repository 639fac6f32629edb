#include "bench/flush_host.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "bench/bench_util.h"

namespace ftrun::bench::flush {

std::string FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path != nullptr ? path : "/usr/bin:/bin");
  std::string d;
  while (std::getline(ss, d, ':')) {
    std::string p = (d.empty() ? "." : d) + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void RemoveTree(const std::string& path) {
  if (path.size() < 8 || path.find("ftrun-bench") == std::string::npos) return;  // never anything else
  pid_t pid = StartProgram("/bin/rm", {"-rf", "--", path}, "");
  WaitExit(pid);
}

int WaitExitFor(pid_t pid, std::chrono::seconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  int st = 0;
  while (true) {
    pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return ExitCode(st);
    if (r < 0 && errno != EINTR) return -1;
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "ftrun-bench flush: pid %d still running after %lld s; killing it\n", pid,
                   static_cast<long long>(limit.count()));
      ::kill(pid, SIGKILL);
      return WaitExit(pid);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

double MachineCpuSeconds() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  double v[8] = {0};
  f >> cpu >> v[0] >> v[1] >> v[2] >> v[3] >> v[4] >> v[5] >> v[6] >> v[7];
  return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

double ChildrenCpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_CHILDREN, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

void WaitForQuiet(double cores, std::chrono::seconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    double c0 = MachineCpuSeconds();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    if (MachineCpuSeconds() - c0 <= cores) return;
  }
}

}  // namespace ftrun::bench::flush
