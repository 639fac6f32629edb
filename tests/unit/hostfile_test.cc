#include "launcher/runner/hostfile.h"

#include <ftw.h>
#include <stdlib.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "launcher/agent/options.h"
#include "tests/catch.h"
#include "tests/unit/temp_dir.h"

using namespace ftrun;

namespace {

std::vector<HostEntry> Hosts(const std::string& text) {
  std::vector<HostEntry> h;
  Status s = ParseHostfileText(text, "hosts.txt", &h);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return h;
}

// The error message of parsing `text` as "hosts.txt"; requires InvalidArgument.
std::string ParseError(const std::string& text) {
  std::vector<HostEntry> h{HostEntry{"untouched", 1, "", 0}};
  Status s = ParseHostfileText(text, "hosts.txt", &h);
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK(h.size() == 1);  // *out untouched on error
  CHECK(h[0].host == "untouched");
  return s.message();
}

// hosts a (4 slots, rack r1), b (2 slots), c (8 slots, rack r2).
const char kThreeHosts[] = "a slots=4 rack=r1\nb slots=2\nc slots=8 rack=r2\n";

std::vector<NodeSlots> Select(const std::string& include, const std::string& exclude, int num_nodes = -1,
                              int num_gpus = -1, const std::string& text = kThreeHosts) {
  std::vector<NodeSlots> out;
  Status s = SelectNodes(Hosts(text), include, exclude, num_nodes, num_gpus, &out);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return out;
}

std::string SelectError(const std::string& include, const std::string& exclude, int num_nodes = -1, int num_gpus = -1,
                        const std::string& text = kThreeHosts) {
  std::vector<NodeSlots> out{NodeSlots{"untouched", {0}, ""}};
  Status s = SelectNodes(Hosts(text), include, exclude, num_nodes, num_gpus, &out);
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK(out.size() == 1);
  CHECK(out[0].host == "untouched");
  return s.message();
}

std::vector<int> Range(int n) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i) v.push_back(i);
  return v;
}

}  // namespace

TEST_CASE("hostfile: DeepSpeed's format with comments, blank lines and racks", "[runner][hostfile]") {
  auto h = Hosts(
      "# cluster A\n"
      "\n"
      "worker-0 slots=8\n"
      "   \t\n"
      "worker-1\tslots=4   # half a node\n"
      "  worker-2 slots=2 rack=r7\r\n"
      "10.0.0.4 slots=16 rack=r8 # trailing comment after the rack\n"
      "fe80::1 slots=1");  // no final newline
  REQUIRE(h.size() == 5);
  CHECK(h[0].host == "worker-0");
  CHECK(h[0].slots == 8);
  CHECK(h[0].rack.empty());
  CHECK(h[0].line == 3);
  CHECK(h[1].host == "worker-1");
  CHECK(h[1].slots == 4);
  CHECK(h[1].line == 5);
  CHECK(h[2].host == "worker-2");
  CHECK(h[2].rack == "r7");
  CHECK(h[2].line == 6);
  CHECK(h[3].host == "10.0.0.4");
  CHECK(h[3].slots == 16);
  CHECK(h[3].rack == "r8");
  CHECK(h[4].host == "fe80::1");
  CHECK(h[4].line == 8);
  CHECK(Hosts("n slots=007\n")[0].slots == 7);
  CHECK(Hosts("n slots=65536\n")[0].slots == kMaxSlotsPerHost);
}

TEST_CASE("hostfile: every malformed line names path:line and what was expected", "[runner][hostfile]") {
  CHECK(ParseError("a slots=1\nb slots=1\nfoo bar\n") ==
        "hosts.txt:3: expected 'HOST slots=N [rack=NAME]', got 'foo bar'");
  CHECK(ParseError("node1\n") == "hosts.txt:1: expected 'HOST slots=N [rack=NAME]', got 'node1'");
  CHECK(ParseError("node1 slots=\n") == "hosts.txt:1: expected 'HOST slots=N [rack=NAME]', got 'node1 slots='");
  CHECK(ParseError("node1 slots=abc\n") == "hosts.txt:1: expected 'HOST slots=N [rack=NAME]', got 'node1 slots=abc'");
  CHECK(ParseError("node1 slots=4x\n") == "hosts.txt:1: expected 'HOST slots=N [rack=NAME]', got 'node1 slots=4x'");
  CHECK(ParseError("node1 slots=-1\n") == "hosts.txt:1: expected 'HOST slots=N [rack=NAME]', got 'node1 slots=-1'");
  CHECK(ParseError("node1 slots = 4\n") == "hosts.txt:1: expected 'HOST slots=N [rack=NAME]', got 'node1 slots = 4'");
  CHECK(ParseError("node1 gpus=4\n") == "hosts.txt:1: expected 'HOST slots=N [rack=NAME]', got 'node1 gpus=4'");
  CHECK(ParseError("slots=4 node1\n") == "hosts.txt:1: expected 'HOST slots=N [rack=NAME]', got 'slots=4 node1'");
  CHECK(ParseError("\n\nnode1 slots=4 extra\n") ==
        "hosts.txt:3: expected 'HOST slots=N [rack=NAME]', got 'node1 slots=4 extra'");
  CHECK(ParseError("node1 slots=4 rack=\n") ==
        "hosts.txt:1: expected 'HOST slots=N [rack=NAME]', got 'node1 slots=4 rack='");
  CHECK(ParseError("node1 slots=4 rack=r1 rack=r2\n") ==
        "hosts.txt:1: expected 'HOST slots=N [rack=NAME]', got 'node1 slots=4 rack=r1 rack=r2'");
  CHECK(ParseError("node1 rack=r1 slots=4\n") ==
        "hosts.txt:1: expected 'HOST slots=N [rack=NAME]', got 'node1 rack=r1 slots=4'");
}

