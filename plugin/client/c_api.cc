// The C ABI of include/ftrun/ftrun.h over ftrun::Client. Every entry point
// catches all exceptions (std::bad_alloc included): nothing may unwind into C.

#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "ftrun/client.h"
#include "ftrun/ftrun.h"
#include "ftrun/status.h"

using ftrun::Code;
using ftrun::Status;

// The C enums restate ftrun's values; keep them in step.
static_assert(FTRUN_INVALID_ARGUMENT == static_cast<int>(Code::kInvalidArgument));
static_assert(FTRUN_CHUNK_MISSING == static_cast<int>(Code::kChunkMissing));
static_assert(FTRUN_IO_TRANSIENT == static_cast<int>(Code::kIoTransient));
static_assert(FTRUN_UNAVAILABLE == static_cast<int>(Code::kUnavailable));
static_assert(FTRUN_DTYPE_BFLOAT16 == static_cast<int>(ftrun::DType::kBFloat16));
static_assert(FTRUN_DTYPE_FLOAT32 == static_cast<int>(ftrun::DType::kFloat32));
static_assert(FTRUN_DTYPE_UINT64 == static_cast<int>(ftrun::DType::kUInt64));
static_assert(FTRUN_DEVICE_CUDA == static_cast<int>(ftrun::Device::kCuda));

// shared_ptr: a snapshot holds its client alive (see ftrun.h).
struct ftrun_client_t {
  std::shared_ptr<ftrun::Client> client;
};

struct ftrun_snapshot_t {
  std::shared_ptr<ftrun::Client> client;  // declared first: destroyed last
  std::unique_ptr<ftrun::Snapshot> snap;
};

namespace {

// Builds "a" + "b" with malloc only, so it also works when new throws.
// Returns NULL if even that fails; the return code still tells the caller.
char* JoinC(const char* a, const char* b) noexcept {
  size_t la = std::strlen(a), lb = std::strlen(b);
  char* s = static_cast<char*>(std::malloc(la + lb + 1));
  if (s == nullptr) return nullptr;
  std::memcpy(s, a, la);
  std::memcpy(s + la, b, lb + 1);
  return s;
}

void SetMessage(char** errptr, char* message) noexcept {
  if (errptr == nullptr) {
    std::free(message);
    return;
  }
  std::free(*errptr);
  *errptr = message;
}

int Fail(char** errptr, Code code, const char* fn, const char* text) noexcept {
  char* prefix = JoinC(ftrun::CodeName(code), ": ");
  char* middle = prefix ? JoinC(prefix, fn) : nullptr;
  char* head = middle ? JoinC(middle, ": ") : nullptr;
  SetMessage(errptr, head ? JoinC(head, text) : nullptr);
  std::free(prefix);
  std::free(middle);
  std::free(head);
  return static_cast<int>(code);
}

int Report(char** errptr, const Status& st) noexcept {
  if (st.ok()) return 0;
  char* message = nullptr;
  try {
    message = JoinC(st.ToString().c_str(), "");
  } catch (...) {
    message = JoinC(ftrun::CodeName(st.code()), ": (message lost: out of memory)");
  }
  SetMessage(errptr, message);
  return static_cast<int>(st.code());
}

// Runs body (returning Status) and turns both its Status and any exception
// into the C convention. status.h has no "internal" code, so an unexpected
// exception is reported as an I/O error carrying its what().
template <typename Body>
int Guard(const char* fn, char** errptr, Body&& body) noexcept {
  try {
    return Report(errptr, body());
  } catch (const std::bad_alloc&) {
    return Fail(errptr, Code::kResourceExhausted, fn, "out of memory");
  } catch (const std::exception& e) {
    return Fail(errptr, Code::kIoError, fn, e.what());
  } catch (...) {
    return Fail(errptr, Code::kIoError, fn, "unknown exception");
  }
}

Status NullArg(const char* fn, const char* arg) {
  return Status::InvalidArgument(std::string(fn) + ": " + arg + " is NULL");
}

Status ToTensorRef(const ftrun_tensor_t& t, size_t i, ftrun::TensorRef* out) {
  std::string where = "ftrun_save: tensors[" + std::to_string(i) + "]";
  if (t.name == nullptr) return Status::InvalidArgument(where + ": name is NULL");
  where += " '" + std::string(t.name) + "'";
  if (t.dtype < FTRUN_DTYPE_UINT8 || t.dtype > FTRUN_DTYPE_UINT64) {
    return Status::InvalidArgument(where + ": unknown dtype " + std::to_string(t.dtype));
  }
  if (t.ndim < 0) return Status::InvalidArgument(where + ": ndim is negative");
  if (t.ndim > 0 && t.shape == nullptr) return Status::InvalidArgument(where + ": shape is NULL");
  if (t.data == nullptr && t.nbytes > 0) return Status::InvalidArgument(where + ": data is NULL");
  const bool has_device = (t.field_mask & FTRUN_TENSOR_FIELD_DEVICE) != 0;
  if (has_device && t.device != FTRUN_DEVICE_HOST && t.device != FTRUN_DEVICE_CUDA) {
    return Status::InvalidArgument(where + ": unknown device " + std::to_string(t.device));
  }
  out->name = t.name;
  out->dtype = static_cast<ftrun::DType>(t.dtype);
  out->shape.assign(t.shape, t.shape + t.ndim);
  out->data = t.data;
  out->nbytes = t.nbytes;
  out->device = has_device ? static_cast<ftrun::Device>(t.device) : ftrun::Device::kHost;
  out->generation = (t.field_mask & FTRUN_TENSOR_FIELD_GENERATION) ? t.generation : 0;
  return Status::Ok();
}

void CopyStats(const ftrun::SaveStats& s, ftrun_save_stats_t* out) {
  const uint64_t m = out->field_mask;
  if (m & FTRUN_SAVE_STATS_FIELD_BYTES_TOTAL) out->bytes_total = s.bytes_total;
  if (m & FTRUN_SAVE_STATS_FIELD_BYTES_HASHED) out->bytes_hashed = s.bytes_hashed;
  if (m & FTRUN_SAVE_STATS_FIELD_BYTES_COPIED) out->bytes_copied = s.bytes_copied;
  if (m & FTRUN_SAVE_STATS_FIELD_CHUNKS_TOTAL) out->chunks_total = s.chunks_total;
  if (m & FTRUN_SAVE_STATS_FIELD_CHUNKS_COPIED) out->chunks_copied = s.chunks_copied;
  if (m & FTRUN_SAVE_STATS_FIELD_CHUNKS_SKIPPED) out->chunks_skipped = s.chunks_skipped;
  if (m & FTRUN_SAVE_STATS_FIELD_CHUNKS_UNCHANGED) out->chunks_unchanged = s.chunks_unchanged;
  if (m & FTRUN_SAVE_STATS_FIELD_STALL_SECONDS) out->stall_seconds = s.stall_seconds;
}

}  // namespace

