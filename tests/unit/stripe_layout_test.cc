// StripeLayout's promises (balance, one fragment per member per stripe) and
// a whole group in memory: uneven random shards encoded stripe by stripe
// with ReedSolomon, every set of up to `parity` members lost, and each lost
// member's shard and parity rebuilt byte for byte from the survivors.
#include "plugin/erasure/stripe_layout.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "plugin/erasure/reed_solomon.h"

namespace ftrun {
namespace {

using Bytes = std::vector<uint8_t>;

template <typename F>
void Subsets(int n, int size, F f, std::vector<int> cur = {}, int from = 0) {
  if (static_cast<int>(cur.size()) == size) return f(cur);
  for (int i = from; i < n; ++i) {
    cur.push_back(i);
    Subsets(n, size, f, cur, i + 1);
    cur.pop_back();
  }
}

// A group's members: their shards (uneven) and the parity slices they hold.
struct Group {
  int d, p, n;
  size_t slice;                            // bytes per slice
  std::vector<Bytes> shard;                // per member, its own state
  std::vector<std::map<int, Bytes>> held;  // per member: stripe -> the parity slice it holds
  std::vector<Stripe> stripes;
  std::unique_ptr<ReedSolomon> rs;

  // Slice `s` of member m, zero-padded to `slice` bytes.
  Bytes Slice(const std::vector<Bytes>& shards, int m, int s) const {
    Bytes out(slice, 0);
    const Bytes& b = shards[static_cast<size_t>(m)];
    const size_t at = static_cast<size_t>(s) * slice;
    if (at < b.size())
      std::copy_n(b.begin() + static_cast<std::ptrdiff_t>(at), std::min(slice, b.size() - at), out.begin());
    return out;
  }

  Group(int d_, int p_, std::mt19937_64& rng) : d(d_), p(p_), n(d_ + p_), stripes(StripeLayout(d_, p_)) {
    REQUIRE(ReedSolomon::Create(d, p, &rs).ok());
    size_t longest = 0;
    for (int m = 0; m < n; ++m) {
      Bytes b(1 + rng() % 3000);  // uneven shards
      for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
      longest = std::max(longest, b.size());
      shard.push_back(std::move(b));
    }
    slice = (longest + static_cast<size_t>(d) - 1) / static_cast<size_t>(d);
    held.resize(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
      const Stripe& s = stripes[static_cast<size_t>(j)];
      std::vector<Bytes> in;
      for (const StripeFragment& f : s.data) in.push_back(Slice(shard, f.member, f.slice));
      std::vector<Bytes> out(static_cast<size_t>(p), Bytes(slice));
      std::vector<const uint8_t*> ip;
      std::vector<uint8_t*> op;
      for (Bytes& b : in) ip.push_back(b.data());
      for (Bytes& b : out) op.push_back(b.data());
      rs->Encode(slice, ip.data(), op.data());
      for (int i = 0; i < p; ++i)
        held[static_cast<size_t>(s.parity[static_cast<size_t>(i)])][j] = out[static_cast<size_t>(i)];
    }
  }

  // The bytes of fragment f of stripe j, read from its (surviving) holder.
  Bytes Fragment(int j, int f) const {
    const Stripe& s = stripes[static_cast<size_t>(j)];
    if (f < d) return Slice(shard, s.data[static_cast<size_t>(f)].member, s.data[static_cast<size_t>(f)].slice);
    return held[static_cast<size_t>(s.MemberOf(f))].at(j);
  }
};

}  // namespace

TEST_CASE("stripe layout: each member gives every slice once, holds `parity` parity slices, one fragment per stripe",
          "[erasure]") {
  for (auto [d, p] : {std::pair{1, 1}, {2, 1}, {4, 2}, {6, 3}, {10, 4}}) {
    const int n = d + p;
    auto stripes = StripeLayout(d, p);
    REQUIRE(static_cast<int>(stripes.size()) == n);
    std::map<int, std::set<int>> slices;
    std::map<int, int> parity;
    for (const Stripe& s : stripes) {
      REQUIRE(static_cast<int>(s.data.size()) == d);
      REQUIRE(static_cast<int>(s.parity.size()) == p);
      std::set<int> members;
      for (int f = 0; f < n; ++f) members.insert(s.MemberOf(f));
      REQUIRE(static_cast<int>(members.size()) == n);
      for (const StripeFragment& f : s.data) REQUIRE(slices[f.member].insert(f.slice).second);
      for (int m : s.parity) parity[m]++;
    }
    for (int m = 0; m < n; ++m) {
      CHECK(static_cast<int>(slices[m].size()) == d);
      CHECK(parity[m] == p);  // parity held: p slices of shard/d each
    }
  }
}

TEST_CASE("stripe layout: any `parity` lost members of a group come back byte for byte from the survivors",
          "[erasure]") {
  std::mt19937_64 rng(17);
  for (auto [d, p] : {std::pair{2, 1}, {4, 2}, {3, 3}}) {
    Group g(d, p, rng);
    for (int lost_n = 1; lost_n <= p; ++lost_n) {
      Subsets(g.n, lost_n, [&](const std::vector<int>& lost) {
        std::set<int> gone(lost.begin(), lost.end());
        std::vector<Bytes> rebuilt(static_cast<size_t>(g.n));  // shards of the lost, zero-extended
        std::vector<std::map<int, Bytes>> parity(static_cast<size_t>(g.n));
        for (int m : lost) rebuilt[static_cast<size_t>(m)].assign(static_cast<size_t>(d) * g.slice, 0);
        for (int j = 0; j < g.n; ++j) {
          const Stripe& s = g.stripes[static_cast<size_t>(j)];
          std::vector<int> have, miss;
          std::vector<Bytes> bufs;
          for (int f = 0; f < g.n; ++f) {
            if (gone.count(s.MemberOf(f)))
              miss.push_back(f);
            else if (static_cast<int>(have.size()) < d)
              have.push_back(f), bufs.push_back(g.Fragment(j, f));
          }
          if (miss.empty()) continue;
          std::vector<const uint8_t*> ip;
          for (Bytes& b : bufs) ip.push_back(b.data());
          std::vector<Bytes> out(miss.size(), Bytes(g.slice));
          std::vector<uint8_t*> op;
          for (Bytes& b : out) op.push_back(b.data());
          REQUIRE(g.rs->Decode(g.slice, have, ip.data(), miss, op.data()).ok());
          for (size_t i = 0; i < miss.size(); ++i) {
            const int f = miss[i];
            if (f < d) {
              const StripeFragment& sf = s.data[static_cast<size_t>(f)];
              std::copy(
                  out[i].begin(), out[i].end(),
                  rebuilt[static_cast<size_t>(sf.member)].begin() + static_cast<std::ptrdiff_t>(sf.slice * g.slice));
            } else {
              parity[static_cast<size_t>(s.MemberOf(f))][j] = out[i];
            }
          }
        }
        for (int m : lost) {
          const Bytes& want = g.shard[static_cast<size_t>(m)];
          Bytes& got = rebuilt[static_cast<size_t>(m)];
          REQUIRE(std::all_of(got.begin() + static_cast<std::ptrdiff_t>(want.size()), got.end(),
                              [](uint8_t x) { return x == 0; }));
          got.resize(want.size());
          REQUIRE(got == want);
          REQUIRE(parity[static_cast<size_t>(m)] == g.held[static_cast<size_t>(m)]);
        }
      });
    }
  }
}

}  // namespace ftrun