TEST_CASE("hostfile: slot counts out of range are refused", "[runner][hostfile]") {
  CHECK(ParseError("a slots=2\nnode1 slots=0\n") ==
        "hosts.txt:2: host 'node1': expected slots=N with N from 1 to 65536, got 'slots=0'");
  CHECK(ParseError("node1 slots=65537\n") ==
        "hosts.txt:1: host 'node1': expected slots=N with N from 1 to 65536, got 'slots=65537'");
  CHECK(ParseError("node1 slots=99999999999999999999999\n") ==
        "hosts.txt:1: host 'node1': expected slots=N with N from 1 to 65536, got 'slots=99999999999999999999999'");
}

TEST_CASE("hostfile: a duplicate host and an empty file are errors", "[runner][hostfile]") {
  CHECK(ParseError("a slots=1\nb slots=1\n# c\na slots=2\n") ==
        "hosts.txt:4: host 'a' is listed twice (first on line 1); expected each host once");
  CHECK(ParseError("") == "hosts.txt: no hosts; expected lines 'HOST slots=N [rack=NAME]'");
  CHECK(ParseError("# only a comment\n\n   \n") == "hosts.txt: no hosts; expected lines 'HOST slots=N [rack=NAME]'");
}

TEST_CASE("hostfile: files are read, and unreadable ones give IoError naming the path", "[runner][hostfile]") {
  TempDir dir;
  std::vector<HostEntry> h;
  std::string path = dir.Write("hostfile", "w0 slots=2\nw1 slots=2\n");
  REQUIRE(ParseHostfile(path, &h).ok());
  REQUIRE(h.size() == 2);
  CHECK(h[1].host == "w1");

  std::string bad = dir.Write("bad", "w0 slots=2\nw1 slots=two\n");
  Status s = ParseHostfile(bad, &h);
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK(s.message() == bad + ":2: expected 'HOST slots=N [rack=NAME]', got 'w1 slots=two'");

  s = ParseHostfile(dir.path() + "/missing", &h);
  CHECK(s.code() == Code::kIoError);
  CHECK(s.message() == "cannot open hostfile '" + dir.path() + "/missing': No such file or directory");

  s = ParseHostfile(dir.path(), &h);  // a directory opens but cannot be read
  CHECK(s.code() == Code::kIoError);
  CHECK_THAT(s.message(), Catch::Contains("hostfile '" + dir.path() + "'"));
}

TEST_CASE("select: no filter keeps every host and slot in hostfile order", "[runner][select]") {
  auto n = Select("", "");
  REQUIRE(n.size() == 3);
  CHECK(n[0].host == "a");
  CHECK(n[0].slots == Range(4));
  CHECK(n[0].rack == "r1");
  CHECK(n[1].host == "b");
  CHECK(n[1].slots == Range(2));
  CHECK(n[1].rack.empty());
  CHECK(n[2].host == "c");
  CHECK(n[2].slots == Range(8));
  CHECK(n[2].rack == "r2");
  CHECK(TotalSlots(n) == 14);
}

