// A rank's last words: the tail of its stderr pipe (what it wrote just
// before it died included) or of its own log file, never through a link.
// Ranks' output goes on a line at a time: two ranks writing a line's text
// and its line break separately (print() unbuffered) never interleave
// inside a line; a partial line goes after RankOutput::kHoldFor; with the
// prefix, every line names its rank.
#include "launcher/agent/rank_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <set>
#include <sstream>
#include <thread>

#include "tests/catch.h"
#include "tests/unit/persist_test_util.h"

namespace ftrun {
namespace {

TEST_CASE("rank output: the last lines of a text, a trailing line break not counted", "[rank_output]") {
  CHECK(LastLines("a\nb\nc\n", 2) == "b\nc");
  CHECK(LastLines("a\nb\nc", 5) == "a\nb\nc");
  CHECK(LastLines("", 3).empty());
  CHECK(LastLines("\n\n", 3).empty());
}

TEST_CASE("rank output: a rank's log file's tail, never through a link", "[rank_output]") {
  ScratchDir dir;
  const std::string log = RankLogPath(dir.path(), 3);
  CHECK(log == dir.path() + "/rank3.log");
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "line " + std::to_string(i) + "\n";  // over 4 KiB
  FILE* f = std::fopen(log.c_str(), "w");
  REQUIRE(f != nullptr);
  std::fputs(text.c_str(), f);
  std::fclose(f);
  CHECK(FileTail(log, 2) == "line 1998\nline 1999");
  const std::string link = dir.path() + "/link.log";
  REQUIRE(::symlink(log.c_str(), link.c_str()) == 0);
  CHECK(FileTail(link, 2).empty());
  CHECK(FileTail(dir.path() + "/none.log", 2).empty());
}

TEST_CASE("rank output: the tail of a rank's stderr pipe includes what it wrote last", "[rank_output]") {
  int sink[2];
  REQUIRE(::pipe2(sink, O_CLOEXEC | O_NONBLOCK) == 0);
  {
    RankOutput out(sink[1], sink[1]);
    REQUIRE(out.Start().ok());
    UniqueFd o, w;
    REQUIRE(out.NewPipes(4, &o, &w).ok());
    const std::string words = "loading\nTraceback (most recent call last):\nRuntimeError: boom\n";
    REQUIRE(::write(w.get(), words.data(), words.size()) == static_cast<ssize_t>(words.size()));
    w.Reset();
    CHECK(out.Tail(4, 2) == "Traceback (most recent call last):\nRuntimeError: boom");
    CHECK(out.Tail(5, 2).empty());  // no such rank
  }
  ::close(sink[0]);
  ::close(sink[1]);
}

// Reads what `fd` gets until `want` bytes came or 10 s passed.
std::string ReadFor(int fd, size_t want) {
  std::string got;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  char buf[4096];
  while (got.size() < want && std::chrono::steady_clock::now() < until) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0)
      got.append(buf, static_cast<size_t>(n));
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return got;
}

TEST_CASE("rank output: two ranks writing a line's text and its break apart never interleave inside a line",
          "[rank_output]") {
  const bool prefix = GENERATE(false, true);
  int sink[2];
  REQUIRE(::pipe2(sink, O_CLOEXEC | O_NONBLOCK) == 0);
  ::fcntl(sink[0], F_SETPIPE_SZ, 1 << 20);
  constexpr int kLines = 2000;
  std::string got;
  {
    RankOutput out(sink[1], sink[1], prefix);
    REQUIRE(out.Start().ok());
    UniqueFd o[2], e[2];
    REQUIRE(out.NewPipes(0, &o[0], &e[0]).ok());
    REQUIRE(out.NewPipes(1, &o[1], &e[1]).ok());
    auto writer = [&](int r) {
      for (int i = 0; i < kLines; ++i) {
        const std::string text = "DUMP rank " + std::to_string(r) + " line " + std::to_string(i);
        (void)!::write(o[r].get(), text.data(), text.size());  // print(): the text,
        (void)!::write(o[r].get(), "\n", 1);                   // then the line break
      }
      o[r].Reset();
    };
    std::thread a(writer, 0), b(writer, 1);
    size_t want = 0;
    for (int r = 0; r < 2; ++r)
      for (int i = 0; i < kLines; ++i)
        want += (prefix ? 10 : 0) + ("DUMP rank " + std::to_string(r) + " line " + std::to_string(i) + "\n").size();
    got = ReadFor(sink[0], want);
    a.join();
    b.join();
    CHECK(got.size() == want);
  }
  std::istringstream lines(got);
  std::set<std::string> seen;
  std::string line;
  int bad = 0;
  while (std::getline(lines, line)) {
    std::string rest = line;
    if (prefix) {
      const bool named = rest.rfind("[rank 0]: ", 0) == 0 || rest.rfind("[rank 1]: ", 0) == 0;
      if (!named || rest[6] != rest.substr(10)[10]) ++bad;  // the prefix names the rank that wrote it
      rest = rest.substr(10);
    }
    if (rest.rfind("DUMP rank ", 0) != 0 || rest.find("DUMP", 1) != std::string::npos) ++bad;
    seen.insert(rest);
  }
  CHECK(bad == 0);
  CHECK(seen.size() == 2 * kLines);
  ::close(sink[0]);
  ::close(sink[1]);
}

TEST_CASE("rank output: a partial line goes after a while, and the last one at the end", "[rank_output]") {
  int sink[2];
  REQUIRE(::pipe2(sink, O_CLOEXEC | O_NONBLOCK) == 0);
  {
    RankOutput out(sink[1], sink[1]);
    REQUIRE(out.Start().ok());
    UniqueFd o, e;
    REQUIRE(out.NewPipes(2, &o, &e).ok());
    const std::string prompt = "Continue? [y/N] ";
    REQUIRE(::write(o.get(), prompt.data(), prompt.size()) == static_cast<ssize_t>(prompt.size()));
    CHECK(ReadFor(sink[0], prompt.size()) == prompt);  // after kHoldFor, as it is
    const std::string last = "no line break at the end";
    REQUIRE(::write(e.get(), last.data(), last.size()) == static_cast<ssize_t>(last.size()));
    e.Reset();
    CHECK(ReadFor(sink[0], last.size()) == last);
    CHECK(out.Tail(2, 1) == last);
  }
  ::close(sink[0]);
  ::close(sink[1]);
}

}  // namespace
}  // namespace ftrun
