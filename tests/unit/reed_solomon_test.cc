// ReedSolomon against the Cauchy matrix multiplied out with ISA-L's gf_mul on random
// data, every erasure pattern up to `parity` lost fragments decoded from
// every choice of survivors, incremental updates equal to a full encode, and
// the arguments it refuses.
#include "plugin/erasure/reed_solomon.h"

#include <isa-l/erasure_code.h>

#include <random>
#include <vector>

#include "tests/catch.h"
#include "tests/unit/subsets.h"

namespace ftrun {
namespace {

using Bytes = std::vector<uint8_t>;

std::vector<Bytes> Random(int n, size_t len, std::mt19937_64& rng) {
  std::vector<Bytes> v(static_cast<size_t>(n), Bytes(len));
  for (Bytes& b : v) {
    for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
  }
  return v;
}

std::vector<const uint8_t*> In(const std::vector<Bytes>& v) {
  std::vector<const uint8_t*> p;
  for (const Bytes& b : v) p.push_back(b.data());
  return p;
}

std::vector<uint8_t*> Out(std::vector<Bytes>& v) {
  std::vector<uint8_t*> p;
  for (Bytes& b : v) p.push_back(b.data());
  return p;
}

// The data and parity fragments of a code, encoded.
struct Coded {
  std::unique_ptr<ReedSolomon> rs;
  std::vector<Bytes> frags;  // data then parity

