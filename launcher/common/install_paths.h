// Where this ftrun's own files are, found from the running executable
// (/proc/self/exe), so that an installed ftrun needs no environment variables
// and a build tree keeps working without installing:
//
//   build tree:    <build>/ftrun-agent   <build>/python/ftrun/__init__.py
//   install tree:  <prefix>/bin/ftrun-agent
//                  <prefix>/lib/ftrun/python/ftrun -> the package in the
//                  site directory (<prefix>/lib/python3.X/dist-packages/ftrun)
//
// (cmake/install.cmake compiles in the install tree's path relative to the
// bin directory; docs/install.md shows the whole layout.)
//
// Thread-safety: every function may be called from any thread.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace ftrun {

// The directory of the running executable; "." when /proc/self/exe cannot
// be read.
std::string ExecutableDir();

// A directory that holds the `ftrun` Python package built or installed
// together with this executable, and nothing else: <exe dir>/python (build
// tree), else the install tree's lib/ftrun/python, whichever holds
// ftrun/__init__.py first. Empty when neither does (a build without the
// Python module). Made for a rank's PYTHONPATH: it shadows no other module.
std::string OwnPythonPackageDir();

// The Python interpreter that runs ranks (and the runner's rendezvous
// store): $FTRUN_PYTHON when set and not empty, else python3 from PATH.
std::string PythonInterpreter();

// This process's environment, as a map.
std::map<std::string, std::string> ProcessEnvironment();

// `env` as "KEY=VALUE" strings, with the Python package built or installed
// with this executable on PYTHONPATH (OwnPythonPackageDir): `import ftrun`
// finds it without the user setting PYTHONPATH (a path the user set comes
// first). What a rank, a standby and the runner's rendezvous store get.
std::vector<std::string> WithOwnPythonPackage(std::map<std::string, std::string> env);

// `search_path` (a PATH-like list such as PYTHONPATH, possibly empty) with
// `dir` appended, unless `dir` is empty or already one of its entries.
// Appended, not prepended: a path the user set keeps precedence.
std::string AppendSearchPath(const std::string& search_path, const std::string& dir);

}  // namespace ftrun
