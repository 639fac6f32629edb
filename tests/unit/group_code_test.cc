// GroupCode on a whole group in memory: uneven random shards encoded, every
// set of up to `parity` members lost, and each lost member's shard and
// parity rebuilt byte for byte from the survivors; the memory each member
// holds; and the inputs it refuses.
#include "plugin/erasure/group_code.h"

#include <algorithm>
#include <random>
#include <set>

#include "tests/catch.h"
#include "tests/unit/subsets.h"

namespace ftrun {
namespace {

using Bytes = std::vector<uint8_t>;

struct Group {
  std::unique_ptr<GroupCode> code;
  size_t slice = 0;
  std::vector<Bytes> shard;              // per member, uneven
  std::vector<std::vector<Bytes>> held;  // per member, its parity slices

  Group(int d, int p, std::mt19937_64& rng) {
    REQUIRE(GroupCode::Create(d, p, &code).ok());
    size_t longest = 0;
    for (int m = 0; m < d + p; ++m) {
      Bytes b(1 + rng() % 3000);
      for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
      longest = std::max(longest, b.size());
      shard.push_back(std::move(b));
    }
    slice = code->SliceLength(longest);
    std::vector<ConstBytes> in;
    std::vector<std::vector<uint8_t*>> out(shard.size());
    held.resize(shard.size());
    for (size_t m = 0; m < shard.size(); ++m) {
      in.push_back({shard[m].data(), shard[m].size()});
      held[m].assign(static_cast<size_t>(p), Bytes(slice));
      for (Bytes& b : held[m]) out[m].push_back(b.data());
    }
    REQUIRE(code->Encode(in, slice, out).ok());
  }
};

}  // namespace

TEST_CASE("group code: any `parity` lost members come back byte for byte from the survivors", "[erasure]") {
  std::mt19937_64 rng(17);
  for (auto [d, p] : {std::pair{1, 1}, {2, 1}, {4, 2}, {3, 3}, {6, 2}}) {
    Group g(d, p, rng);
    const int n = d + p;
    // Each member holds p parity slices of ceil(longest / d) bytes: p/d of the longest shard.
    for (int m = 0; m < n; ++m) {
      REQUIRE(g.code->ParityStripes(m).size() == static_cast<size_t>(p));
      for (int i = 0; i < p; ++i) {  // slot i: row i of its stripe
        const Stripe& s = g.code->stripes()[static_cast<size_t>(g.code->ParityStripes(m)[static_cast<size_t>(i)])];
        CHECK(s.parity[static_cast<size_t>(i)] == m);
      }
    }
    int patterns = 0;
    for (int lost_n = 1; lost_n <= p; ++lost_n) {
      Subsets(n, lost_n, [&](const std::vector<int>& lost) {
        std::set<int> gone(lost.begin(), lost.end());
        std::vector<ConstBytes> shards(static_cast<size_t>(n));
        std::vector<std::vector<const uint8_t*>> held(static_cast<size_t>(n));
        for (int m = 0; m < n; ++m) {
          if (gone.count(m)) continue;  // nothing of a lost member is read
          shards[static_cast<size_t>(m)] = {g.shard[static_cast<size_t>(m)].data(),
                                            g.shard[static_cast<size_t>(m)].size()};
          for (const Bytes& b : g.held[static_cast<size_t>(m)]) held[static_cast<size_t>(m)].push_back(b.data());
        }
        std::vector<Bytes> shard_out(lost.size(), Bytes(static_cast<size_t>(d) * g.slice, 0xEE));
        std::vector<std::vector<Bytes>> parity_out(lost.size(),
                                                   std::vector<Bytes>(static_cast<size_t>(p), Bytes(g.slice)));
        std::vector<uint8_t*> so;
        std::vector<std::vector<uint8_t*>> po(lost.size());
        for (size_t l = 0; l < lost.size(); ++l) {
          so.push_back(shard_out[l].data());
          for (Bytes& b : parity_out[l]) po[l].push_back(b.data());
        }
        REQUIRE(g.code->Rebuild(lost, shards, held, g.slice, so, po).ok());
        for (size_t l = 0; l < lost.size(); ++l) {
          const Bytes& want = g.shard[static_cast<size_t>(lost[l])];
          REQUIRE(std::all_of(shard_out[l].begin() + static_cast<std::ptrdiff_t>(want.size()), shard_out[l].end(),
                              [](uint8_t x) { return x == 0; }));  // past the end: the zeros it was coded with
          shard_out[l].resize(want.size());
          REQUIRE(shard_out[l] == want);
          REQUIRE(parity_out[l] == g.held[static_cast<size_t>(lost[l])]);
        }
        patterns++;
      });
    }
    CHECK(patterns > 0);
  }
}

TEST_CASE("group code: deltas applied by each parity holder to its own slice equal a full encode of the new shards",
          "[erasure]") {
  std::mt19937_64 rng(23);
  for (auto [d, p] : {std::pair{2, 1}, {4, 2}, {3, 3}}) {
    Group g(d, p, rng);
    const int n = d + p;
    for (int m = 0; m < n; ++m) {
      for (int sl = 0; sl < d; ++sl) {
        auto at = g.code->Locate(m, static_cast<size_t>(sl) * g.slice + 3, g.slice);
        const StripeFragment& f =
            g.code->stripes()[static_cast<size_t>(at.stripe)].data[static_cast<size_t>(at.fragment)];
        REQUIRE((f.member == m && f.slice == sl && at.offset == 3));
      }
    }
    for (int change = 0; change < 20; ++change) {
      const int m = static_cast<int>(rng() % static_cast<uint64_t>(n));
      Bytes& b = g.shard[static_cast<size_t>(m)];
      const size_t off = rng() % b.size();
      auto at = g.code->Locate(m, off, g.slice);
      const size_t len = 1 + rng() % std::min(b.size() - off, g.slice - at.offset);  // within one slice
      Bytes delta(len);
      for (size_t i = 0; i < len; ++i) {
        const uint8_t v = static_cast<uint8_t>(rng());
        delta[i] = b[off + i] ^ v;
        b[off + i] = v;
      }
      const Stripe& s = g.code->stripes()[static_cast<size_t>(at.stripe)];
      for (int row = 0; row < p; ++row) {  // each holder, its own slice
        const int holder = s.parity[static_cast<size_t>(row)];
        g.code->ApplyDelta(at, row, delta.data(), len,
                           g.held[static_cast<size_t>(holder)][static_cast<size_t>(row)].data() + at.offset);
      }
    }
    std::vector<ConstBytes> in;
    std::vector<std::vector<Bytes>> full(static_cast<size_t>(n),
                                         std::vector<Bytes>(static_cast<size_t>(p), Bytes(g.slice)));
    std::vector<std::vector<uint8_t*>> out(static_cast<size_t>(n));
    for (int m = 0; m < n; ++m) {
      in.push_back({g.shard[static_cast<size_t>(m)].data(), g.shard[static_cast<size_t>(m)].size()});
      for (Bytes& b : full[static_cast<size_t>(m)]) out[static_cast<size_t>(m)].push_back(b.data());
    }
    REQUIRE(g.code->Encode(in, g.slice, out).ok());
    CHECK(full == g.held);
  }
}

TEST_CASE("group code: refuses inputs that do not fit the group, naming them", "[erasure]") {
  std::mt19937_64 rng(19);
  Group g(2, 1, rng);
  std::vector<ConstBytes> shards(3);
  std::vector<std::vector<uint8_t*>> parity(3);
  CHECK(g.code->Encode(std::vector<ConstBytes>(2), g.slice, parity).message() ==
        "erasure encode: expected 3 members, got 2 shards and 3 parity lists");
  Bytes big(2 * g.slice + 1);
  shards[1] = {big.data(), big.size()};
  CHECK(g.code->Encode(shards, g.slice, parity).message() ==
        "erasure encode: member 1's shard (" + std::to_string(big.size()) + " bytes) is longer than 2 slices of " +
            std::to_string(g.slice));
  shards[1] = {};
  CHECK(g.code->Encode(shards, g.slice, parity).message() ==
        "erasure encode: member 0 holds 1 parity slices, got 0 buffers");
  std::vector<std::vector<const uint8_t*>> held(3);
  Bytes out(2 * g.slice), par(g.slice);
  CHECK(g.code->Rebuild({0, 1}, shards, held, g.slice, {out.data(), out.data()}, {{par.data()}, {par.data()}})
            .message() == "erasure rebuild: 2 members lost: the code rebuilds at most 1");
  CHECK(g.code->Rebuild({3}, shards, held, g.slice, {out.data()}, {{par.data()}}).message() ==
        "erasure rebuild: member 3 out of 0..2");
  CHECK(g.code->Rebuild({0}, shards, held, g.slice, {out.data()}, {{par.data()}}).message() ==
        "erasure rebuild: surviving member 1: expected its 1 parity slices");
}

}  // namespace ftrun
