// The rank <-> agent messages: each round-trips through its codec,
// and a truncated or padded payload is refused by name.
#include "plugin/ipc/rank_messages.h"

#include "tests/catch.h"

namespace ftrun {

TEST_CASE("the rank's messages round-trip and refuse a malformed payload", "[ipc]") {
  AllocMsg alloc{7, true, {65536, 12, 1}};
  AllocMsg a;
  REQUIRE(Decode(Encode(alloc), &a).ok());
  CHECK(a.version == 7);
  CHECK(a.first);
  CHECK(a.lengths == alloc.lengths);

  AllocOkMsg ok;
  REQUIRE(Decode(Encode(AllocOkMsg{{4096, 8192}}), &ok).ok());
  CHECK(ok.offsets == std::vector<uint64_t>{4096, 8192});

  WaitCommittedMsg wait;
  REQUIRE(Decode(Encode(WaitCommittedMsg{42, -1}), &wait).ok());
  CHECK(wait.version == 42);
  CHECK(wait.timeout_ms == -1);

  ListOkMsg list{{1, 2}, {3}, true, 2};
  ListOkMsg l;
  REQUIRE(Decode(Encode(list), &l).ok());
  CHECK(l.committed == list.committed);
  CHECK(l.pending == list.pending);
  CHECK(l.has_committed);
  CHECK(l.committed_version == 2);

  RankHello hello{3, 5, 4321, "job", HelloRole::kWriter};
  RankHello h;
  REQUIRE(RankHello::Decode(Encode(hello), &h).ok());
  CHECK((h.protocol == 3 && h.rank == 5 && h.pid == 4321 && h.job == "job" && h.role == HelloRole::kWriter));

  HelloOkMsg hello_ok;
  REQUIRE(Decode(Encode(HelloOkMsg{"job", 2, 1 << 20, std::nullopt}), &hello_ok).ok());
  CHECK((hello_ok.job_id == "job" && hello_ok.node == 2 && hello_ok.chunk_size == (1u << 20)));
  CHECK_FALSE(hello_ok.restore_version.has_value());
  REQUIRE(Decode(Encode(HelloOkMsg{"job", 2, 1 << 20, 0}), &hello_ok).ok());
  CHECK(hello_ok.restore_version == std::optional<uint64_t>(0));  // version 0 is a version, not none

  SaveOkMsg save_ok;
  REQUIRE(Decode(Encode(SaveOkMsg{9, 8}), &save_ok).ok());
  CHECK((save_ok.version == 9 && save_ok.committed == std::optional<uint64_t>(8)));

  VersionMsg v;
  REQUIRE(Decode(Encode(VersionMsg{~0ull}), &v, "load request").ok());
  CHECK(v.version == ~0ull);
  CHECK_THAT(Decode(Encode(VersionMsg{1}) + "x", &v, "load request").message(),
             Catch::Contains("malformed load request"));

  CorruptChunkReport report{4, "w", 2, ChunkHash{5, 6}};
  CorruptChunkReport c;
  REQUIRE(CorruptChunkReport::Decode(Encode(report), &c).ok());
  CHECK((c.version == 4 && c.tensor == "w" && c.index == 2 && c.seen.lo == 5 && c.seen.hi == 6));

  std::string e = Encode(alloc);
  CHECK_THAT(Decode(e.substr(0, e.size() - 1), &a).message(), Catch::Contains("malformed reserve request"));
  CHECK_THAT(Decode(e + "x", &a).message(), Catch::Contains("malformed reserve request"));
  // A count larger than the bytes that follow is refused before anything is allocated for it.
  std::string huge = Encode(AllocOkMsg{});
  huge[0] = huge[1] = huge[2] = huge[3] = '\xff';
  CHECK(Decode(huge, &ok).code() == Code::kCorruption);
  e = Encode(WaitCommittedMsg{1, 5});
  CHECK_THAT(Decode(e.substr(0, 4), &wait).message(), Catch::Contains("malformed wait request"));
  e = Encode(list);
  CHECK_THAT(Decode(e + "\x01", &l).message(), Catch::Contains("malformed version list"));
}

}  // namespace ftrun
