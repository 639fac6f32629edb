// PeerAddresses with a recording transport: members are reached by id at
// the address the membership gave; unknown ones are not; a reset closes
// and connects again.
#include "launcher/agent/peer_addresses.h"

#include "tests/catch.h"
#include "tests/unit/recording_transport.h"

namespace ftrun {
namespace {

MembershipMsg Members(std::vector<std::pair<uint32_t, std::string>> list) {
  MembershipMsg m;
  for (auto& [agent, address] : list) {
    MemberInfo x;
    x.agent = agent;
    x.address = address;
    m.members.push_back(x);
  }
  return m;
}

TEST_CASE("peer addresses: members by id, at the membership's address; a newer membership replaces them", "[peers]") {
  RecordingTransport t;
  PeerAddresses peers(&t);
  peers.Connect(1);  // nobody known yet
  CHECK(t.connects == 0);
  peers.Set(Members({{1, "10.0.0.1:1"}, {2, "10.0.0.2:1"}}));
  peers.Connect(std::vector<PeerId>{2, 1, 7});
  CHECK(t.connected == std::vector<std::pair<PeerId, std::string>>{{2, "10.0.0.2:1"}, {1, "10.0.0.1:1"}});
  peers.Set(Members({{2, "10.0.0.9:1"}}));  // agent 2 moved; agent 1 left
  peers.Connect(std::vector<PeerId>{1, 2});
  CHECK(t.connected.back() == std::pair<PeerId, std::string>{2, "10.0.0.9:1"});
  CHECK(t.connects == 3);
}

TEST_CASE("peer addresses: a reset closes the connection and makes it again", "[peers]") {
  RecordingTransport t;
  PeerAddresses peers(&t);
  peers.Set(Members({{3, "h:3"}}));
  peers.Reset(3);
  CHECK(t.disconnected == std::vector<PeerId>{3});
  CHECK(t.connected == std::vector<std::pair<PeerId, std::string>>{{3, "h:3"}});
  peers.Reset(4);  // unknown: closed, not connected
  CHECK(t.disconnected == std::vector<PeerId>{3, 4});
  CHECK(t.connects == 1);
}

}  // namespace
}  // namespace ftrun
