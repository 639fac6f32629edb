// The persist directory's names and file formats: round trips, and every
// corruption a reader must notice.
#include "plugin/persist/disk_format.h"
#include "tests/catch.h"
#include "tests/unit/persist_test_util.h"

namespace ftrun {

TEST_CASE("persist names and their parsers", "[persist][format]") {
  CHECK(VersionDirName(12) == "v00000000000000000012");
  CHECK(VersionDirName(UINT64_MAX) == "v18446744073709551615");
  uint64_t v = 0;
  CHECK(ParseVersionDirName("v00000000000000000012", &v));
  CHECK(v == 12);
  CHECK(ParseVersionDirName(VersionDirName(UINT64_MAX), &v));
  CHECK(v == UINT64_MAX);
  for (const char* bad : {"v12", "v0000000000000000001x", "x00000000000000000012", "v99999999999999999999",
                          "v00000000000000000012.n0.tmp"}) {
    CHECK_FALSE(ParseVersionDirName(bad, &v));
  }
  int i = -1;
  CHECK(ParseManifestFileName("rank3.manifest", &i));
  CHECK(i == 3);
  CHECK_FALSE(ParseManifestFileName("rank03.manifest", &i));
  CHECK_FALSE(ParseManifestFileName("rank3.manifest.n0.tmp", &i));
  CHECK_FALSE(ParseManifestFileName("rank.manifest", &i));
  CHECK(ParseNodeMarkerName(NodeMarkerName(17), &i));
  CHECK(i == 17);
  CHECK_FALSE(ParseNodeMarkerName("node1.COMPLETE.n1.tmp", &i));
  CHECK(IsTmpName("node1.COMPLETE.n4.tmp", &i));
  CHECK(i == 4);
  CHECK(IsTmpName(TmpName("0123", 12), &i));
  CHECK(i == 12);
  CHECK_FALSE(IsTmpName("rank1.manifest", &i));

  ChunkHash h = HashBytes("abc", 3);
  ChunkHash back;
  REQUIRE(ParseChunkFileName(h.ToHex(), &back));
  CHECK(back == h);
  CHECK_FALSE(ParseChunkFileName(h.ToHex() + ".n0.tmp", &back));
  CHECK_FALSE(ParseChunkFileName(std::string(32, 'g'), &back));
  CHECK(ChunkPath("/p/job", h) == "/p/job/chunks/" + h.ToHex().substr(0, 2) + "/" + h.ToHex());
  CHECK(VersionDir(PersistJobDir("/p", "job"), 5) == "/p/job/v00000000000000000005");
}

TEST_CASE("chunk headers round-trip and notice any flipped bit", "[persist][format]") {
  ChunkHash h = HashBytes("xyz", 3);
  std::string header(kChunkHeaderSize, '\0');
  EncodeChunkHeader(h, 4 << 20, header.data());
  ChunkHash got;
  uint64_t len = 0;
  REQUIRE(DecodeChunkHeader(header.data(), header.size(), "c", &got, &len).ok());
  CHECK(got == h);
  CHECK(len == (4u << 20));
  for (size_t byte : {0, 1, 8, 12, 16, 20, 35, 36, 43, 44, 100, 4091, 4092, 4095}) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = header;
      bad[byte] ^= static_cast<char>(1 << bit);
      Status st = DecodeChunkHeader(bad.data(), bad.size(), "chunks/ab/x", &got, &len);
      INFO("byte " << byte << " bit " << bit);
      CHECK(st.code() == Code::kCorruption);
      CHECK(Contains(st.message(), "chunks/ab/x"));
    }
  }
  CHECK(DecodeChunkHeader(header.data(), 100, "c", &got, &len).code() == Code::kCorruption);
}

