// The framing of an agent link after its handshake (session_frame.h): what
// one side seals, the other opens, and nothing else.
#include "plugin/transport/session_frame.h"

#include "tests/catch.h"

using namespace ftrun;

namespace {

// Both ends of one connection, as the handshake leaves them.
struct Link {
  std::string key = SessionKey(std::string(32, 's'), HandshakeTranscript(NewNonce(), NewNonce(), 1, 2));
  SessionFrames connector{key, true};
  SessionFrames acceptor{key, false};
};

}  // namespace

TEST_CASE("session frames: sealed messages open in order, both ways", "[security][transport]") {
  Link l;
  for (int i = 0; i < 3; ++i) {
    WireHeader h = l.connector.SealMessage(7, "ping" + std::to_string(i));
    CHECK(h.seq == static_cast<uint64_t>(i));
    CHECK(l.acceptor.OpenMessage(h, "ping" + std::to_string(i)).ok());
  }
  WireHeader back = l.acceptor.SealMessage(8, "pong");
  CHECK(back.seq == 0);  // counted per direction
  CHECK(l.connector.OpenMessage(back, "pong").ok());
}

TEST_CASE("session frames: a tampered, replayed, reordered or reflected message is refused", "[security][transport]") {
  Link l;
  WireHeader first = l.connector.SealMessage(7, "one");
  WireHeader second = l.connector.SealMessage(7, "two");

  SECTION("tampered payload") {
    Status s = l.acceptor.OpenMessage(first, "onE");
    CHECK(s.code() == Code::kFailedPrecondition);
    CHECK_THAT(s.message(), Catch::Contains("MAC does not match"));
  }
  SECTION("tampered type or sequence number") {
    WireHeader t = first;
    t.type = 9;
    CHECK_FALSE(l.acceptor.OpenMessage(t, "one").ok());
    t = second;
    t.seq = 0;  // claims to be the next one
    CHECK_FALSE(l.acceptor.OpenMessage(t, "two").ok());
  }
  SECTION("reordered, then replayed") {
    Status s = l.acceptor.OpenMessage(second, "two");
    CHECK_THAT(s.message(), Catch::Contains("out of sequence"));
    REQUIRE(l.acceptor.OpenMessage(first, "one").ok());  // a refused one was not counted
    REQUIRE(l.acceptor.OpenMessage(second, "two").ok());
    CHECK_THAT(l.acceptor.OpenMessage(second, "two").message(), Catch::Contains("replayed"));
  }
  SECTION("reflected back to its sender") { CHECK_FALSE(l.connector.OpenMessage(first, "one").ok()); }
  SECTION("another session's key") {
    Link other;
    CHECK_FALSE(other.acceptor.OpenMessage(first, "one").ok());
  }
  SECTION("a handshake type after the handshake") {
    WireHeader h = l.connector.SealMessage(kHello, "x");
    CHECK_THAT(l.acceptor.OpenMessage(h, "x").message(), Catch::Contains("handshake message after"));
  }
}

TEST_CASE("session frames: a bulk header opens only for its session, direction and length", "[security][transport]") {
  Link l;
  BulkHeader h = l.connector.SealBulk(42, 4096);
  CHECK(l.acceptor.OpenBulk(h, 4096));
  CHECK_FALSE(l.acceptor.OpenBulk(h, 4095));
  CHECK_FALSE(l.connector.OpenBulk(h, 4096));  // reflected
  BulkHeader t = h;
  t.tag = 43;
  CHECK_FALSE(l.acceptor.OpenBulk(t, 4096));
  Link other;
  CHECK_FALSE(other.acceptor.OpenBulk(h, 4096));
}

TEST_CASE("keyed MAC: HMAC-SHA256 (RFC 4231), the same on every use of one key set-up", "[security][transport]") {
  auto hex = [](const std::string& s) {
    static const char* d = "0123456789abcdef";
    std::string out;
    for (unsigned char c : s) out += {d[c >> 4], d[c & 15]};
    return out;
  };
  // RFC 4231 test case 2.
  const std::string want = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
  KeyedMac mac("Jefe");
  CHECK(hex(mac.Of({"what do ya want for nothing?"})) == want);
  CHECK(hex(mac.Of({"what do ya ", "want for ", "nothing?"})) == want);  // pieces, and again on the same set-up
  CHECK(hex(mac.Of({"what do ya want for nothing!"})) != want);
  CHECK(hex(mac.Of({"what do ya want for nothing?"})) == want);  // a different MAC in between changes nothing
  KeyedMac other("Jeff");
  CHECK(hex(other.Of({"what do ya want for nothing?"})) != want);
}
