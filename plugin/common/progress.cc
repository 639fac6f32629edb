#include "plugin/common/progress.h"

#include <cstdio>

#include "plugin/config/units.h"

namespace ftrun {

std::string FormatSeconds(double s) {
  char buf[48];
  if (s < 60) {
    std::snprintf(buf, sizeof(buf), "%.*f s", s < 10 ? 1 : 0, s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof(buf), "%d min %02d s", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%d h %02d min", static_cast<int>(s) / 3600, static_cast<int>(s) % 3600 / 60);
  }
  return buf;
}

Progress::Progress(std::string what, uint64_t total, bool tty)
    : what_(std::move(what)), total_(total), tty_(tty), start_(Clock::now()) {
  if (tty_) Show();
}

void Progress::Add(uint64_t n) {
  done_ += n;
  if (tty_ && Clock::now() - last_ >= std::chrono::milliseconds(250)) Show();
}

void Progress::End() {
  if (!tty_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

double Progress::elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

std::string Progress::rate() const {
  const double s = elapsed();
  return s > 0 ? FormatSize(static_cast<uint64_t>(static_cast<double>(done_) / s)) + "/s" : "-";
}

void Progress::Show() {
  last_ = Clock::now();
  const double s = elapsed();
  const double bps = s > 0.05 ? static_cast<double>(done_) / s : 0;
  const std::string left = bps > 0 ? FormatSeconds(static_cast<double>(total_ - done_) / bps) : "--";
  const int pct = total_ ? static_cast<int>(100.0 * static_cast<double>(done_) / static_cast<double>(total_)) : 100;
  std::fprintf(stderr, "\r\033[K%s: %s of %s (%d%%), %s, %s left", what_.c_str(), FormatSize(done_).c_str(),
               FormatSize(total_).c_str(), pct, bps > 0 ? rate().c_str() : "-/s", left.c_str());
  std::fflush(stderr);
}

}  // namespace ftrun
