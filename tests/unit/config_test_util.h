// The config tests' check of a bad file: its error names the file, the
// line, the field and what was expected, and nothing is loaded.
#pragma once

#include <string>

#include "plugin/config/config.h"
#include "tests/catch.h"
#include "tests/unit/temp_dir.h"

namespace ftrun {

// Loads `text` from a file named bad.yaml and expects an InvalidArgument whose
// message starts with "<path>:<line>: <field>: " and contains `detail`.
inline void ExpectError(const std::string& text, int line, const std::string& field, const std::string& detail) {
  TempDir dir;
  std::string path = dir.Write("bad.yaml", text);
  Config c = DefaultConfig();
  c.job.id = "untouched";
  Status st = LoadConfigFile(path, &c);
  INFO("yaml:\n" << text << "status: " << st.ToString());
  CHECK(st.code() == Code::kInvalidArgument);
  std::string prefix = path + ":" + std::to_string(line) + ": " + field + ": ";
  CHECK(st.message().rfind(prefix, 0) == 0);
  CHECK(st.message().find(detail) != std::string::npos);
  CHECK(c.job.id == "untouched");  // *out is written only on success
}

}  // namespace ftrun
