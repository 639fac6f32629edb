// ParityRows keeps its blocks in the store's arena: they count in the
// store's budget, versions share them until one writes (copy-on-write), a
// delta that does not fit is refused naming store.memory_budget (the
// complete versions stay readable), and every block goes back to the store
// when its versions go.
#include "plugin/erasure/parity_rows.h"

#include <vector>

#include "tests/catch.h"

namespace ftrun {
namespace {

constexpr uint64_t kBase = 4096, kData = 256 << 10;

struct Fixture {
  Fixture() : arena(kBase + kData), store(kBase, kData, "job.yaml:3: store.memory_budget") {
    REQUIRE(GroupCode::Create(2, 1, &code).ok());
  }
  // Every contributor of every row of `version` done.
  void Finish(uint64_t version, std::optional<uint64_t> base, ParityRows& rows) {
    for (int slot = 0; slot < rows.slots(); ++slot)
      for (int f = 0; f < code->data(); ++f) rows.Done(version, base, 1, slot, f);
    REQUIRE(rows.Complete(version));
  }
  std::vector<char> arena;
  SnapshotStore store;
  std::unique_ptr<GroupCode> code;
};

TEST_CASE("parity rows live in the store's arena, within its budget", "[erasure][parity_rows]") {
  Fixture f;
  std::vector<uint8_t> delta(100 << 10, 7);
  GroupCode::Place at;
  at.fragment = 0;
  {
    ParityRows rows(f.code.get(), 0, &f.store, f.arena.data());
    REQUIRE(rows.Apply(1, std::nullopt, 1, 0, at, delta.data(), delta.size()).ok());
    f.Finish(1, std::nullopt, rows);
    const uint64_t one = f.store.Stats().block_bytes;
    CHECK(one >= delta.size());
    CHECK(rows.memory_bytes() == one);
    CHECK(f.store.Stats().used_bytes == one);

    // Version 2 from 1: a small delta copies the block it touches, only.
    at.offset = 10;
    REQUIRE(rows.Apply(2, 1, 1, 0, at, delta.data(), 16).ok());
    f.Finish(2, 1, rows);
    CHECK(f.store.Stats().block_bytes == 2 * one);
    std::vector<uint8_t> a(delta.size()), b(delta.size());
    REQUIRE(rows.Read(1, 0, 0, a.size(), a.data()).ok());
    REQUIRE(rows.Read(2, 0, 0, b.size(), b.data()).ok());
    CHECK(a != b);

    // Version 3 would need more than is left: refused, naming the budget;
    // version 2 still reads the same.
    at.offset = 0;
    std::vector<uint8_t> big(200 << 10, 9);
    Status s = rows.Apply(3, 2, 1, 0, at, big.data(), big.size());
    CHECK(s.code() == Code::kResourceExhausted);
    CHECK(s.message().find("erasure parity") != std::string::npos);
    CHECK(s.message().find("job.yaml:3: store.memory_budget") != std::string::npos);
    std::vector<uint8_t> c(delta.size());
    REQUIRE(rows.Read(2, 0, 0, c.size(), c.data()).ok());
    CHECK(c == b);

    // Committing 2 gives version 1's own blocks back (the refused version 3
    // is discarded).
    rows.Committed(2);
    rows.DiscardAbove(2);
    CHECK(f.store.Stats().block_bytes == one);
  }
  CHECK(f.store.Stats().block_bytes == 0);  // the rows gone: every block back
  CHECK(f.store.Stats().used_bytes == 0);
}

}  // namespace
}  // namespace ftrun
