// The warm control frames' payload (plugin/protocol/warm_fields.h): what the
// agent writes reads back, and what a hostile or broken process writes is
// refused with the reason.
#include "plugin/protocol/warm_fields.h"

#include "tests/catch.h"

namespace ftrun {
namespace {

TEST_CASE("warm fields: encoded fields decode to the same", "[warm]") {
  WarmFields f{{"generation", "3"}, {"env.MASTER_PORT", "29503"}, {"restore", "none"}, {"reason", "a=b c"}};
  WarmFields back;
  REQUIRE(DecodeWarmFields(EncodeWarmFields(f), &back).ok());
  CHECK(back == f);
  long long g = 0;
  REQUIRE(WarmInt(back, "generation", 0, 10, &g).ok());
  CHECK(g == 3);
  CHECK(DecodeWarmFields("", &back).ok());
  CHECK(back.empty());
}

TEST_CASE("warm fields: a value with a newline or a bad key is never sent", "[warm]") {
  WarmFields back;
  REQUIRE(DecodeWarmFields(EncodeWarmFields({{"ok", "1"}, {"bad key", "2"}, {"multi", "a\nb"}}), &back).ok());
  CHECK(back == WarmFields{{"ok", "1"}});
}

TEST_CASE("warm fields: bad payloads are refused with the reason", "[warm]") {
  WarmFields out;
  auto refused = [&](const std::string& payload, const std::string& why) {
    Status s = DecodeWarmFields(payload, &out);
    INFO(payload);
    CHECK(s.code() == Code::kInvalidArgument);
    CHECK(s.message().find(why) != std::string::npos);
  };
  refused("role=rank", "no newline");
  refused("role\n", "without '='");
  refused("ro le=rank\n", "bad key");
  refused("=x\n", "bad key");
  refused("rank=1\nrank=2\n", "given twice");
  std::string many;
  for (int i = 0; i < 300; ++i) many += "k" + std::to_string(i) + "=v\n";
  refused(many, "more than 256");
}

TEST_CASE("warm fields: integers are checked for presence, form and range", "[warm]") {
  long long v = 0;
  auto bad = [&](const WarmFields& f, const std::string& why) {
    Status s = WarmInt(f, "rank", 0, 7, &v);
    CHECK(s.code() == Code::kInvalidArgument);
    CHECK(s.message().find(why) != std::string::npos);
    CHECK(s.message().find("'rank'") != std::string::npos);
  };
  bad({}, "missing");
  bad({{"rank", ""}}, "integer in [0, 7]");
  bad({{"rank", "3x"}}, "got '3x'");
  bad({{"rank", "8"}}, "got '8'");
  bad({{"rank", "-1"}}, "got '-1'");
  bad({{"rank", "99999999999999999999999"}}, "integer");
  REQUIRE(WarmInt({{"rank", "7"}}, "rank", 0, 7, &v).ok());
  CHECK(v == 7);
}

}  // namespace
}  // namespace ftrun
