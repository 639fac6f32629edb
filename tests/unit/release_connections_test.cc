#include "launcher/agent/release_connections.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "plugin/common/fd.h"
#include "tests/catch.h"

namespace {

using ftrun::UniqueFd;

uint64_t Inode(int fd) {
  struct stat st {};
  REQUIRE(::fstat(fd, &st) == 0);
  return st.st_ino;
}

UniqueFd Listener(int* port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  REQUIRE(::listen(fd.get(), 8) == 0);
  socklen_t len = sizeof(a);
  REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) == 0);
  *port = ntohs(a.sin_port);
  return fd;
}

void Connect(int fd, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
}

UniqueFd Client(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  Connect(fd.get(), port);
  return fd;
}

bool Usable(int fd) { return ::send(fd, "x", 1, MSG_NOSIGNAL) == 1; }

}  // namespace

TEST_CASE("a survivor's connections of the generation are shut down, and one still connecting on a later pass",
          "[agent]") {
  int port = 0, store_port = 0;
  UniqueFd listener = Listener(&port);
  UniqueFd old_client = Client(port);  // had when the generation began: stays
  UniqueFd old_server(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  std::set<uint64_t> settled = ftrun::SocketInodes(::getpid());
  CHECK(settled.count(Inode(old_client.get())) == 1);

  UniqueFd store = Listener(&store_port);
  UniqueFd store_client = Client(store_port);  // the rank's own client of the store: goes
  UniqueFd store_side(::accept4(store.get(), nullptr, nullptr, SOCK_CLOEXEC));  // the store's side: stays
  UniqueFd client = Client(port);
  UniqueFd server(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  UniqueFd connecting(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));  // between socket() and connect()

  int released = -1;
  REQUIRE(ftrun::ReleaseConnections(::getpid(), store_port, &settled, &released).ok());
  CHECK(released == 3);  // client, server, store_client
  CHECK_FALSE(Usable(client.get()));
  CHECK_FALSE(Usable(server.get()));
  CHECK_FALSE(Usable(store_client.get()));
  CHECK(Usable(old_client.get()));
  CHECK(Usable(store_side.get()));
  CHECK(settled.count(Inode(store.get())) == 1);       // a listener: never
  CHECK(settled.count(Inode(store_side.get())) == 1);  // the store's side: never
  CHECK(settled.count(Inode(connecting.get())) == 0);  // looked at again

  Connect(connecting.get(), port);
  UniqueFd late(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  REQUIRE(ftrun::ReleaseConnections(::getpid(), store_port, &settled, &released).ok());
  CHECK(released == 2);  // the one that was connecting, and its accepted side
  CHECK_FALSE(Usable(connecting.get()));
  CHECK(Usable(old_client.get()));
  REQUIRE(ftrun::ReleaseConnections(::getpid(), store_port, &settled, &released).ok());
  CHECK(released == 0);
}

TEST_CASE("releasing the connections of a process that is gone is an error that names it", "[agent]") {
  std::set<uint64_t> settled;
  int released = -1;
  const ftrun::Status s = ftrun::ReleaseConnections(0x3ffffff0, 0, &settled, &released);
  CHECK_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("pidfd_open(" + std::to_string(0x3ffffff0) + ")"));
  CHECK(released == 0);
}
