// The event loop the agent and the runner run on: sources by tag, signals
// through the signalfd (never as handlers), the periodic tick.
#include "launcher/common/event_loop.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>

#include "tests/catch.h"

namespace ftrun {
namespace {

bool Has(const std::vector<EventLoop::Ready>& ready, uint64_t tag, uint32_t events = 0) {
  return std::any_of(ready.begin(), ready.end(),
                     [&](const EventLoop::Ready& r) { return r.tag == tag && (r.events & events) == events; });
}

TEST_CASE("event loop: sources by tag, signals through the loop, the tick", "[event_loop]") {
  EventLoop loop;
  REQUIRE(loop.Open({SIGUSR2}, std::chrono::milliseconds(10)).ok());
  int p[2];
  REQUIRE(::pipe(p) == 0);
  UniqueFd rd(p[0]), wr(p[1]);
  REQUIRE(loop.Add(rd.get(), 7).ok());
  std::vector<EventLoop::Ready> ready;

  REQUIRE(::write(wr.get(), "x", 1) == 1);
  REQUIRE(loop.Wait(&ready).ok());
  while (!Has(ready, 7, EPOLLIN)) REQUIRE(loop.Wait(&ready).ok());  // ticks may come first
  char c;
  REQUIRE(::read(rd.get(), &c, 1) == 1);

  // A blocked signal arrives through the loop, with its number.
  REQUIRE(::raise(SIGUSR2) == 0);
  do {
    REQUIRE(loop.Wait(&ready).ok());
  } while (!Has(ready, EventLoop::kSignalTag));
  CHECK(loop.TakeSignals() == std::vector<int>{SIGUSR2});
  CHECK(loop.TakeSignals().empty());

  // The tick keeps coming; TakeTicks consumes it.
  do {
    REQUIRE(loop.Wait(&ready).ok());
  } while (!Has(ready, EventLoop::kTickTag));
  loop.TakeTicks();

  // Modify: the write end, polled for writing; Remove: no more events.
  REQUIRE(loop.Add(wr.get(), 8, 0).ok());
  REQUIRE(loop.Modify(wr.get(), 8, EPOLLOUT).ok());
  do {
    REQUIRE(loop.Wait(&ready).ok());
  } while (!Has(ready, 8, EPOLLOUT));
  loop.Remove(wr.get());
  loop.Remove(rd.get());
  REQUIRE(::write(wr.get(), "y", 1) == 1);
  for (int i = 0; i < 5; ++i) {
    REQUIRE(loop.Wait(&ready).ok());
    CHECK(!Has(ready, 7));
    CHECK(!Has(ready, 8));
    loop.TakeTicks();
  }
  CHECK(!loop.Add(-1, 9).ok());  // a bad descriptor: an error, named

  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGUSR2);
  ::sigprocmask(SIG_UNBLOCK, &mask, nullptr);
}

}  // namespace
}  // namespace ftrun