extern "C" {

int ftrun_client_connect_opts(const ftrun_client_options_t* options, ftrun_client_t** out, char** errptr) {
  static const char kFn[] = "ftrun_client_connect";
  if (out != nullptr) *out = nullptr;
  return Guard(kFn, errptr, [&]() -> Status {
    if (out == nullptr) return NullArg(kFn, "out");
    ftrun::ClientOptions opts;
    if (options != nullptr) {
      const uint64_t m = options->field_mask;
      if ((m & FTRUN_CLIENT_FIELD_SOCKET_PATH) && options->socket_path != nullptr) {
        opts.socket_path = options->socket_path;
      }
      if (m & FTRUN_CLIENT_FIELD_RANK) opts.rank = options->rank;
      if (m & FTRUN_CLIENT_FIELD_CONNECT_TIMEOUT) {
        opts.connect_timeout_ms = options->connect_timeout_ms;
      }
    }
    if (opts.rank < -1) {
      return Status::InvalidArgument(std::string(kFn) + ": rank " + std::to_string(opts.rank) + " is negative");
    }
    std::unique_ptr<ftrun::Client> client;
    FTRUN_RETURN_IF_ERROR(ftrun::Client::Connect(opts, &client));
    auto handle = std::make_unique<ftrun_client_t>();
    handle->client = std::move(client);
    *out = handle.release();
    return Status::Ok();
  });
}

int ftrun_client_connect(const char* socket_path, int rank, ftrun_client_t** out, char** errptr) {
  ftrun_client_options_t options;
  std::memset(&options, 0, sizeof(options));
  options.field_mask = FTRUN_CLIENT_FIELD_SOCKET_PATH | FTRUN_CLIENT_FIELD_RANK;
  options.socket_path = socket_path;
  options.rank = rank;
  return ftrun_client_connect_opts(&options, out, errptr);
}

void ftrun_client_close(ftrun_client_t* client) { delete client; }

int ftrun_client_rank(const ftrun_client_t* client) { return client ? client->client->rank() : -1; }

const char* ftrun_client_job_id(const ftrun_client_t* client) {
  return client ? client->client->job_id().c_str() : nullptr;
}

uint64_t ftrun_client_chunk_size(const ftrun_client_t* client) { return client ? client->client->chunk_size() : 0; }

int ftrun_client_restore_version(const ftrun_client_t* client, uint64_t* version) {
  if (client == nullptr || version == nullptr) return 0;
  try {
    return client->client->restore_version(version) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

int ftrun_save(ftrun_client_t* client, uint64_t version, const ftrun_tensor_t* tensors, size_t n,
               const void* user_bytes, size_t user_len, ftrun_save_stats_t* stats, char** errptr) {
  static const char kFn[] = "ftrun_save";
  return Guard(kFn, errptr, [&]() -> Status {
    if (client == nullptr) return NullArg(kFn, "client");
    if (tensors == nullptr && n > 0) return NullArg(kFn, "tensors");
    if (user_bytes == nullptr && user_len > 0) return NullArg(kFn, "user_bytes");
    std::vector<ftrun::TensorRef> refs(n);
    for (size_t i = 0; i < n; ++i) {
      FTRUN_RETURN_IF_ERROR(ToTensorRef(tensors[i], i, &refs[i]));
    }
    std::string_view user(user_len > 0 ? static_cast<const char*>(user_bytes) : "", user_len);
    ftrun::SaveStats s;
    FTRUN_RETURN_IF_ERROR(client->client->Save(version, refs, user, &s));
    if (stats != nullptr) CopyStats(s, stats);
    return Status::Ok();
  });
}

int ftrun_wait(ftrun_client_t* client, char** errptr) {
  static const char kFn[] = "ftrun_wait";
  return Guard(kFn, errptr, [&]() -> Status {
    if (client == nullptr) return NullArg(kFn, "client");
    return client->client->Wait();
  });
}

int ftrun_wait_committed(ftrun_client_t* client, uint64_t version, int timeout_ms, char** errptr) {
  static const char kFn[] = "ftrun_wait_committed";
  return Guard(kFn, errptr, [&]() -> Status {
    if (client == nullptr) return NullArg(kFn, "client");
    return client->client->WaitCommitted(version, timeout_ms);
  });
}

int ftrun_report_progress(ftrun_client_t* client, uint64_t step, char** errptr) {
  static const char kFn[] = "ftrun_report_progress";
  return Guard(kFn, errptr, [&]() -> Status {
    if (client == nullptr) return NullArg(kFn, "client");
    return client->client->ReportProgress(step);
  });
}

int ftrun_list_versions(ftrun_client_t* client, uint64_t* committed, size_t cap, size_t* n, char** errptr) {
  static const char kFn[] = "ftrun_list_versions";
  return Guard(kFn, errptr, [&]() -> Status {
    if (client == nullptr) return NullArg(kFn, "client");
    if (n == nullptr) return NullArg(kFn, "n");
    if (committed == nullptr && cap > 0) return NullArg(kFn, "committed");
    ftrun::VersionList list;
    FTRUN_RETURN_IF_ERROR(client->client->ListVersions(&list));
    *n = list.committed.size();
    for (size_t i = 0; i < cap && i < list.committed.size(); ++i) {
      committed[i] = list.committed[i];
    }
    return Status::Ok();
  });
}

int ftrun_load(ftrun_client_t* client, uint64_t version, ftrun_snapshot_t** out, char** errptr) {
  static const char kFn[] = "ftrun_load";
  if (out != nullptr) *out = nullptr;
  return Guard(kFn, errptr, [&]() -> Status {
    if (client == nullptr) return NullArg(kFn, "client");
    if (out == nullptr) return NullArg(kFn, "out");
    auto handle = std::make_unique<ftrun_snapshot_t>();
    FTRUN_RETURN_IF_ERROR(client->client->Load(version, &handle->snap));
    handle->client = client->client;
    *out = handle.release();
    return Status::Ok();
  });
}

uint64_t ftrun_snapshot_version(const ftrun_snapshot_t* snap) { return snap ? snap->snap->version() : 0; }

size_t ftrun_snapshot_num_tensors(const ftrun_snapshot_t* snap) { return snap ? snap->snap->tensors().size() : 0; }

int ftrun_snapshot_tensor_info(const ftrun_snapshot_t* snap, size_t i, const char** name, int* dtype, int* ndim,
                               const int64_t** shape, uint64_t* nbytes) {
  if (snap == nullptr || i >= snap->snap->tensors().size()) return FTRUN_INVALID_ARGUMENT;
  const ftrun::TensorInfo& t = snap->snap->tensors()[i];
  if (name) *name = t.name.c_str();
  if (dtype) *dtype = static_cast<int>(t.dtype);
  if (ndim) *ndim = static_cast<int>(t.shape.size());
  if (shape) *shape = t.shape.data();
  if (nbytes) *nbytes = t.nbytes;
  return FTRUN_OK;
}

void ftrun_snapshot_user_bytes(const ftrun_snapshot_t* snap, const void** data, size_t* len) {
  const std::string* bytes = snap ? &snap->snap->user_bytes() : nullptr;
  if (data) *data = bytes ? bytes->data() : nullptr;
  if (len) *len = bytes ? bytes->size() : 0;
}

int ftrun_snapshot_read(const ftrun_snapshot_t* snap, const char* name, void* dst, uint64_t nbytes, char** errptr) {
  static const char kFn[] = "ftrun_snapshot_read";
  return Guard(kFn, errptr, [&]() -> Status {
    if (snap == nullptr) return NullArg(kFn, "snap");
    if (name == nullptr) return NullArg(kFn, "name");
    if (dst == nullptr && nbytes > 0) return NullArg(kFn, "dst");
    return snap->snap->Read(name, dst, nbytes);
  });
}

void ftrun_snapshot_close(ftrun_snapshot_t* snap) { delete snap; }

const char* ftrun_code_name(int code) {
  if (code < 0 || code > FTRUN_IO_TRANSIENT) return "UNKNOWN";
  return ftrun::CodeName(static_cast<Code>(code));
}

void ftrun_free(void* ptr) { std::free(ptr); }

}  // extern "C"
