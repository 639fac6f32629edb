#include "plugin/common/hash.h"

#include <random>
#include <vector>

#include "tests/catch.h"

using ftrun::ChunkHash;

TEST_CASE("HashAndCopy copies exactly and hashes like HashBytes", "[hash]") {
  std::mt19937_64 rng(7);
  for (size_t n :
       {size_t{0}, size_t{1}, size_t{4095}, size_t{65536}, size_t{65537}, size_t{4u << 20}, size_t{(4u << 20) + 13}}) {
    std::vector<char> src(n), dst(n, 0);
    for (auto& c : src) c = static_cast<char>(rng());
    ChunkHash h = ftrun::HashAndCopy(dst.data(), src.data(), n);
    CHECK(dst == src);
    CHECK(h == ftrun::HashBytes(src.data(), n));
  }
}

TEST_CASE("a single flipped bit changes the chunk hash", "[hash]") {
  std::vector<char> a(1 << 20, 'x');
  ChunkHash before = ftrun::HashBytes(a.data(), a.size());
  a[123456] ^= 0x10;
  CHECK(ftrun::HashBytes(a.data(), a.size()) != before);
  CHECK(before.ToHex().size() == 32);
}

TEST_CASE("RecordChecksum depends on every byte", "[hash]") {
  char rec[64] = {0};
  uint32_t c0 = ftrun::RecordChecksum(rec, sizeof rec);
  rec[63] = 1;
  CHECK(ftrun::RecordChecksum(rec, sizeof rec) != c0);
}
