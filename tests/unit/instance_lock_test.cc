#include "launcher/agent/instance_lock.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "tests/catch.h"

using ftrun::InstanceLock;

TEST_CASE("one agent per job and node and a dead agent's socket is cleaned", "[agent]") {
  char tmpl[] = "/tmp/ftrun-lock-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = std::string(tmpl) + "/run";
  {
    InstanceLock a;
    REQUIRE(InstanceLock::Claim(dir, "job", 0, &a).ok());
    CHECK_FALSE(a.removed_stale_socket());
    InstanceLock b;
    auto s = InstanceLock::Claim(dir, "job", 0, &b);
    CHECK(s.code() == ftrun::Code::kAlreadyExists);
    CHECK_THAT(s.message(), Catch::Contains("pid " + std::to_string(::getpid())) && Catch::Contains("job.node0.sock"));
    InstanceLock other_node;
    CHECK(InstanceLock::Claim(dir, "job", 1, &other_node).ok());
  }
  // A socket file left behind by an agent that died (no lock holder).
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string path = dir + "/job.node0.sock";
  std::strcpy(addr.sun_path, path.c_str());
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  ::close(fd);
  InstanceLock c;
  REQUIRE(InstanceLock::Claim(dir, "job", 0, &c).ok());
  CHECK(c.removed_stale_socket());
  CHECK(::access(path.c_str(), F_OK) != 0);
}
