// The etcd pieces that need no etcd: base64, the leader record as a hostile
// writer may leave it, and the term on coordinator messages. (The calls
// themselves run against a real etcd cluster: test_etcd_failover.py.)
#include <random>

#include "plugin/etcd/etcd_client.h"
#include "plugin/etcd/leader_record.h"
#include "plugin/protocol/cluster_messages.h"
#include "tests/catch.h"

using namespace ftrun;

TEST_CASE("base64 round-trips every length and rejects what is not base64", "[etcd]") {
  std::mt19937 rng(7);
  for (size_t n = 0; n < 70; ++n) {
    std::string bytes(n, '\0');
    for (char& b : bytes) b = static_cast<char>(rng());
    std::string back;
    REQUIRE(Base64Decode(Base64Encode(bytes), &back));
    CHECK(back == bytes);
  }
  CHECK(Base64Encode("/ftrun/j/leader") == "L2Z0cnVuL2ovbGVhZGVy");  // as etcd's gateway answered it
  std::string out = "untouched";
  for (const char* bad : {"abc", "a b=", "!!!!", "abcde"}) {
    CHECK_FALSE(Base64Decode(bad, &out));
  }
  CHECK(out == "untouched");
}

TEST_CASE("a leader record is checked field by field; the error names the key", "[etcd]") {
  EtcdValue v;
  v.value = R"({"address":"10.0.0.1:4000","pid":42,"host":"login1"})";
  v.create_revision = 17;
  LeaderRecord r;
  REQUIRE(DecodeLeader("/ftrun/j/leader", v, &r).ok());
  CHECK(r.address == "10.0.0.1:4000");
  CHECK(r.pid == 42);
  CHECK(r.host == "login1");
  CHECK(r.term == 17);
  LeaderRecord back;
  v.value = EncodeLeader(r);
  REQUIRE(DecodeLeader("k", v, &back).ok());
  CHECK(back.address == r.address);
  const std::pair<const char*, const char*> bad[] = {
      {"not json", "expected a JSON object"},
      {"[1,2]", "expected a JSON object"},
      {R"({"pid":1})", "field 'address'"},
      {R"({"address":7,"pid":1})", "field 'address'"},
      {R"({"address":"a"})", "field 'pid'"},
      {R"({"address":"a","pid":"1"})", "field 'pid'"},
      {R"({"address":"a","pid":1,"host":[]})", "field 'host'"},
  };
  for (const auto& [text, want] : bad) {
    v.value = text;
    Status s = DecodeLeader("/ftrun/j/leader", v, &r);
    INFO(text << " -> " << s.ToString());
    CHECK(s.code() == Code::kCorruption);
    CHECK(s.message().rfind("etcd key /ftrun/j/leader: ", 0) == 0);
    CHECK(s.message().find(want) != std::string::npos);
  }
  v.value = std::string(R"({"address":")") + std::string(300, 'a') + R"(","pid":1})";
  CHECK_FALSE(DecodeLeader("k", v, &r).ok());
  v.value = R"({"address":"a","pid":1})";
  v.create_revision = 0;
  CHECK_FALSE(DecodeLeader("k", v, &r).ok());
}

TEST_CASE("keys of a job: PREFIX/JOB/leader, state, end", "[etcd]") {
  CoordinatorConfig c;
  c.etcd_prefix = "/p";
  JobKeys k = KeysOf(c, "job-1");
  CHECK(k.leader == "/p/job-1/leader");
  CHECK(k.state == "/p/job-1/state");
  CHECK(k.end == "/p/job-1/end");
  c.etcd_lease_ttl = std::chrono::milliseconds(2000);
  CHECK(EtcdOptionsOf(c).timeout == std::chrono::milliseconds(400));  // calls fit in the lease
}

TEST_CASE("a coordinator message carries its term; a short one is refused", "[etcd]") {
  for (int64_t term : {int64_t{1}, int64_t{255}, int64_t{1} << 40}) {
    std::string payload = WithTerm(term, "order");
    int64_t got = 0;
    REQUIRE(TakeTerm(&payload, &got));
    CHECK(got == term);
    CHECK(payload == "order");
  }
  std::string short_one = "1234567";
  int64_t got = -1;
  CHECK_FALSE(TakeTerm(&short_one, &got));
  CHECK(short_one == "1234567");
}

TEST_CASE("an etcd client with no endpoint, or one that is not there, fails naming it", "[etcd]") {
  EtcdOptions o;
  o.timeout = std::chrono::milliseconds(300);
  std::optional<EtcdValue> v;
  CHECK(EtcdClient(o).Get("k", &v).code() == Code::kInvalidArgument);
  o.endpoints = {"http://127.0.0.1:1"};  // nothing listens on port 1
  Status s = EtcdClient(o).Get("k", &v);
  CHECK(s.code() == Code::kUnavailable);
  CHECK(s.message().find("http://127.0.0.1:1/v3/kv/range") != std::string::npos);
}
