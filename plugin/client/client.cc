#include "ftrun/client.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>

#include "plugin/client/attached_segment.h"
#include "plugin/client/client_impl.h"
#include "plugin/client/device_saver.h"
#include "plugin/common/bytes.h"
#include "plugin/ipc/rank_messages.h"
#include "plugin/ipc/unix_socket.h"

namespace ftrun {
namespace {

int RankFromEnv() {
  for (const char* var : {"FTRUN_RANK", "RANK"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') return std::atoi(v);
  }
  return -1;
}

}  // namespace

Client::Impl::~Impl() = default;

Status Client::Impl::Call(MsgType type, const std::string& payload, MsgType expect, std::string* reply,
                          int timeout_ms) {
  if (!broken.ok()) return broken;
  Status s = SendFrame(sock.get(), type, payload);
  MsgType got = MsgType::kError;
  if (s.ok()) s = RecvFrame(sock.get(), timeout_ms, &got, reply);
  if (s.ok() && got != expect && got != MsgType::kError) {
    s = Status::Corruption("unexpected reply " + std::to_string(static_cast<int>(got)) + " from the agent");
  }
  if (!s.ok()) {
    // The first failure sticks: a late or half-read reply would otherwise
    // be taken as the answer to the next request.
    broken = s.Annotate("connection to the agent failed");
    sock.Reset();
    return broken;
  }
  if (got == MsgType::kError) return DecodeError(*reply);
  return Status::Ok();
}

Status Client::Impl::Notify(MsgType type, const std::string& payload) {
  if (!broken.ok()) return broken;
  Status s = SendFrame(sock.get(), type, payload);
  if (!s.ok()) {
    broken = s.Annotate("connection to the agent failed");
    sock.Reset();
  }
  return s;
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Status Client::Connect(const ClientOptions& options, std::unique_ptr<Client>* out) {
  auto impl = std::make_unique<Impl>();
  std::string path = options.socket_path;
  if (path.empty()) {
    const char* env = std::getenv("FTRUN_AGENT_SOCKET");
    if (env == nullptr || *env == '\0') {
      return Status::InvalidArgument(
          "no agent socket: pass ClientOptions::socket_path or run under ftrun-agent (which sets FTRUN_AGENT_SOCKET)");
    }
    path = env;
  }
  impl->rank = options.rank >= 0 ? options.rank : RankFromEnv();
  if (impl->rank < 0) return Status::InvalidArgument("no rank: pass ClientOptions::rank or set FTRUN_RANK / RANK");
  FTRUN_RETURN_IF_ERROR(ConnectUnix(path, options.connect_timeout_ms, &impl->sock));

  const char* job_env = std::getenv("FTRUN_JOB_ID");
  std::string expected_job = job_env != nullptr ? job_env : "";
  RankHello hello;
  hello.protocol = kProtocolVersion;
  hello.rank = impl->rank;
  hello.pid = ::getpid();
  hello.job = expected_job;
  hello.role = options.writer ? HelloRole::kWriter : HelloRole::kRank;
  FTRUN_RETURN_IF_ERROR(SendFrame(impl->sock.get(), MsgType::kHello, Encode(hello)));
  MsgType type;
  std::string reply;
  UniqueFd memfd;
  FTRUN_RETURN_IF_ERROR(RecvFrame(impl->sock.get(), options.connect_timeout_ms, &type, &reply, &memfd)
                            .Annotate("waiting for the agent at " + path));
  if (type == MsgType::kError)
    return DecodeError(reply).Annotate("agent at " + path + " refused rank " + std::to_string(impl->rank));
  if (type != MsgType::kHelloOk || !memfd.valid())
    return Status::Corruption("agent at " + path + " sent no store segment");
  HelloOkMsg ok;
  FTRUN_RETURN_IF_ERROR(Decode(reply, &ok));
  impl->job_id = ok.job_id;
  impl->node = ok.node;
  impl->chunk_size = ok.chunk_size;
  impl->has_restore = ok.restore_version.has_value();
  impl->restore_version = ok.restore_version.value_or(0);
  // A rank that knows its job checks the segment header against it.
  if (!expected_job.empty() && impl->job_id != expected_job) {
    return Status::FailedPrecondition("agent at " + path + " serves job '" + impl->job_id + "', this rank is in job '" +
                                      expected_job + "'");
  }
  FTRUN_RETURN_IF_ERROR(
      AttachSegment(std::move(memfd), expected_job.empty() ? impl->job_id : expected_job, &impl->segment));
  // The mapping is not populated: a rank maps the whole node store but only
  // ever touches its own extents (and the chunks it restores), so page
  // tables fill in as it goes and stay small.
  out->reset(new Client(std::move(impl)));
  return Status::Ok();
}

int Client::rank() const { return impl_->rank; }
const std::string& Client::job_id() const { return impl_->job_id; }
uint64_t Client::chunk_size() const { return impl_->chunk_size; }

bool Client::restore_version(uint64_t* version) const {
  if (impl_->has_restore) *version = impl_->restore_version;
  return impl_->has_restore;
}

Status Client::Save(uint64_t version, const std::vector<TensorRef>& tensors, std::string_view user_bytes,
                    SaveStats* stats) {
  return Save(version, tensors, user_bytes, SaveOptions{}, stats);
}

Status Client::Save(uint64_t version, const std::vector<TensorRef>& tensors, std::string_view user_bytes,
                    const SaveOptions& options, SaveStats* stats) {
  FTRUN_RETURN_IF_ERROR(Wait());
  bool any_device = false;
  for (const auto& t : tensors) any_device |= t.device == Device::kCuda;
  SaveStats own;
  SaveStats* st = stats != nullptr ? stats : &own;
  if (any_device && !impl_->device) FTRUN_RETURN_IF_ERROR(DeviceSaver::Create(impl_.get(), &impl_->device));
  FTRUN_RETURN_IF_ERROR(any_device ? impl_->device->Save(version, tensors, user_bytes, options, st)
                                   : impl_->SaveHost(version, tensors, user_bytes, st, false));
  // The agent's metrics count how long the caller was held (a histogram of
  // every rank's saves); a lost notice loses nothing saved.
  (void)impl_->Notify(MsgType::kSaveStall, EncodeSaveStall(version, st->stall_seconds));
  return Status::Ok();
}

Status Client::Wait() {
  if (!impl_->device) return Status::Ok();
  return impl_->device->Wait();
}

Status Client::OrderAfterSave(void* cuda_stream) {
  if (!impl_->device) return Status::Ok();
  return impl_->device->OrderAfterCopies(cuda_stream);
}

Status Client::WaitCommitted(uint64_t version, int timeout_ms) {
  FTRUN_RETURN_IF_ERROR(Wait());
  std::string reply;
  // The agent answers at timeout_ms; our own deadline is only a backstop.
  const int64_t backstop = timeout_ms < 0 ? -1 : std::min<int64_t>(int64_t{timeout_ms} + 30000, INT32_MAX);
  return impl_->Call(MsgType::kWaitCommitted, Encode(WaitCommittedMsg{version, timeout_ms}), MsgType::kCommitted,
                     &reply, static_cast<int>(backstop));
}

Status Client::ListVersions(VersionList* out) {
  std::string reply;
  FTRUN_RETURN_IF_ERROR(impl_->Call(MsgType::kList, "", MsgType::kListOk, &reply));
  ListOkMsg got;
  FTRUN_RETURN_IF_ERROR(Decode(reply, &got));
  *out = VersionList{};
  out->committed = std::move(got.committed);
  out->pending = std::move(got.pending);
  out->has_restore = got.has_committed;
  out->restore_version = got.committed_version;
  return Status::Ok();
}

Status Client::ReportProgress(uint64_t step) { return impl_->Notify(MsgType::kProgress, Encode(VersionMsg{step})); }

}  // namespace ftrun
