#include "plugin/store/manifest.h"

#include "tests/catch.h"

using namespace ftrun;

namespace {
Manifest Sample() {
  Manifest m;
  m.rank = 3;
  m.version = 42;
  m.user_bytes = std::string("rng\0state", 9);
  TensorManifest t;
  t.info = {"layer.0.weight", DType::kFloat32, {2, 3}, 24, Device::kHost};
  t.chunks = {{HashBytes("abcdefghijklmnop", 16), 16, 4096}, {HashBytes("12345678", 8), 8, kNoOffset}};
  m.tensors.push_back(t);
  TensorManifest e;
  e.info = {"empty", DType::kBFloat16, {0}, 0, Device::kHost};
  m.tensors.push_back(e);
  return m;
}
}  // namespace

TEST_CASE("manifests round-trip through their encoding", "[manifest]") {
  Manifest m = Sample();
  ByteWriter w;
  EncodeManifest(m, &w);
  ByteReader r(w.data());
  Manifest back;
  REQUIRE(DecodeManifest(&r, "test", &back).ok());
  CHECK(back.rank == 3);
  CHECK(back.version == 42);
  CHECK(back.user_bytes == m.user_bytes);
  REQUIRE(back.tensors.size() == 2);
  CHECK(back.tensors[0].info.shape == std::vector<int64_t>{2, 3});
  CHECK(back.tensors[0].chunks[1].offset == kNoOffset);
  CHECK(back.tensors[0].chunks[0].hash == m.tensors[0].chunks[0].hash);
  CHECK(back.tensors[1].info.dtype == DType::kBFloat16);
  CHECK(back.state_bytes() == 24);
}

TEST_CASE("a truncated manifest is refused, never half-read", "[manifest]") {
  ByteWriter w;
  EncodeManifest(Sample(), &w);
  for (size_t cut : {size_t{0}, size_t{5}, w.data().size() / 2, w.data().size() - 1}) {
    ByteReader r(std::string_view(w.data()).substr(0, cut));
    Manifest back;
    Status s = DecodeManifest(&r, "test", &back);
    CHECK_FALSE(s.ok());
  }
}

TEST_CASE("manifest sizes must agree with shape and dtype", "[manifest]") {
  Manifest m = Sample();
  m.tensors[0].info.shape = {2, 4};  // 32 bytes, but chunks hold 24
  ByteWriter w;
  EncodeManifest(m, &w);
  ByteReader r(w.data());
  Manifest back;
  Status s = DecodeManifest(&r, "test", &back);
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("layer.0.weight") && Catch::Contains("[2, 4]"));
}

TEST_CASE("a changed layout names the first difference", "[manifest]") {
  Manifest a = Sample(), b = Sample();
  b.version = 43;
  b.tensors[0].info.shape = {3, 2};
  Status s = CheckSameLayout(a, b);
  CHECK(s.code() == Code::kFailedPrecondition);
  CHECK_THAT(s.message(), Catch::Contains("layer.0.weight") && Catch::Contains("[3, 2]") && Catch::Contains("[2, 3]"));
  Manifest c = Sample();
  c.tensors.pop_back();
  s = CheckSameLayout(a, c);
  CHECK_THAT(s.message(), Catch::Contains("1 tensors, 2") && Catch::Contains("empty"));
  Manifest d = Sample();
  d.tensors[1].info.name = "other";
  CHECK_THAT(CheckSameLayout(a, d).message(), Catch::Contains("'other'") && Catch::Contains("'empty'"));
  CHECK(CheckSameLayout(a, Sample()).ok());
}

TEST_CASE("random and mutated bytes never crash the manifest decoder", "[manifest]") {
  ByteWriter w;
  EncodeManifest(Sample(), &w);
  const std::string good = w.data();
  uint64_t x = 0x9E3779B97F4A7C15ull;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = good;
    if (i % 2 == 0) {
      for (int k = 0; k < 1 + static_cast<int>(next() % 4); ++k)
        bytes[next() % bytes.size()] = static_cast<char>(next());
    } else {
      bytes.resize(next() % 256);
      for (auto& c : bytes) c = static_cast<char>(next());
    }
    ByteReader r(bytes);
    Manifest m;
    if (DecodeManifest(&r, "fuzz", &m).ok()) {
      ++accepted;  // then it must be self-consistent
      for (const auto& t : m.tensors) {
        uint64_t sum = 0;
        for (const auto& c : t.chunks) sum += c.length;
        REQUIRE(sum == t.info.nbytes);
      }
    }
  }
  CHECK(accepted < 20000);
}
