#include "integration/chaos/netdelay/options.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "integration/chaos/netdelay/netlink.h"

namespace ftrun::netdelay {
namespace {

constexpr double kMaxDelayMs = 3600.0 * 1000.0;  // one hour: a sanity bound, not a need

const char kUsage[] =
    "usage: ftrun-netdelay --queue N [--delay-ms D] [--jitter-ms J] [--loss-percent P] [--seed S]\n"
    "                      [--install-rules]\n"
    "Run inside a network namespace (as root). Binds NFQUEUE queue N (0..65535); drops each packet\n"
    "with probability P percent (0..100), else releases it after D ms (>= 0) plus a uniform jitter\n"
    "in [-J, J] ms (clamped at 0). --seed makes the drops and the jitter reproducible.\n"
    "--install-rules: install (and at exit remove) nftables tables ip/ip6 ftrun_delay that queue\n"
    "every non-loopback packet of the namespace to N, with bypass. Stop it with SIGTERM or SIGINT.\n";

[[noreturn]] void UsageError(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n(see %s --help)\n", kProg, what.c_str(), kProg);
  std::exit(2);
}

double ParseNumber(const std::string& opt, const std::string& value, double lo, double hi, const char* expected) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v) || v < lo || v > hi) {
    UsageError(opt + ": expected " + expected + ", got '" + value + "'");
  }
  return v;
}

uint64_t ParseUnsigned(const std::string& opt, const std::string& value, uint64_t hi, const char* expected) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(value.c_str(), &end, 10);
  if (value.empty() || value[0] == '-' || value[0] == '+' || *end != '\0' || errno == ERANGE || v > hi) {
    UsageError(opt + ": expected " + expected + ", got '" + value + "'");
  }
  return v;
}

}  // namespace

Options ParseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (arg == "--install-rules") {
      o.install_rules = true;
      continue;
    }
    std::string name = arg, value;
    bool has_value = false;
    if (size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    bool known = name == "--queue" || name == "--delay-ms" || name == "--jitter-ms" || name == "--loss-percent" ||
                 name == "--seed";
    if (!known) UsageError("unknown argument '" + arg + "'");
    if (!has_value) {
      if (i + 1 >= argc) UsageError(name + ": missing value");
      value = argv[++i];
    }
    if (name == "--queue") {
      o.queue = static_cast<int>(ParseUnsigned(name, value, 65535, "a queue number 0..65535"));
    } else if (name == "--delay-ms") {
      o.delay_ms = ParseNumber(name, value, 0, kMaxDelayMs, "milliseconds >= 0 (at most 3600000)");
    } else if (name == "--jitter-ms") {
      o.jitter_ms = ParseNumber(name, value, 0, kMaxDelayMs, "milliseconds >= 0 (at most 3600000)");
    } else if (name == "--loss-percent") {
      o.loss_percent = ParseNumber(name, value, 0, 100, "a percentage 0..100");
    } else {
      o.seed = ParseUnsigned(name, value, UINT64_MAX, "an unsigned 64-bit integer");
    }
  }
  if (o.queue < 0) UsageError("--queue: required (the NFQUEUE number 0..65535 the rules send packets to)");
  return o;
}

}  // namespace ftrun::netdelay