TEST_CASE("select: --include keeps the named hosts and slots, in hostfile order", "[runner][select]") {
  auto n = Select("c@a:3,1", "");
  REQUIRE(n.size() == 2);
  CHECK(n[0].host == "a");
  CHECK(n[0].slots == std::vector<int>{1, 3});
  CHECK(n[0].rack == "r1");
  CHECK(n[1].host == "c");
  CHECK(n[1].slots == Range(8));

  n = Select("b", "");
  REQUIRE(n.size() == 1);
  CHECK(n[0].host == "b");
  CHECK(n[0].slots == Range(2));

  // A host named twice gets the union; repeated slots count once.
  n = Select("a:0@a:2,2", "");
  REQUIRE(n.size() == 1);
  CHECK(n[0].slots == std::vector<int>{0, 2});
  n = Select("a:1@a", "");
  CHECK(n[0].slots == Range(4));
}

TEST_CASE("select: --exclude drops hosts or slots", "[runner][select]") {
  auto n = Select("", "b@c:0,7");
  REQUIRE(n.size() == 2);
  CHECK(n[0].host == "a");
  CHECK(n[0].slots == Range(4));
  CHECK(n[1].host == "c");
  CHECK(n[1].slots == std::vector<int>{1, 2, 3, 4, 5, 6});

  // A host left without slots is dropped; excluding a slot twice is harmless.
  n = Select("", "b:0,1@a:0@a:0");
  REQUIRE(n.size() == 2);
  CHECK(n[0].host == "a");
  CHECK(n[0].slots == std::vector<int>{1, 2, 3});
  CHECK(n[1].host == "c");

  CHECK(SelectError("", "a@b@c") == "--exclude 'a@b@c' leaves no slots; expected at least one to remain");
  CHECK(SelectError("", "b", -1, -1, "b slots=2\n") ==
        "--exclude 'b' leaves no slots; expected at least one to remain");
}

TEST_CASE("select: --num_nodes and --num_gpus keep the first hosts and slots", "[runner][select]") {
  auto n = Select("", "", 2);
  REQUIRE(n.size() == 2);
  CHECK(n[0].host == "a");
  CHECK(n[1].host == "b");
  CHECK(n[1].slots == Range(2));

  n = Select("", "", -1, 2);
  REQUIRE(n.size() == 3);
  for (const auto& node : n) CHECK(node.slots == Range(2));

  n = Select("", "", 1, 3);
  REQUIRE(n.size() == 1);
  CHECK(n[0].slots == Range(3));
  CHECK(Select("", "", 0, 0).size() == 3);  // <= 0 means all

  CHECK(SelectError("", "", 4) == "--num_nodes 4 but only 3 hosts are available (a, b, c)");
  CHECK(SelectError("", "", -1, 3) == "--num_gpus 3 but host 'b' has only 2 slots");
  CHECK(Select("", "", 1, 3)[0].host == "a");  // b is not selected, so its 2 slots do not matter
}

TEST_CASE("select: conflicting flags name both", "[runner][select]") {
  CHECK(SelectError("a", "b") == "--include and --exclude are mutually exclusive; give one or the other");
  CHECK(SelectError("a", "", 1) ==
        "--include cannot be combined with --num_nodes; pick hosts and slots with one or the other");
  CHECK(SelectError("a", "", -1, 2) ==
        "--include cannot be combined with --num_gpus; pick hosts and slots with one or the other");
  CHECK(SelectError("", "a", 2) ==
        "--exclude cannot be combined with --num_nodes; pick hosts and slots with one or the other");
  CHECK(SelectError("", "a", -1, 1) ==
        "--exclude cannot be combined with --num_gpus; pick hosts and slots with one or the other");
}

TEST_CASE("select: unknown hosts, bad slots and malformed specs are refused", "[runner][select]") {
  CHECK(SelectError("a@zed", "") == "--include 'a@zed': unknown host 'zed'; the hostfile lists a, b, c");
  CHECK(SelectError("", "zed:1") == "--exclude 'zed:1': unknown host 'zed'; the hostfile lists a, b, c");
  CHECK(SelectError("a:4", "") == "--include 'a:4': slot 4 is out of range for host 'a', which has slots 0-3");
  CHECK(SelectError("", "b:0,9") == "--exclude 'b:0,9': slot 9 is out of range for host 'b', which has slots 0-1");
  CHECK(SelectError("a:99999999999", "") ==
        "--include 'a:99999999999': slot 99999999999 is out of range for host 'a', which has slots 0-3");
  const std::string fmt = "NODE_SPEC[@NODE_SPEC...] with NODE_SPEC=NAME[:SLOT[,SLOT...]]";
  CHECK(SelectError("a:x", "") == "--include 'a:x': expected a slot number in 'a:x', got 'x' (" + fmt + ")");
  CHECK(SelectError("a:", "") == "--include 'a:': expected a slot number in 'a:', got '' (" + fmt + ")");
  CHECK(SelectError("a:1,", "") == "--include 'a:1,': expected a slot number in 'a:1,', got '' (" + fmt + ")");
  CHECK(SelectError("a:-1", "") == "--include 'a:-1': expected a slot number in 'a:-1', got '-1' (" + fmt + ")");
  CHECK(SelectError("a@@b", "") == "--include 'a@@b': empty NODE_SPEC; expected " + fmt);
  CHECK(SelectError("", "a@") == "--exclude 'a@': empty NODE_SPEC; expected " + fmt);
  CHECK(SelectError(":1", "") == "--include ':1': NODE_SPEC ':1' has no host name; expected " + fmt);

  std::string many;
  for (int i = 0; i < 20; ++i) many += "h" + std::to_string(i) + " slots=1\n";
  CHECK_THAT(SelectError("x", "", -1, -1, many),
             Catch::EndsWith("unknown host 'x'; the hostfile lists h0, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11, "
                             "h12, h13, h14, h15, ... (4 more)"));

  std::vector<NodeSlots> out;
  Status s = SelectNodes({}, "", "", -1, -1, &out);
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK(s.message() == "no hosts to select from; expected at least one hostfile entry");
}