TEST_CASE("manifest files round-trip without arena offsets", "[persist][format]") {
  ChunkBank bank;
  Manifest m = bank.Build(1, 9, {{"w", 200000, 1}, {"b", 10, 2}});
  std::string bytes = EncodeManifestFile("job-a", 4, m);
  ManifestFile f;
  REQUIRE(DecodeManifestFile(bytes, "m", &f).ok());
  CHECK(f.job_id == "job-a");
  CHECK(f.world_size == 4);
  CHECK(f.manifest.rank == 1);
  CHECK(f.manifest.version == 9);
  CHECK(f.manifest.user_bytes == m.user_bytes);
  REQUIRE(f.manifest.tensors.size() == 2);
  CHECK(f.manifest.tensors[0].chunks.size() == 4);
  for (const auto& t : f.manifest.tensors) {
    for (const auto& c : t.chunks) CHECK(c.offset == kNoOffset);
  }
  CHECK(f.manifest.tensors[0].chunks[3].hash == m.tensors[0].chunks[3].hash);
  CHECK(CheckSameLayout(m, f.manifest).ok());
  // Deterministic: two nodes writing the same rank write the same bytes.
  CHECK(EncodeManifestFile("job-a", 4, f.manifest) == bytes);
}

TEST_CASE("a torn or flipped manifest file is refused, naming the file", "[persist][format]") {
  ChunkBank bank;
  std::string bytes = EncodeManifestFile("j", 2, bank.Build(0, 3, {{"t", 1000, 5}}));
  ManifestFile f;
  for (size_t cut : {size_t{0}, size_t{11}, size_t{30}, bytes.size() / 2, bytes.size() - 1}) {
    Status st = DecodeManifestFile(bytes.substr(0, cut), "v/rank0.manifest", &f);
    CHECK(st.code() == Code::kCorruption);
    CHECK(Contains(st.message(), "'v/rank0.manifest'"));
  }
  for (size_t byte = 0; byte < bytes.size(); ++byte) {
    std::string bad = bytes;
    bad[byte] ^= 0x10;
    INFO("byte " << byte);
    CHECK_FALSE(DecodeManifestFile(bad, "m", &f).ok());
  }
  CHECK(Contains(DecodeManifestFile("garbage that is long enough to look", "m", &f).message(),
                 "is not an ftrun manifest file"));
}

TEST_CASE("a manifest file from a newer format is named as such", "[persist][format]") {
  ChunkBank bank;
  std::string bytes = EncodeManifestFile("j", 1, bank.Build(0, 1, {{"t", 10, 1}}));
  bytes[8] = 9;  // format version 9, then reseal
  bytes.resize(bytes.size() - 16);
  ChunkHash sum = HashBytes(bytes.data(), bytes.size());
  bytes.append(reinterpret_cast<const char*>(&sum.lo), 8);
  bytes.append(reinterpret_cast<const char*>(&sum.hi), 8);
  ManifestFile f;
  Status st = DecodeManifestFile(bytes, "m", &f);
  CHECK(st.code() == Code::kFailedPrecondition);
  CHECK(Contains(st.message(), "format version 9; this build reads version 1"));
}

TEST_CASE("node markers round-trip and notice any flipped bit", "[persist][format]") {
  NodeMarker m{"job", 8, 42, 1, {{4, 100, HashBytes("a", 1)}, {5, 200, HashBytes("b", 1)}}};
  std::string bytes = EncodeNodeMarker(m);
  NodeMarker back;
  REQUIRE(DecodeNodeMarker(bytes, "n", &back).ok());
  CHECK(back.job_id == "job");
  CHECK(back.world_size == 8);
  CHECK(back.version == 42);
  CHECK(back.node == 1);
  REQUIRE(back.ranks.size() == 2);
  CHECK(back.ranks[1].rank == 5);
  CHECK(back.ranks[1].manifest_size == 200);
  CHECK(back.ranks[1].manifest_checksum == HashBytes("b", 1));
  for (size_t byte = 0; byte < bytes.size(); ++byte) {
    std::string bad = bytes;
    bad[byte] ^= 0x01;
    CHECK_FALSE(DecodeNodeMarker(bad, "n", &back).ok());
  }
}

}  // namespace ftrun
