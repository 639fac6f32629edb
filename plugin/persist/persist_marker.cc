// A version's node marker, written last and only by a write that was not cancelled (persist_writer.h).
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "plugin/persist/disk_format.h"
#include "plugin/persist/io_workers.h"
#include "plugin/persist/persist_writer.h"

namespace ftrun {

Status PersistWriter::CheckOwnMarker(uint64_t version, const NodeMarker& want, bool* done) {
  *done = false;
  const std::string path = VersionDir(job_dir_, version) + "/" + NodeMarkerName(options_.node);
  std::string bytes;
  NodeMarker have;
  if (!env_->ReadFile(path, &bytes).ok() || !DecodeNodeMarker(bytes, path, &have).ok()) return Status::Ok();
  auto key = [](const NodeMarker& m) {
    std::map<int, std::pair<uint64_t, std::string>> k;
    for (const auto& r : m.ranks) k[r.rank] = {r.manifest_size, r.manifest_checksum.ToHex()};
    return k;
  };
  if (have.job_id == want.job_id && have.world_size == want.world_size && have.has_epoch && have.epoch == want.epoch &&
      key(have) == key(want)) {
    *done = true;  // a retry: this node's part is on disk already
    return Status::Ok();
  }
  // Same version number, other contents: a version from before the job went
  // back to an older one. Writing next to other nodes' old markers could mix
  // the two; the caller must discard versions above the restored one first.
  // (An equal version saved again in another epoch, by a deterministic
  // trainer, has another timeline: the epoch is part of the contents.)
  return Status::FailedPrecondition("persist: " + path + " already covers version " + std::to_string(version) +
                                    " with other contents (" + MarkerEpochString(have) + ", this write's epoch " +
                                    std::to_string(want.epoch) +
                                    "; left from before a restore to an older version?); "
                                    "discard the versions above the restored one first (DiscardVersionsAbove)");
}

// The marker as WriteFileAtomically writes a file, but renamed only if no
// Cancel came since `token`: the check and the rename hold marker_mu_, which
// Cancel takes, so a Cancel either waits for a rename in progress (and its
// caller then sees the marker and can remove it) or the rename never
// happens. Without this a write stuck in a syscall across the flusher's
// Rewind (Cancel, a bounded wait, ClearCancel) wrote the marker of a
// timeline the job had left, after the agent removed the old files.
Status PersistWriter::WriteMarker(const std::string& path, const std::string& bytes, uint64_t token) {
  const std::string tmp = TmpName(path, options_.node);
  std::unique_ptr<WritableFile> f;
  FTRUN_RETURN_IF_ERROR(env_->NewWritableFile(tmp, &f));
  Status st = f->Append(bytes.data(), bytes.size());
  if (st.ok()) st = f->Sync();
  Status closed = f->Close();
  if (st.ok()) st = closed;
  f.reset();
  if (st.ok()) {
    std::lock_guard<std::mutex> marker(marker_mu_);
    if (generation_ != token || cancel_) {
      st = Stopped();
    } else if (options_.marker_guard && !(st = options_.marker_guard()).ok()) {
      st = Status::Unavailable("persist: not completing " + writing_ + " in '" + job_dir_ + "': " + st.message());
    } else {
      st = env_->RenameFile(tmp, path);
    }
  }
  if (!st.ok()) {
    (void)env_->DeleteFile(tmp);
    return st;
  }
  Count(&PersistProgress::bytes_written, bytes.size());
  return Status::Ok();
}

}  // namespace ftrun
