#include "plugin/config/units.h"

#include <chrono>
#include <cstdint>
#include <string>

#include "tests/catch.h"

namespace ftrun {
namespace {

using std::chrono::milliseconds;

uint64_t Size(const std::string& text) {
  uint64_t v = 12345;
  Status st = ParseSize(text, &v);
  INFO(text << " -> " << st.ToString());
  REQUIRE(st.ok());
  return v;
}

Status SizeError(const std::string& text) {
  uint64_t v = 777;
  Status st = ParseSize(text, &v);
  INFO(text);
  CHECK(v == 777);  // untouched on failure
  return st;
}

milliseconds Dur(const std::string& text) {
  milliseconds v{-1};
  Status st = ParseDuration(text, &v);
  INFO(text << " -> " << st.ToString());
  REQUIRE(st.ok());
  return v;
}

Status DurError(const std::string& text) {
  milliseconds v{777};
  Status st = ParseDuration(text, &v);
  CHECK(v.count() == 777);
  return st;
}

TEST_CASE("ParseSize accepts binary, decimal and bare byte counts", "[units]") {
  CHECK(Size("4GiB") == (4ull << 30));
  CHECK(Size("512MiB") == (512ull << 20));
  CHECK(Size("64KiB") == (64ull << 10));
  CHECK(Size("1TiB") == (1ull << 40));
  CHECK(Size("4GB") == 4000000000ull);
  CHECK(Size("4MB") == 4000000ull);
  CHECK(Size("100KB") == 100000ull);
  CHECK(Size("2TB") == 2000000000000ull);
  CHECK(Size("4096") == 4096);
  CHECK(Size("4096B") == 4096);
  CHECK(Size("0") == 0);
  CHECK(Size("1.5GiB") == (3ull << 29));
  CHECK(Size("0.5KiB") == 512);
  CHECK(Size("0.1KiB") == 102);  // rounded down to whole bytes
  CHECK(Size("4K") == 4096);
  CHECK(Size("4M") == (4ull << 20));
  CHECK(Size("4G") == (4ull << 30));
  CHECK(Size("  4GiB \t") == (4ull << 30));
  CHECK(Size("4 GiB") == (4ull << 30));  // what FormatSize prints
  CHECK(Size("18446744073709551615") == UINT64_MAX);
}

TEST_CASE("ParseSize rejects junk, negatives, overflow and wrong case", "[units]") {
  for (const char* bad : {"", "   ", "4 gigs", "GiB", "4gib", "4GIB", "4kb", "4XB", "abc", "4GiBs", "4.GiB", ".5GiB",
                          "4..5GiB", "1.5", "1.5B", "+4GiB", "4 4GiB", "0x10", "1.1234567GiB"}) {
    Status st = SizeError(bad);
    INFO("input '" << bad << "': " << st.ToString());
    CHECK(st.code() == Code::kInvalidArgument);
    CHECK(st.message().find("expected a size like 4GiB or 512MiB") != std::string::npos);
    CHECK(st.message().find(std::string("got '") + bad + "'") != std::string::npos);
  }
  Status neg = SizeError("-4GiB");
  CHECK(neg.code() == Code::kInvalidArgument);
  CHECK(neg.message().find("negative") != std::string::npos);

  for (const char* big :
       {"18446744073709551616", "16777216TiB", "99999999999999999999999GiB", "18446744073709551615.5KiB"}) {
    Status st = SizeError(big);
    INFO(big << ": " << st.ToString());
    CHECK(st.code() == Code::kInvalidArgument);
    CHECK(st.message().find("larger than") != std::string::npos);
  }
  CHECK(SizeError("4 gigs").message().find("unknown unit 'gigs'") != std::string::npos);
}

TEST_CASE("ParseDuration requires a unit", "[units]") {
  CHECK(Dur("30s") == milliseconds(30000));
  CHECK(Dur("500ms") == milliseconds(500));
  CHECK(Dur("2m") == milliseconds(120000));
  CHECK(Dur("1h") == milliseconds(3600000));
  CHECK(Dur("1.5s") == milliseconds(1500));
  CHECK(Dur("0s") == milliseconds(0));
  CHECK(Dur(" 10 s ") == milliseconds(10000));
  CHECK(Dur("0.25h") == milliseconds(900000));

  Status bare = DurError("30");
  CHECK(bare.code() == Code::kInvalidArgument);
  CHECK(bare.message().find("expected a duration like 30s") != std::string::npos);
  CHECK(bare.message().find("unit is required") != std::string::npos);

  for (const char* bad :
       {"", "s", "30sec", "30 seconds", "30S", "-1s", "1.5ms", "0.0001s", "1d", "abc", "9999999999999999999h"}) {
    Status st = DurError(bad);
    INFO("input '" << bad << "': " << st.ToString());
    CHECK(st.code() == Code::kInvalidArgument);
    CHECK(st.message().find(std::string("got '") + bad + "'") != std::string::npos);
  }
}

TEST_CASE("FormatSize prints powers of 1024", "[units]") {
  CHECK(FormatSize(0) == "0 B");
  CHECK(FormatSize(512) == "512 B");
  CHECK(FormatSize(1023) == "1023 B");
  CHECK(FormatSize(1024) == "1.0 KiB");
  CHECK(FormatSize(4ull << 30) == "4.0 GiB");
  CHECK(FormatSize(512ull << 20) == "512 MiB");
  CHECK(FormatSize(3355443) == "3.2 MiB");
  CHECK(FormatSize(16ull << 30) == "16.0 GiB");
  CHECK(FormatSize((1ull << 20) - 1) == "1.0 MiB");  // not "1024 KiB"
  CHECK(FormatSize(UINT64_MAX) == "16.0 EiB");
}

TEST_CASE("FormatSize output parses back", "[units]") {
  for (uint64_t v : {512ull, 4ull << 30, 512ull << 20, 64ull << 10}) {
    CHECK(Size(FormatSize(v)) == v);
  }
}

}  // namespace
}  // namespace ftrun
