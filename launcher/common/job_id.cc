#include "launcher/common/job_id.h"

#include <cctype>
#include <cstdio>
#include <random>

namespace ftrun {

std::string NewJobId() {
  std::random_device rd;
  char buf[32];
  std::snprintf(buf, sizeof buf, "job-%08x", rd());
  return buf;
}

Status CheckJobId(const std::string& id, const std::string& what) {
  if (id.empty()) return Status::InvalidArgument(what + " is empty: use letters, digits, '-', '_' and '.'");
  for (char c : id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return Status::InvalidArgument(what + " '" + id + "': use letters, digits, '-', '_' and '.' only");
    }
  }
  if (id.size() > 63) return Status::InvalidArgument(what + " '" + id + "' is longer than 63 characters");
  return Status::Ok();
}

}  // namespace ftrun
