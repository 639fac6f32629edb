// What the writer did for a version, and a chunk file rewritten from RAM after the scrubber found it bad
// (persist_writer.h).
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

std::unordered_set<ChunkHash, ChunkHashHasher> PersistWriter::WrittenChunks(uint64_t version) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (written_version_ != version) return {};
  return written_;
}

Status PersistWriter::RewriteChunk(const ChunkRef& ref, const void* data, const std::string& which) {
  writing_ = "a repair of " + which;
  FTRUN_RETURN_IF_ERROR(Pace(kChunkHeaderSize + ref.length));
  // On an I/O thread, at its low priority, like the writes: the hash check
  // and the file.
  IoWorkers worker(std::min(options_.io_threads, 1), 1, options_.io_nice);
  Status st = worker.Submit([&] {
    if (HashBytes(data, ref.length) != ref.hash) {
      return Status::Corruption("the bytes of " + which + " in memory do not match their hash; not written");
    }
    const std::string subdir = ChunkSubdir(job_dir_, ref.hash);
    bool created = false;  // retention may have removed an emptied subdirectory
    FTRUN_RETURN_IF_ERROR(env_->CreateDir(subdir, &created));
    alignas(4096) char header[kChunkHeaderSize];
    EncodeChunkHeader(ref.hash, ref.length, header);
    // The rename replaces the bad file at once: a reader sees the old file
    // or the new one, never a torn one.
    FTRUN_RETURN_IF_ERROR(WriteFileAtomically(subdir + "/" + ref.hash.ToHex(),
                                              {{header, sizeof(header)}, {data, static_cast<size_t>(ref.length)}}));
    FTRUN_RETURN_IF_ERROR(env_->SyncDir(subdir));
    if (created) FTRUN_RETURN_IF_ERROR(env_->SyncDir(ChunksDir(job_dir_)));
    return Status::Ok();
  });
  Status done = worker.Finish();
  return st.ok() ? done : st;
}

}  // namespace ftrun
