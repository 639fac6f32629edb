// ftrun-netdelay's command line: the queue, the delay, jitter and loss, the
// seed, and whether this tool installs the nftables rules itself
// (integration/chaos/netdelay/main.cc describes them). A bad argument exits
// with 2 and a message that names the option.
#pragma once

#include <cstdint>
#include <optional>

namespace ftrun::netdelay {

struct Options {
  int queue = -1;
  double delay_ms = 0;
  double jitter_ms = 0;
  double loss_percent = 0;
  std::optional<uint64_t> seed;
  bool install_rules = false;
};

// Parses argv; prints the usage and exits 0 for --help, exits 2 on a bad argument.
Options ParseOptions(int argc, char** argv);

}  // namespace ftrun::netdelay
