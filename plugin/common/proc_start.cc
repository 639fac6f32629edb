#include "plugin/common/proc_start.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

namespace ftrun {

uint64_t ProcessStartTime(pid_t pid) {
  if (pid <= 0) return 0;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // "pid (comm) state ppid ...": comm may hold spaces and ')', so fields are
  // counted from the last ')'. The state is field 3, the start time field 22.
  size_t pos = stat.rfind(')');
  if (pos == std::string::npos || pos + 2 >= stat.size() || stat[pos + 2] == 'Z' || stat[pos + 2] == 'X') return 0;
  pos += 2;
  for (int field = 3; field < 22; ++field) {
    pos = stat.find(' ', pos);
    if (pos == std::string::npos) return 0;
    ++pos;
  }
  return std::strtoull(stat.c_str() + pos, nullptr, 10);
}

bool SameProcess(pid_t pid, uint64_t start_time) { return start_time != 0 && ProcessStartTime(pid) == start_time; }

}  // namespace ftrun
