// A rank's store mapping is kept for the next client of the same process
// when the agent hands it the same segment (plugin/client/attached_segment.h).
#include "plugin/client/attached_segment.h"

#include <unistd.h>

#include <memory>

#include "plugin/store/arena.h"
#include "tests/catch.h"

using namespace ftrun;

TEST_CASE("the same segment attached again is the same mapping; another segment is mapped anew", "[client][store]") {
  Arena a, b;
  REQUIRE(Arena::Create("job-a", 0, 1 << 20, 1 << 16, &a).ok());
  REQUIRE(Arena::Create("job-a", 0, 1 << 20, 1 << 16, &b).ok());
  std::shared_ptr<const Arena> first, again, other;
  REQUIRE(AttachSegment(UniqueFd(::dup(a.fd())), "job-a", &first).ok());
  first->base()[first->data_offset()] = 7;  // what this process wrote is what the next client sees
  REQUIRE(AttachSegment(UniqueFd(::dup(a.fd())), "job-a", &again).ok());
  CHECK(again.get() == first.get());
  CHECK(a.base()[a.data_offset()] == 7);  // (and it is the agent's segment)

  const Arena* kept = first.get();
  first.reset();
  again.reset();  // no client holds it: still kept for the next one
  REQUIRE(AttachSegment(UniqueFd(::dup(a.fd())), "job-a", &again).ok());
  CHECK(again.get() == kept);

  REQUIRE(AttachSegment(UniqueFd(::dup(b.fd())), "job-a", &other).ok());
  CHECK(other.get() != again.get());
  CHECK(again->base()[again->data_offset()] == 7);  // a client still holding the old one keeps it mapped
}

TEST_CASE("a kept segment is not handed to a client of another job; a bad segment is refused as before",
          "[client][store]") {
  Arena a;
  REQUIRE(Arena::Create("job-a", 0, 1 << 20, 1 << 16, &a).ok());
  std::shared_ptr<const Arena> mine, theirs;
  REQUIRE(AttachSegment(UniqueFd(::dup(a.fd())), "job-a", &mine).ok());
  Status s = AttachSegment(UniqueFd(::dup(a.fd())), "job-b", &theirs);
  CHECK(s.code() == Code::kFailedPrecondition);
  CHECK(s.message().find("job-a") != std::string::npos);
  CHECK(theirs == nullptr);
  int p[2];
  REQUIRE(::pipe(p) == 0);
  ::close(p[1]);
  CHECK_FALSE(AttachSegment(UniqueFd(p[0]), "job-a", &theirs).ok());  // not a sealed segment
  CHECK(theirs == nullptr);
}
