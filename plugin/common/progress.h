// Progress: "<what>: 1.2 GiB of 4.0 GiB (30%), 650 MiB/s, 4.4 s left" on one
// terminal line (stderr), redrawn at most every 250 ms, for long exports and
// restores. Not a terminal: nothing is drawn; the caller prints the result.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ftrun {

// "4.2 s", "3 min 05 s", "1 h 02 min".
std::string FormatSeconds(double s);

class Progress {
 public:
  // tty: draw (usually isatty(2)).
  Progress(std::string what, uint64_t total, bool tty);
  void Add(uint64_t n);
  // Clears the line (the caller prints the result).
  void End();
  double elapsed() const;
  std::string rate() const;  // "650 MiB/s"

 private:
  using Clock = std::chrono::steady_clock;
  void Show();

  const std::string what_;
  const uint64_t total_;
  const bool tty_;
  const Clock::time_point start_;
  Clock::time_point last_{};
  uint64_t done_ = 0;
};

}  // namespace ftrun
