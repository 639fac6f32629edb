// The C ABI's conventions that need no agent: connect failures, the errptr
// protocol, and NULL arguments. Save/load round trips through the C API run
// in the integration tests, where an agent is up.

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "ftrun/ftrun.h"
#include "tests/catch.h"

extern "C" int ftrun_c_header_check(void);

namespace {

std::string MissingSocketPath() {
  return "/tmp/ftrun-c-api-test-" + std::to_string(::getpid()) + "/no-such-agent.sock";
}

bool Contains(const char* haystack, const std::string& needle) {
  return haystack != nullptr && std::strstr(haystack, needle.c_str()) != nullptr;
}

}  // namespace

TEST_CASE("connecting to a socket that does not exist fails with the path") {
  const std::string path = MissingSocketPath();
  ftrun_client_options_t options;
  std::memset(&options, 0, sizeof(options));
  options.field_mask = FTRUN_CLIENT_FIELD_SOCKET_PATH | FTRUN_CLIENT_FIELD_RANK | FTRUN_CLIENT_FIELD_CONNECT_TIMEOUT;
  options.socket_path = path.c_str();
  options.rank = 0;
  options.connect_timeout_ms = 200;
  ftrun_client_t* client = reinterpret_cast<ftrun_client_t*>(&options);  // not NULL
  char* err = nullptr;

  const int rc = ftrun_client_connect_opts(&options, &client, &err);

  CHECK((rc == FTRUN_UNAVAILABLE || rc == FTRUN_IO_ERROR));
  CHECK(client == nullptr);
  REQUIRE(err != nullptr);
  CHECK(Contains(err, path));
  CHECK(Contains(err, ftrun_code_name(rc)));
  ftrun_free(err);
}

TEST_CASE("errptr: a new message replaces and frees the old one") {
  char* err = nullptr;
  REQUIRE(ftrun_save(nullptr, 1, nullptr, 0, nullptr, 0, nullptr, &err) == FTRUN_INVALID_ARGUMENT);
  REQUIRE(err != nullptr);
  CHECK(Contains(err, "ftrun_save"));

  // The previous message is freed by the call (leak checkers would see it).
  REQUIRE(ftrun_wait(nullptr, &err) == FTRUN_INVALID_ARGUMENT);
  REQUIRE(err != nullptr);
  CHECK(Contains(err, "ftrun_wait"));
  CHECK_FALSE(Contains(err, "ftrun_save"));
  ftrun_free(err);

  SECTION("errptr itself may be NULL") { CHECK(ftrun_report_progress(nullptr, 3, nullptr) == FTRUN_INVALID_ARGUMENT); }
  SECTION("ftrun_free(NULL) is a no-op") { ftrun_free(nullptr); }
  SECTION("a failure without a previous message sets one") {
    char* fresh = nullptr;
    CHECK(ftrun_wait_committed(nullptr, 1, 10, &fresh) == FTRUN_INVALID_ARGUMENT);
    CHECK(Contains(fresh, "INVALID_ARGUMENT"));
    ftrun_free(fresh);
  }
}

TEST_CASE("NULL arguments give INVALID_ARGUMENT with a message naming them") {
  char* err = nullptr;
  auto expect = [&](int rc, const std::string& fn, const std::string& arg) {
    CHECK(rc == FTRUN_INVALID_ARGUMENT);
    REQUIRE(err != nullptr);
    CHECK(Contains(err, "INVALID_ARGUMENT"));
    CHECK(Contains(err, fn));
    CHECK(Contains(err, arg + " is NULL"));
  };

  expect(ftrun_client_connect(MissingSocketPath().c_str(), 0, nullptr, &err), "ftrun_client_connect", "out");
  expect(ftrun_client_connect_opts(nullptr, nullptr, &err), "ftrun_client_connect", "out");
  expect(ftrun_save(nullptr, 1, nullptr, 0, nullptr, 0, nullptr, &err), "ftrun_save", "client");
  expect(ftrun_wait(nullptr, &err), "ftrun_wait", "client");
  expect(ftrun_wait_committed(nullptr, 1, 0, &err), "ftrun_wait_committed", "client");
  expect(ftrun_report_progress(nullptr, 1, &err), "ftrun_report_progress", "client");
  size_t n = 7;
  expect(ftrun_list_versions(nullptr, nullptr, 0, &n, &err), "ftrun_list_versions", "client");
  ftrun_snapshot_t* snap = reinterpret_cast<ftrun_snapshot_t*>(&n);  // not NULL
  expect(ftrun_load(nullptr, FTRUN_LATEST, &snap, &err), "ftrun_load", "client");
  CHECK(snap == nullptr);
  char dst[4];
  expect(ftrun_snapshot_read(nullptr, "x", dst, sizeof(dst), &err), "ftrun_snapshot_read", "snap");
  ftrun_free(err);
}

TEST_CASE("accessors and destructors accept NULL handles") {
  uint64_t version = 42;
  CHECK(ftrun_client_rank(nullptr) == -1);
  CHECK(ftrun_client_job_id(nullptr) == nullptr);
  CHECK(ftrun_client_chunk_size(nullptr) == 0);
  CHECK(ftrun_client_restore_version(nullptr, &version) == 0);
  CHECK(version == 42);
  CHECK(ftrun_snapshot_version(nullptr) == 0);
  CHECK(ftrun_snapshot_num_tensors(nullptr) == 0);
  const char* name = "unchanged";
  CHECK(ftrun_snapshot_tensor_info(nullptr, 0, &name, nullptr, nullptr, nullptr, nullptr) == FTRUN_INVALID_ARGUMENT);
  CHECK(std::strcmp(name, "unchanged") == 0);
  const void* data = &version;
  size_t len = 9;
  ftrun_snapshot_user_bytes(nullptr, &data, &len);
  CHECK(data == nullptr);
  CHECK(len == 0);
  ftrun_snapshot_close(nullptr);
  ftrun_client_close(nullptr);
}

TEST_CASE("code names match ftrun::CodeName") {
  CHECK(std::string(ftrun_code_name(FTRUN_OK)) == "OK");
  CHECK(std::string(ftrun_code_name(FTRUN_INVALID_ARGUMENT)) == "INVALID_ARGUMENT");
  CHECK(std::string(ftrun_code_name(FTRUN_CHUNK_MISSING)) == "CHUNK_MISSING");
  CHECK(std::string(ftrun_code_name(-1)) == "UNKNOWN");
  CHECK(std::string(ftrun_code_name(99)) == "UNKNOWN");
}

TEST_CASE("the header compiles as C and behaves the same from C") { CHECK(ftrun_c_header_check() == 0); }
