// ChunkScrubber: checks the chunk files a version shares with older ones,
// and repairs a bad one from RAM (DESIGN.md, failure paths: "corrupted
// chunk ... on disk").
//
// Why. PersistWriter writes only the chunks whose files are missing; a chunk
// file that rotted at rest (a bit flip) would be reused as it is by every
// newer version with those bytes, and all of them would fail at restore.
// So after the flusher wrote a version - while the version is still pinned
// in the store, so the RAM copy of every chunk it references is valid - the
// scrubber reads back the chunk files that write did not write itself, and
// rewrites each one that fails from the RAM copy.
//
// Each chunk is checked once: chunks this writer wrote and chunks that
// verified are remembered. The memory is kept to the chunks of the version
// last scrubbed (the next version mostly shares them), so a chunk that
// leaves the versions and comes back is checked again; that bounds it by
// one version's chunks however long the agent runs. So the first version an
// agent writes after a start reads back every chunk it reuses from disk,
// later ones only what they reuse from further back.
//
// The check is PersistReader::CheckChunkFile (header, size, hash), the same
// as a restore's. Reads are paced by the writer's rate limit, together with
// its writes, and run on the writer's I/O threads at their low priority.
// The writer's Cancel stops a scrub between chunk reads, and so does Stop
// (for the flusher's Drain: the job is ending, the last version matters
// more than a check). Repairs use PersistWriter::RewriteChunk, which hashes
// the RAM bytes first: bytes that do not match are never written.
//
// Threads: Scrub runs on the writer's WriteVersion thread, between its
// calls. Stop, Resume and Progress may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "ftrun/status.h"
#include "plugin/persist/persist_reader.h"
#include "plugin/persist/persist_writer.h"
#include "plugin/store/manifest.h"

namespace ftrun {

struct ScrubProgress {
  uint64_t chunks_scrubbed = 0;  // chunk files read back and checked
  uint64_t bytes_scrubbed = 0;   // their chunk bytes
  uint64_t chunks_bad = 0;       // failed the check: corrupt header, wrong size or hash, missing
  uint64_t chunks_repaired = 0;  // rewritten from RAM
  uint64_t repairs_failed = 0;   // could not be rewritten (disk error, RAM copy wrong)
};

// One chunk file that failed its check.
struct ScrubFinding {
  std::string path;
  ChunkRef ref;         // as the manifest has it: its offset locates the RAM copy
  std::string which;    // "rank 1 tensor 'w' chunk #3"
  std::string problem;  // why the check failed
  Status repair;        // ok: repaired from RAM
};

class ChunkScrubber {
 public:
  // `writer` writes the versions this scrubber checks; it outlives it.
  explicit ChunkScrubber(PersistWriter* writer);
  ChunkScrubber(const ChunkScrubber&) = delete;
  ChunkScrubber& operator=(const ChunkScrubber&) = delete;

  // Checks the chunk files of `version` (the writer's last WriteVersion,
  // which succeeded) that this scrubber does not know to be good, and
  // rewrites the bad ones from `source` (the bytes WriteVersion was given).
  // *findings gets every bad file. Ok when every file is good or repaired;
  // the first repair error otherwise (naming the file and the chunk);
  // kUnavailable when cancelled or stopped (nothing is repaired then).
  Status Scrub(uint64_t version, const std::vector<const Manifest*>& manifests, const ChunkSource& source,
               std::vector<ScrubFinding>* findings);

  // Makes a running and every later Scrub stop soon (a rate-limit wait
  // included), until Resume.
  void Stop();
  void Resume() { stop_ = false; }
  ScrubProgress Progress() const;

 private:
  using HashSet = std::unordered_set<ChunkHash, ChunkHashHasher>;
  struct Target {
    ChunkRef ref;
    std::string which;
  };
  // The chunks of `manifests` not known good, once each; the known good in *good.
  std::vector<Target> Unchecked(uint64_t version, const std::vector<const Manifest*>& manifests, HashSet* good) const;
  // Reads back `todo`; good files go to *good, bad ones to *bad.
  Status CheckFiles(const std::vector<Target>& todo, HashSet* good, std::vector<ScrubFinding>* bad);
  Status CheckOne(const Target& t, std::mutex* mu, HashSet* good, std::vector<ScrubFinding>* bad);
  // Rewrites each of `bad` from RAM; the repaired go to *good.
  Status Repair(const ChunkSource& source, std::vector<ScrubFinding>* bad, HashSet* good);
  Status Stopped() const;  // kUnavailable once cancelled or stopped
  void Count(uint64_t ScrubProgress::*field, uint64_t n);

  PersistWriter* const writer_;  // Constant after construction
  const PersistReader reader_;
  uint64_t version_ = 0;  // the version being scrubbed, for messages
  HashSet verified_;      // Used by the Scrub thread only: the chunks known good
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  ScrubProgress progress_;  // Guarded by mu_
};

}  // namespace ftrun
