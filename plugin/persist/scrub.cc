// ChunkScrubber: read back the chunk files a version reuses; repair from RAM.
#include "plugin/persist/scrub.h"

#include <algorithm>
#include <memory>

#include "plugin/persist/disk_format.h"
#include "plugin/persist/io_workers.h"

namespace ftrun {

ChunkScrubber::ChunkScrubber(PersistWriter* writer)
    : writer_(writer),
      reader_(writer->env(), writer->options().dir, writer->options().job_id, writer->options().world_size) {}

ScrubProgress ChunkScrubber::Progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  return progress_;
}

void ChunkScrubber::Count(uint64_t ScrubProgress::*field, uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  progress_.*field += n;
}

void ChunkScrubber::Stop() {
  stop_ = true;
  writer_->Interrupt();  // a rate-limit wait of the scrub looks at stop_
}

Status ChunkScrubber::Stopped() const {
  if (!writer_->cancelled() && !stop_) return Status::Ok();
  return Status::Unavailable("persist: scrubbing the chunk files of version " + std::to_string(version_) + " in '" +
                             reader_.job_dir() + "' stopped (" +
                             (writer_->cancelled() ? "cancelled" : "asked to stop") + ")");
}

Status ChunkScrubber::Scrub(uint64_t version, const std::vector<const Manifest*>& manifests, const ChunkSource& source,
                            std::vector<ScrubFinding>* findings) {
  version_ = version;
  findings->clear();
  HashSet good;
  std::vector<Target> todo = Unchecked(version, manifests, &good);
  Status st = CheckFiles(todo, &good, findings);
  if (st.ok()) st = Repair(source, findings, &good);
  // Only this version's chunks are remembered: one version's worth at most,
  // and the next version mostly shares them. What failed stays unknown and
  // is checked again next time.
  verified_ = std::move(good);
  return st;
}

std::vector<ChunkScrubber::Target> ChunkScrubber::Unchecked(uint64_t version,
                                                            const std::vector<const Manifest*>& manifests,
                                                            HashSet* good) const {
  const HashSet written = writer_->WrittenChunks(version);
  HashSet seen;
  std::vector<Target> todo;
  for (const Manifest* m : manifests) {
    for (const TensorManifest& t : m->tensors) {
      for (size_t i = 0; i < t.chunks.size(); ++i) {
        const ChunkRef& ref = t.chunks[i];
        if (!seen.insert(ref.hash).second) continue;
        if (written.count(ref.hash) != 0 || verified_.count(ref.hash) != 0) {
          good->insert(ref.hash);
          continue;
        }
        todo.push_back({ref, "rank " + std::to_string(m->rank) + " tensor '" + t.info.name + "' chunk #" +
                                 std::to_string(i) + " (" + ref.hash.ToHex() + ")"});
      }
    }
  }
  return todo;
}

// The calling thread paces the reads; the writer's I/O threads, at their low
// priority, read and hash.
Status ChunkScrubber::CheckFiles(const std::vector<Target>& todo, HashSet* good, std::vector<ScrubFinding>* bad) {
  const PersistWriterOptions& o = writer_->options();
  const size_t threads = static_cast<size_t>(std::max(o.io_threads, 0));
  IoWorkers workers(o.io_threads, 2 * std::max<size_t>(threads, 1), o.io_nice);
  std::mutex mu;  // guards *good and *bad, which the workers fill
  Status st;
  for (const Target& t : todo) {
    st = writer_->PaceRead(kChunkHeaderSize + t.ref.length, &stop_);
    if (st.code() == Code::kUnavailable) st = Stopped();  // say it is the scrub that stopped
    if (st.ok()) st = workers.Submit([this, &t, &mu, good, bad] { return CheckOne(t, &mu, good, bad); });
    if (!st.ok()) break;
  }
  Status checked = workers.Finish();
  return st.ok() ? checked : st;
}

// A file that fails any check - missing, unreadable, wrong size or header,
// bytes that do not hash right - is a finding, not an error of the scrub.
Status ChunkScrubber::CheckOne(const Target& t, std::mutex* mu, HashSet* good, std::vector<ScrubFinding>* bad) {
  FTRUN_RETURN_IF_ERROR(Stopped());
  std::unique_ptr<char[]> buf(new char[std::max<uint64_t>(t.ref.length, 1)]);
  Status st = reader_.CheckChunkFile(t.ref, buf.get());
  buf.reset();
  Count(&ScrubProgress::chunks_scrubbed, 1);
  Count(&ScrubProgress::bytes_scrubbed, t.ref.length);
  if (!st.ok()) Count(&ScrubProgress::chunks_bad, 1);
  std::lock_guard<std::mutex> lock(*mu);
  if (st.ok()) {
    good->insert(t.ref.hash);
  } else {
    bad->push_back({ChunkPath(reader_.job_dir(), t.ref.hash), t.ref, t.which, st.message(),
                    Status::Unavailable("not repaired: the scrub stopped first")});
  }
  return Status::Ok();
}

Status ChunkScrubber::Repair(const ChunkSource& source, std::vector<ScrubFinding>* bad, HashSet* good) {
  Status first;
  const std::string of = " of version " + std::to_string(version_);
  for (ScrubFinding& f : *bad) {
    FTRUN_RETURN_IF_ERROR(Stopped());
    const void* data = nullptr;
    f.repair = source(f.ref, &data).Annotate("cannot get the bytes of " + f.which + of + " from RAM");
    if (f.repair.ok()) f.repair = writer_->RewriteChunk(f.ref, data, f.which + of);
    if (f.repair.ok()) {
      good->insert(f.ref.hash);
      Count(&ScrubProgress::chunks_repaired, 1);
      continue;
    }
    if (f.repair.code() == Code::kUnavailable) {  // cancelled during the rewrite
      Status stopped = Stopped();
      return stopped.ok() ? f.repair : stopped;
    }
    Count(&ScrubProgress::repairs_failed, 1);
    if (first.ok()) {
      first = f.repair.Annotate("persist: version " + std::to_string(version_) + ": chunk file '" + f.path +
                                "' failed its check and cannot be repaired from RAM");
    }
  }
  return first;
}

}  // namespace ftrun
