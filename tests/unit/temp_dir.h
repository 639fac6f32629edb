// TempDir: a fresh directory under $TMPDIR (or /tmp) for a unit test,
// removed with its files at the end.
#pragma once

#include <ftw.h>
#include <stdlib.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "tests/catch.h"

namespace ftrun {

class TempDir {
 public:
  TempDir() {
    const char* base = getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ftrun_test.XXXXXX";
    char* p = mkdtemp(&tmpl[0]);
    REQUIRE(p != nullptr);
    path_ = p;
  }
  ~TempDir() {
    nftw(
        path_.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return remove(p); }, 8,
        FTW_DEPTH | FTW_PHYS);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

  // Writes `text` to <dir>/<name> and returns the full path.
  std::string Write(const std::string& name, const std::string& text) const {
    std::string p = path_ + "/" + name;
    std::ofstream f(p, std::ios::binary);
    f << text;
    REQUIRE(f.good());
    return p;
  }

 private:
  std::string path_;
};

}  // namespace ftrun
