// Reading a whole (small) file: configs, hostfiles.
#pragma once

#include <string>
#include <vector>

#include "ftrun/status.h"

namespace ftrun {

// Reads `path` into *out. Errors say "cannot open <what>" / "cannot read
// <what>" with strerror; `what` names the file for the user, e.g.
// "config file 'x.yaml'".
Status ReadWholeFile(const std::string& path, const std::string& what, std::string* out);

// Names found in a directory, for an error message: "'a', 'b', ... (12 in
// all)" (at most 8 shown; quote false: a, b, ...), "none" for none.
std::string NameListing(const std::vector<std::string>& names, bool quote = true);

}  // namespace ftrun
