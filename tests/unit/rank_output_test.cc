// A rank's last words: the tail of its stderr pipe (what it wrote just
// before it died included) or of its own log file, never through a link.
#include "launcher/agent/rank_output.h"

#include <fcntl.h>
#include <unistd.h>

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
    RankOutput out(sink[1]);
    REQUIRE(out.Start().ok());
    UniqueFd w;
    REQUIRE(out.NewPipe(4, &w).ok());
    const std::string words = "loading\nTraceback (most recent call last):\nRuntimeError: boom\n";
    REQUIRE(::write(w.get(), words.data(), words.size()) == static_cast<ssize_t>(words.size()));
    w.Reset();
    CHECK(out.Tail(4, 2) == "Traceback (most recent call last):\nRuntimeError: boom");
    CHECK(out.Tail(5, 2).empty());  // no such rank
  }
  ::close(sink[0]);
  ::close(sink[1]);
}

}  // namespace
}  // namespace ftrun
