// Reading a whole (small) file: configs, hostfiles.
#pragma once

#include <string>

#include "ftrun/status.h"

namespace ftrun {

// Reads `path` into *out. Errors say "cannot open <what>" / "cannot read
// <what>" with strerror; `what` names the file for the user, e.g.
// "config file 'x.yaml'".
Status ReadWholeFile(const std::string& path, const std::string& what, std::string* out);

}  // namespace ftrun
