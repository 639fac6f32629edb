// The agent's link to a remote coordinator, driven by hand: a transport that
// records what the link asks of it, and a manual clock.
#include "launcher/agent/coordinator_link.h"

#include "tests/catch.h"
#include "tests/unit/recording_transport.h"

namespace ftrun {
namespace {

using std::chrono::milliseconds;

struct Fixture {
  ManualClock clock;
  RecordingTransport t;
  CoordinatorLink link;
  int ups = 0, heartbeats = 0, intervals = 0, give_ups = 0;
  std::vector<std::string> lost;

  Fixture() : link(&t, Options(), clock) {
    link.on_up = [this] { ups++; };
    link.on_heartbeat = [this] { heartbeats++; };
    link.on_interval = [this] { intervals++; };
    link.on_lost = [this](const std::string& why) { lost.push_back(why); };
    link.on_give_up = [this] { give_ups++; };
  }
  static CoordinatorLink::Options Options() {
    CoordinatorLink::Options o;
    o.peer = 7;
    o.address = "10.0.0.1:2000";
    o.heartbeat_interval = milliseconds(100);
    o.heartbeat_misses = 5;
    o.lost_node_timeout = milliseconds(2000);
    return o;
  }
  // Time passes in 10 ms ticks; with `heard`, the coordinator speaks on each.
  void Pass(int ms, bool heard = false) {
    for (int t = 0; t < ms; t += 10) {
      clock.Advance(milliseconds(10));
      if (heard) link.Heard();
      link.Tick(clock.Now());
    }
  }
};

TEST_CASE("coordinator link: connects, heartbeats while up, and loses a silent coordinator", "[coordinator_link]") {
  Fixture f;
  f.link.Connect();
  CHECK(f.t.connects == 1);
  f.Pass(350);  // down: a new attempt every heartbeat interval
  CHECK(f.t.connects == 4);
  CHECK(!f.link.up());
  CHECK(f.heartbeats == 0);
  f.link.PeerUp();
  CHECK(f.ups == 1);
  CHECK(f.link.up());
  f.Pass(1000, /*heard=*/true);  // it answers: up for good, one heartbeat per interval
  CHECK(f.lost.empty());
  CHECK(f.heartbeats == 10);
  CHECK(f.t.connects == 4);  // no attempt while up
  f.Pass(490);               // silent for less than 5 x 100 ms
  CHECK(f.lost.empty());
  f.Pass(20);
  REQUIRE(f.lost.size() == 1);
  CHECK(f.lost[0] == "no message for 500 ms (cluster.heartbeat_misses x cluster.heartbeat_interval)");
  CHECK(!f.link.up());
  CHECK(f.t.disconnects == 1);  // the old connection goes: a reconnect starts afresh
  f.Pass(200);
  CHECK(f.t.connects >= 5);
  CHECK(f.give_ups == 0);
}

TEST_CASE("coordinator link: a transport error loses it once; down for lost_node_timeout it gives up",
          "[coordinator_link]") {
  Fixture f;
  f.link.Connect();
  f.link.PeerDown("refused");  // never up: nothing lost
  CHECK(f.lost.empty());
  f.link.PeerUp();
  f.Pass(100, true);
  f.link.PeerDown("Endpoint timeout");
  REQUIRE(f.lost == std::vector<std::string>{"Endpoint timeout"});
  f.link.PeerDown("again");  // already down
  CHECK(f.lost.size() == 1);
  f.Pass(1990);  // the loss clock started at the error
  CHECK(f.give_ups == 0);
  CHECK(!f.link.gave_up());
  f.Pass(20);
  CHECK(f.give_ups >= 1);
  CHECK(f.link.gave_up());
  const int connects = f.t.connects;
  const int give_ups = f.give_ups;
  f.Pass(300);  // given up: no more attempts; the agent hears it on every tick until it ends
  CHECK(f.t.connects == connects);
  CHECK(f.give_ups == give_ups + 30);
}

TEST_CASE("coordinator link: coming back before lost_node_timeout starts the clock afresh", "[coordinator_link]") {
  Fixture f;
  f.link.Connect();
  f.Pass(1500);
  f.link.PeerUp();
  f.Pass(100, true);
  f.link.PeerDown("reset");
  f.Pass(1500);  // 1.5 s down since the error, 3.1 s since the first attempt
  CHECK(f.give_ups == 0);
  CHECK(f.ups == 1);
}

TEST_CASE("coordinator link: heartbeats fill only the silences; the interval's upkeep goes on", "[coordinator_link]") {
  Fixture f;
  f.link.Connect();
  f.link.PeerUp();
  f.Pass(10, true);
  const int beats = f.heartbeats, upkeep = f.intervals;
  // The agent reports every 50 ms: no heartbeat is needed.
  for (int i = 0; i < 20; ++i) {
    f.link.Sent(f.clock.Now());
    f.Pass(50, true);
  }
  CHECK(f.heartbeats == beats);
  CHECK(f.intervals == upkeep + 10);
  // Then silence: a heartbeat an interval after the last report, then every interval.
  f.link.Sent(f.clock.Now());
  f.Pass(90, true);
  CHECK(f.heartbeats == beats);
  f.Pass(10, true);
  CHECK(f.heartbeats == beats + 1);
  f.Pass(300, true);
  CHECK(f.heartbeats == beats + 4);
}

TEST_CASE("coordinator link: a newer leader's address drops the old link and connects there", "[coordinator_link]") {
  Fixture f;
  f.link.Connect();
  f.link.PeerUp();
  f.Pass(200, /*heard=*/true);
  f.link.Retarget("10.0.0.1:2000", "the same leader");  // nothing changes
  CHECK(f.lost.empty());
  CHECK(f.link.up());
  const size_t disconnects = f.t.disconnected.size();
  f.link.Retarget("10.0.0.2:3000", "term 9");
  REQUIRE(f.lost.size() == 1);  // a loss: the agent fences its ranks as on any coordinator loss
  CHECK(f.lost[0].find("10.0.0.2:3000") != std::string::npos);
  CHECK(!f.link.up());
  CHECK(f.t.disconnected.size() == disconnects + 1);
  CHECK(f.link.address() == "10.0.0.2:3000");
  f.Pass(10);  // the next tick connects to the new one, not the old
  REQUIRE(!f.t.connected.empty());
  CHECK(f.t.connected.back() == std::make_pair(PeerId{7}, std::string("10.0.0.2:3000")));
  f.link.PeerUp();
  CHECK(f.ups == 2);
  // Down already: a move is no second loss.
  f.link.PeerDown("gone");
  f.link.Retarget("10.0.0.3:4000", "term 12");
  CHECK(f.lost.size() == 2);
  f.Pass(10);
  CHECK(f.t.connected.back().second == "10.0.0.3:4000");
}

}  // namespace
}  // namespace ftrun
