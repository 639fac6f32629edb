#include "plugin/common/file.h"

#include <cerrno>
#include <cstdio>

namespace ftrun {

Status ReadWholeFile(const std::string& path, const std::string& what, std::string* out) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Status::FromErrno("cannot open " + what, errno);
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  int err = std::ferror(f) ? errno : 0;
  std::fclose(f);
  if (err != 0) return Status::FromErrno("cannot read " + what, err);
  *out = std::move(text);
  return Status::Ok();
}

std::string NameListing(const std::vector<std::string>& names, bool quote) {
  if (names.empty()) return "none";
  std::string s;
  for (size_t i = 0; i < names.size() && i < 8; ++i) {
    s += (i ? ", " : "") + (quote ? "'" + names[i] + "'" : names[i]);
  }
  if (names.size() > 8) s += ", ... (" + std::to_string(names.size()) + " in all)";
  return s;
}

}  // namespace ftrun
