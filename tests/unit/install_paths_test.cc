#include "launcher/common/install_paths.h"

#include "tests/catch.h"

using ftrun::AppendSearchPath;

TEST_CASE("a directory is appended to a search path once, after what the user set", "[install]") {
  CHECK(AppendSearchPath("", "/p/lib/ftrun/python") == "/p/lib/ftrun/python");
  CHECK(AppendSearchPath("/mine", "/p/py") == "/mine:/p/py");
  CHECK(AppendSearchPath("/p/py", "/p/py") == "/p/py");
  CHECK(AppendSearchPath("/a:/p/py:/b", "/p/py") == "/a:/p/py:/b");
  // Whole entries only.
  CHECK(AppendSearchPath("/p/py/sub:/p/pyx", "/p/py") == "/p/py/sub:/p/pyx:/p/py");
  // No package found: nothing added.
  CHECK(AppendSearchPath("/mine", "") == "/mine");
}

TEST_CASE("the executable's directory comes from /proc/self/exe", "[install]") {
  const std::string dir = ftrun::ExecutableDir();
  REQUIRE(!dir.empty());
  CHECK(dir[0] == '/');
  CHECK(dir.substr(dir.rfind('/')) == "/tests");  // this binary is <build>/tests/ftrun_unit_tests
  // No python/ beside it and no install tree around it: no package to offer.
  CHECK(ftrun::OwnPythonPackageDir().empty());
}
