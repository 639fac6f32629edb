#include "plugin/config/units.h"

#include <cstdio>
#include <limits>

namespace ftrun {
namespace {

constexpr int kMaxFractionDigits = 6;  // keeps fraction * unit within 64 bits

struct Unit {
  const char* suffix;
  uint64_t factor;
};

constexpr uint64_t kKiB = 1ull << 10;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kTiB = 1ull << 40;

constexpr Unit kSizeUnits[] = {
    {"", 1},
    {"B", 1},
    {"KiB", kKiB},
    {"MiB", kMiB},
    {"GiB", kGiB},
    {"TiB", kTiB},
    {"K", kKiB},
    {"M", kMiB},
    {"G", kGiB},
    {"T", kTiB},
    {"KB", 1000ull},
    {"MB", 1000000ull},
    {"GB", 1000000000ull},
    {"TB", 1000000000000ull},
};

constexpr Unit kDurationUnits[] = {
    {"ms", 1},
    {"s", 1000},
    {"m", 60 * 1000},
    {"h", 60 * 60 * 1000},
};

bool IsSpace(char c) { return c == ' ' || c == '\t'; }

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && IsSpace(s[b])) ++b;
  while (e > b && IsSpace(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// "<number><spaces><unit>" split into its parts. The value is
// whole + fraction / 10^fraction_digits.
struct Quantity {
  uint64_t whole = 0;
  uint64_t fraction = 0;
  int fraction_digits = 0;
  bool too_large = false;  // whole part did not fit in 64 bits
  std::string unit;
};

// False when `s` does not start with a number; *why then may hold a reason
// more specific than "not a size".
bool SplitQuantity(const std::string& s, Quantity* q, std::string* why) {
  size_t i = 0;
  if (i < s.size() && s[i] == '-') {
    *why = "cannot be negative";
    return false;
  }
  size_t digits_start = i;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    uint64_t d = static_cast<uint64_t>(s[i] - '0');
    if (q->whole > (std::numeric_limits<uint64_t>::max() - d) / 10) q->too_large = true;
    if (!q->too_large) q->whole = q->whole * 10 + d;
    ++i;
  }
  if (i == digits_start) return false;
  if (i < s.size() && s[i] == '.') {
    ++i;
    size_t frac_start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      if (q->fraction_digits == kMaxFractionDigits) {
        *why = "at most 6 decimal places";
        return false;
      }
      q->fraction = q->fraction * 10 + static_cast<uint64_t>(s[i] - '0');
      ++q->fraction_digits;
      ++i;
    }
    if (i == frac_start) return false;
  }
  while (i < s.size() && IsSpace(s[i])) ++i;
  q->unit = s.substr(i);
  return true;
}

uint64_t Pow10(int n) {
  uint64_t p = 1;
  while (n-- > 0) p *= 10;
  return p;
}

// whole * factor + fraction * factor / 10^digits, rounded down; false on
// overflow. fraction < 10^6 and factor <= 10^12 keep the product in range.
bool Scale(const Quantity& q, uint64_t factor, uint64_t* out, bool* exact) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  if (q.too_large || (factor != 0 && q.whole > kMax / factor)) return false;
  uint64_t whole = q.whole * factor;
  uint64_t scaled = q.fraction * factor;
  uint64_t denom = Pow10(q.fraction_digits);
  uint64_t frac = scaled / denom;
  *exact = scaled % denom == 0;
  if (whole > kMax - frac) return false;
  *out = whole + frac;
  return true;
}

Status SizeError(const std::string& text, const std::string& why) {
  std::string m = "expected a size like 4GiB or 512MiB, got '" + text + "'";
  if (!why.empty()) m += " (" + why + ")";
  return Status::InvalidArgument(m);
}

Status DurationError(const std::string& text, const std::string& why) {
  std::string m = "expected a duration like 30s, 500ms, 2m or 1h, got '" + text + "'";
  if (!why.empty()) m += " (" + why + ")";
  return Status::InvalidArgument(m);
}

}  // namespace

Status ParseSize(const std::string& text, uint64_t* out) {
  std::string s = Trim(text);
  Quantity q;
  std::string why;
  if (!SplitQuantity(s, &q, &why)) return SizeError(text, why);
  for (const Unit& u : kSizeUnits) {
    if (q.unit != u.suffix) continue;
    if (u.factor == 1 && q.fraction_digits > 0) {
      return SizeError(text, "a byte count must be a whole number");
    }
    uint64_t bytes = 0;
    bool exact = true;
    if (!Scale(q, u.factor, &bytes, &exact)) return SizeError(text, "larger than 2^64-1 bytes");
    *out = bytes;
    return Status::Ok();
  }
  return SizeError(text, "unknown unit '" + q.unit + "'; use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB");
}

Status ParseDuration(const std::string& text, std::chrono::milliseconds* out) {
  std::string s = Trim(text);
  Quantity q;
  std::string why;
  if (!SplitQuantity(s, &q, &why)) return DurationError(text, why);
  if (q.unit.empty()) return DurationError(text, "a unit is required: ms, s, m or h");
  for (const Unit& u : kDurationUnits) {
    if (q.unit != u.suffix) continue;
    uint64_t ms = 0;
    bool exact = true;
    using Rep = std::chrono::milliseconds::rep;
    if (!Scale(q, u.factor, &ms, &exact) || ms > static_cast<uint64_t>(std::numeric_limits<Rep>::max())) {
      return DurationError(text, "too large");
    }
    if (!exact) return DurationError(text, "finer than a millisecond");
    *out = std::chrono::milliseconds(static_cast<Rep>(ms));
    return Status::Ok();
  }
  return DurationError(text, "unknown unit '" + q.unit + "'; use ms, s, m or h");
}

std::string FormatSize(uint64_t bytes) {
  static const char* const kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  constexpr int kLast = sizeof(kNames) / sizeof(kNames[0]) - 1;
  if (bytes < 1024) return std::to_string(bytes) + " B";
  int unit = 0;
  double value = static_cast<double>(bytes);
  while (unit < kLast && value >= 1024.0) {
    value /= 1024.0;
    ++unit;
  }
  // "1023.97 KiB" would print as "1024 KiB"; move it up a unit instead.
  if (unit < kLast && value >= 1023.5) {
    value /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (value < 99.95) {
    std::snprintf(buf, sizeof(buf), "%.1f %s", value, kNames[unit]);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f %s", value, kNames[unit]);
  }
  return buf;
}

}  // namespace ftrun