  Coded(int d, int p, size_t len, std::mt19937_64& rng) {
    REQUIRE(ReedSolomon::Create(d, p, &rs).ok());
    frags = Random(d, len, rng);
    std::vector<Bytes> parity(static_cast<size_t>(p), Bytes(len));
    auto in = In(frags);
    rs->Encode(len, in.data(), Out(parity).data());
    frags.insert(frags.end(), parity.begin(), parity.end());
  }
};

}  // namespace

TEST_CASE("reed-solomon: parity is the Cauchy matrix times the data in GF(2^8)", "[erasure]") {
  std::mt19937_64 rng(7);
  for (auto [d, p] : {std::pair{1, 1}, {2, 1}, {4, 2}, {6, 3}, {10, 4}, {32, 8}}) {
    for (size_t len : {size_t{1}, size_t{31}, size_t{4097}, size_t{65536}}) {
      Coded c(d, p, len, rng);
      // The reference: ISA-L's Cauchy matrix, multiplied out byte by byte with
      // gf_mul. (Not ec_encode_data_base: from ISA-L 2.31, ec_init_tables
      // lays its tables out for GFNI where the CPU has it, which the base
      // encoder does not read.)
      std::vector<uint8_t> m(static_cast<size_t>((d + p) * d));
      gf_gen_cauchy1_matrix(m.data(), d + p, d);
      std::vector<Bytes> want(static_cast<size_t>(p), Bytes(len));
      for (int i = 0; i < p; ++i) {
        for (int j = 0; j < d; ++j) {
          const uint8_t coef = m[static_cast<size_t>((d + i) * d + j)];
          const Bytes& src = c.frags[static_cast<size_t>(j)];
          Bytes& dst = want[static_cast<size_t>(i)];
          for (size_t k = 0; k < len; ++k) dst[k] ^= gf_mul(coef, src[k]);
        }
      }
      for (int i = 0; i < p; ++i) CHECK(c.frags[static_cast<size_t>(d + i)] == want[static_cast<size_t>(i)]);
    }
  }
}

TEST_CASE("reed-solomon: every pattern of up to `parity` lost fragments comes back from every choice of survivors",
          "[erasure]") {
  std::mt19937_64 rng(11);
  for (auto [d, p] : {std::pair{1, 1}, {2, 1}, {3, 2}, {4, 2}, {6, 3}, {8, 4}}) {
    const int n = d + p;
    const size_t len = 1000 + static_cast<size_t>(rng() % 100);
    Coded c(d, p, len, rng);
    int patterns = 0;
    for (int lost_n = 1; lost_n <= p; ++lost_n) {
      Subsets(n, lost_n, [&](const std::vector<int>& lost) {
        std::vector<int> alive;
        for (int f = 0; f < n; ++f) {
          if (std::find(lost.begin(), lost.end(), f) == lost.end()) alive.push_back(f);
        }
        Subsets(static_cast<int>(alive.size()), d, [&](const std::vector<int>& pick) {
          std::vector<int> have;
          std::vector<const uint8_t*> bufs;
          for (int i : pick) {
            have.push_back(alive[static_cast<size_t>(i)]);
            bufs.push_back(c.frags[static_cast<size_t>(have.back())].data());
          }
          std::vector<Bytes> out(lost.size(), Bytes(len));
          REQUIRE(c.rs->Decode(len, have, bufs.data(), lost, Out(out).data()).ok());
          for (size_t l = 0; l < lost.size(); ++l) REQUIRE(out[l] == c.frags[static_cast<size_t>(lost[l])]);
          patterns++;
        });
      });
    }
    CHECK(patterns > 0);
  }
}

TEST_CASE("reed-solomon: deltas of changed data bring parity to the full encode of the new data", "[erasure]") {
  std::mt19937_64 rng(13);
  for (auto [d, p] : {std::pair{2, 1}, {4, 2}, {10, 4}}) {
    const size_t len = 8192;
    Coded c(d, p, len, rng);
    std::vector<Bytes> parity(c.frags.begin() + d, c.frags.end());
    // Change a few ranges of a few fragments, some twice; apply only the deltas of the changed bytes.
    for (int round = 0; round < 6; ++round) {
      const int f = static_cast<int>(rng() % static_cast<uint64_t>(d));
      const size_t at = rng() % len, n = 1 + rng() % (len - at);
      Bytes delta(n);
      for (size_t i = 0; i < n; ++i) {
        const uint8_t v = static_cast<uint8_t>(rng());
        delta[i] = c.frags[static_cast<size_t>(f)][at + i] ^ v;
        c.frags[static_cast<size_t>(f)][at + i] = v;
      }
      std::vector<uint8_t*> out;
      for (Bytes& b : parity) out.push_back(b.data() + at);
      c.rs->Update(n, f, delta.data(), out.data());
    }
    std::vector<Bytes> full(static_cast<size_t>(p), Bytes(len));
    std::vector<Bytes> data(c.frags.begin(), c.frags.begin() + d);
    c.rs->Encode(len, In(data).data(), Out(full).data());
    CHECK(parity == full);
  }
}

TEST_CASE("reed-solomon: refuses codes out of range and decodes it cannot do, naming why", "[erasure]") {
  std::unique_ptr<ReedSolomon> rs;
  CHECK(ReedSolomon::Create(0, 2, &rs).message() == "data fragments: expected 1 to 32, got 0");
  CHECK(ReedSolomon::Create(33, 2, &rs).message() == "data fragments: expected 1 to 32, got 33");
  CHECK(ReedSolomon::Create(4, 0, &rs).message() == "parity fragments: expected 1 to 8, got 0");
  CHECK(ReedSolomon::Create(4, 9, &rs).message() == "parity fragments: expected 1 to 8, got 9");
  REQUIRE(ReedSolomon::Create(4, 2, &rs).ok());
  Bytes b(16), o(16);
  std::vector<const uint8_t*> bufs(4, b.data());
  std::vector<uint8_t*> out(3, o.data());
  auto err = [&](std::vector<int> have, std::vector<int> lost) {
    std::vector<const uint8_t*> in(have.size(), b.data());
    return rs->Decode(16, have, in.data(), lost, out.data()).message();
  };
  CHECK(err({0, 1, 2}, {3}) == "erasure decode: expected 4 surviving fragments, got 3");
  CHECK(err({0, 1, 2, 3}, {4, 5, 5}) == "erasure decode: 3 lost fragments: the code rebuilds at most 2");
  CHECK(err({0, 1, 2, 6}, {4}) == "erasure decode: fragment 6 out of 0..5");
  CHECK(err({0, 1, 2, 2}, {4}) == "erasure decode: fragment 2 given twice");
  CHECK(err({0, 1, 2, 3}, {3}) == "erasure decode: fragment 3 is both had and lost");
  CHECK(err({0, 1, 2, 3}, {-1}) == "erasure decode: fragment -1 out of 0..5");
  CHECK(err({0, 1, 2, 3}, {}).empty());
}

}  // namespace ftrun
