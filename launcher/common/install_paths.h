// Where this ftrun's own files are, found from the running executable
// (/proc/self/exe), so that an installed ftrun needs no environment variables
// and a build tree keeps working without installing:
//
//   build tree:    <build>/ftrun-agent   <build>/python/ftrun/__init__.py
//   install tree:  <prefix>/bin/ftrun-agent
//                  <prefix>/<FTRUN_INSTALL_PYTHONDIR>/ftrun/__init__.py
//
// (cmake/install.cmake sets FTRUN_INSTALL_PYTHONDIR and compiles in its path
// relative to the bin directory; docs/install.md shows the whole layout.)
//
// Thread-safety: every function may be called from any thread.
#pragma once

#include <string>

namespace ftrun {

// The directory of the running executable; "." when /proc/self/exe cannot
// be read.
std::string ExecutableDir();

// The directory that holds the `ftrun` Python package built or installed
// together with this executable: <exe dir>/python (build tree), else the
// install tree's Python directory, whichever holds ftrun/__init__.py first.
// Empty when neither does (a build without the Python module).
std::string OwnPythonPackageDir();

// `search_path` (a PATH-like list such as PYTHONPATH, possibly empty) with
// `dir` appended, unless `dir` is empty or already one of its entries.
// Appended, not prepended: a path the user set keeps precedence.
std::string AppendSearchPath(const std::string& search_path, const std::string& dir);

}  // namespace ftrun
