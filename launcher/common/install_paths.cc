#include "launcher/common/install_paths.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

extern char** environ;

// The install tree's directory that holds only the `ftrun` package (a link
// to it in the site directory), relative to the bin directory; from
// cmake/install.cmake. Empty in builds without the Python module.
#ifndef FTRUN_RANK_PYTHONDIR_FROM_BINDIR
#define FTRUN_RANK_PYTHONDIR_FROM_BINDIR ""
#endif

namespace ftrun {
namespace {

bool HoldsPackage(const std::string& dir) {
  struct stat st;
  return !dir.empty() && ::stat((dir + "/ftrun/__init__.py").c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

std::string ExecutableDir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  auto slash = path.rfind('/');
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string OwnPythonPackageDir() {
  const std::string exe_dir = ExecutableDir();
  const std::string build_tree = exe_dir + "/python";
  if (HoldsPackage(build_tree)) return build_tree;
  const std::string rel = FTRUN_RANK_PYTHONDIR_FROM_BINDIR;
  if (rel.empty()) return "";
  const std::string installed = exe_dir + "/" + rel;
  if (!HoldsPackage(installed)) return "";
  // Shown to the rank as a clean absolute path, not bin/../lib/...
  char real[PATH_MAX];
  return ::realpath(installed.c_str(), real) != nullptr ? std::string(real) : installed;
}

std::string AppendSearchPath(const std::string& search_path, const std::string& dir) {
  if (dir.empty()) return search_path;
  size_t pos = 0;
  while (pos <= search_path.size()) {
    size_t end = search_path.find(':', pos);
    if (end == std::string::npos) end = search_path.size();
    if (search_path.compare(pos, end - pos, dir) == 0 && end - pos == dir.size()) return search_path;
    pos = end + 1;
  }
  return search_path.empty() ? dir : search_path + ":" + dir;
}

std::string PythonInterpreter() {
  const char* py = std::getenv("FTRUN_PYTHON");
  return py != nullptr && *py != '\0' ? py : "python3";
}

std::map<std::string, std::string> ProcessEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

std::vector<std::string> WithOwnPythonPackage(std::map<std::string, std::string> env) {
  const std::string own_package = OwnPythonPackageDir();
  if (!own_package.empty()) env["PYTHONPATH"] = AppendSearchPath(env["PYTHONPATH"], own_package);
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

}  // namespace ftrun