TEST_CASE("select: host names with ':' (IPv6) still take slot lists", "[runner][select]") {
  const std::string text = "fe80::1 slots=4\nfe80::2 slots=2\n";
  auto n = Select("fe80::1", "", -1, -1, text);
  REQUIRE(n.size() == 1);
  CHECK(n[0].host == "fe80::1");
  CHECK(n[0].slots == Range(4));
  n = Select("fe80::2:1@fe80::1:0,3", "", -1, -1, text);
  REQUIRE(n.size() == 2);
  CHECK(n[0].slots == std::vector<int>{0, 3});
  CHECK(n[1].host == "fe80::2");
  CHECK(n[1].slots == std::vector<int>{1});
}

TEST_CASE("world_info: byte-identical to DeepSpeed's and round-trips with DecodeWorldInfo", "[runner][world_info]") {
  // DeepSpeed: base64.urlsafe_b64encode(json.dumps({"worker-1": [0, 1], "worker-0": [2, 3, 5]}))
  std::vector<NodeSlots> nodes{{"worker-1", {0, 1}, ""}, {"worker-0", {2, 3, 5}, "r1"}};
  CHECK(EncodeWorldInfo(nodes) == "eyJ3b3JrZXItMSI6IFswLCAxXSwgIndvcmtlci0wIjogWzIsIDMsIDVdfQ==");
  CHECK(EncodeWorldInfo({{"a", {0}, ""}}) == "eyJhIjogWzBdfQ==");  // {"a": [0]}
  CHECK(EncodeWorldInfo({}) == "e30=");                            // {}

  // Every padding length, a '-'/'_' producing alphabet, and names JSON must escape.
  std::vector<std::vector<NodeSlots>> cases = {
      {{"localhost", {0}, ""}},
      {{"n1", {0, 1, 2, 3, 4, 5, 6, 7}, ""}, {"n2", {0, 1, 2, 3, 4, 5, 6, 7}, ""}},
      {{"ab", {1}, ""}, {"abc", {2}, ""}, {"abcd", {3}, ""}},
      {{"q\"uote\\back", {9}, ""}, {"tab\there", {0}, ""}, {"~~~?>?>~~", {1}, ""}},
      {{"10.0.0.1", {0, 2, 4, 6}, ""}, {"fe80::1", {1, 3}, ""}},
  };
  for (const auto& c : cases) {
    std::string b64 = EncodeWorldInfo(c);
    INFO(b64);
    CHECK(b64.find_first_of("+/") == std::string::npos);
    CHECK(b64.size() % 4 == 0);
    std::vector<std::pair<std::string, std::vector<int>>> back;
    Status s = DecodeWorldInfo(b64, &back);
    INFO(s.ToString());
    REQUIRE(s.ok());
    REQUIRE(back.size() == c.size());
    for (size_t i = 0; i < c.size(); ++i) {
      CHECK(back[i].first == c[i].host);
      CHECK(back[i].second == c[i].slots);
    }
  }
}

TEST_CASE("world_info: a hostfile selection encodes in hostfile order", "[runner][world_info]") {
  auto n = Select("c:1@a:0,2", "");
  std::vector<std::pair<std::string, std::vector<int>>> back;
  REQUIRE(DecodeWorldInfo(EncodeWorldInfo(n), &back).ok());
  REQUIRE(back.size() == 2);
  CHECK(back[0] == std::make_pair(std::string("a"), std::vector<int>{0, 2}));
  CHECK(back[1] == std::make_pair(std::string("c"), std::vector<int>{1}));
}
