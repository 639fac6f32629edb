// The persist directory's layout and file formats. All integers are little
// endian (ByteWriter); every file carries a magic, a format version and a
// checksum, so a reader can tell a torn, foreign or corrupted file from a
// good one and say which it is.
//
//   <dir>/<job_id>/chunks/<hh>/<hash>       one chunk, content-addressed;
//                                           <hh> = first 2 of 32 hex digits
//   <dir>/<job_id>/v<version, 20 digits>/
//       rank<r>.manifest                     one rank's manifest
//       node<n>.COMPLETE                     node n's marker, written last
//   *.n<node>.tmp                            a file being written by node n;
//                                            renamed to its name when synced
//   chunks/<hh>/<hash>.gc                    a chunk retention set aside as
//                                            dead; deleted, or renamed back if
//                                            a writer named it (retention.h)
//
// Chunk file: a kChunkHeaderSize header (magic "FTRCHUNK", format version,
// header size, hash, length, zero padding, and last a checksum of the
// header), then the bytes.
// The padding puts the bytes on a block boundary, so they can be read with
// O_DIRECT straight into an aligned destination.
//
// Manifest file: magic "FTRMANIF", format version, job id, world size, rank,
// version, EncodeManifest bytes (chunk offsets cleared: they are arena
// offsets, meaningless on disk), then XXH3-128 of everything before it.
//
// Node marker: magic "FTRCMPLT", format version (kMarkerFormatVersion), job
// id, world size, version, node, epoch (the timeline: the coordinator epoch
// the version was committed in), the ranks it covers with each manifest
// file's size and XXH3-128, then XXH3-128 of everything before it. A version
// is complete when the markers in its directory agree (job, world size and
// epoch) and cover every rank 0..world_size-1, each with a manifest file that
// matches the marker's checksum.
//
// Markers of format version 1 (before epochs) are still read, as epoch-less
// (has_epoch false). That is safe because completeness requires every marker
// of a version to agree on the epoch, and an epoch-less marker agrees only
// with other epoch-less ones (version_scan.cc): a version written wholly by
// an older build reads as it always did (refusing it would throw away every
// checkpoint at an upgrade), and a marker this build writes can never
// complete a version together with one written before it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ftrun/status.h"
#include "plugin/common/hash.h"
#include "plugin/store/manifest.h"

namespace ftrun {

inline constexpr uint32_t kPersistFormatVersion = 1;  // chunks and manifests
inline constexpr uint32_t kMarkerFormatVersion = 2;   // node markers: 2 added the epoch
inline constexpr size_t kChunkHeaderSize = 4096;

// Paths. `job_dir` is <dir>/<job_id>.
std::string PersistJobDir(const std::string& dir, const std::string& job_id);
std::string ChunksDir(const std::string& job_dir);
std::string ChunkSubdir(const std::string& job_dir, const ChunkHash& hash);
std::string ChunkPath(const std::string& job_dir, const ChunkHash& hash);
std::string VersionDir(const std::string& job_dir, uint64_t version);
std::string VersionDirName(uint64_t version);            // "v00000000000000000012"
std::string ManifestFileName(int rank);                  // "rank3.manifest"
std::string NodeMarkerName(int node);                    // "node0.COMPLETE"
std::string TmpName(const std::string& path, int node);  // path + ".n<node>.tmp"
std::string GcName(const std::string& chunk_path);       // path + ".gc": set aside by retention

// Name parsers: false for anything else (tmp files, strays).
bool ParseVersionDirName(const std::string& name, uint64_t* version);
bool ParseManifestFileName(const std::string& name, int* rank);
bool ParseNodeMarkerName(const std::string& name, int* node);
bool ParseChunkFileName(const std::string& name, ChunkHash* hash);
bool IsTmpName(const std::string& name, int* node);
bool ParseGcChunkFileName(const std::string& name, ChunkHash* hash);  // "<hash>.gc"

// Chunk header. Decode checks magic, format version and checksum; `path`
// names the file in errors (kCorruption).
void EncodeChunkHeader(const ChunkHash& hash, uint64_t length, char out[kChunkHeaderSize]);
Status DecodeChunkHeader(const char* data, size_t n, const std::string& path, ChunkHash* hash, uint64_t* length);

// The checksum of a manifest file as a marker records it.
ChunkHash FileChecksum(const std::string& bytes);

struct ManifestFile {
  std::string job_id;
  int32_t world_size = 0;
  Manifest manifest;  // its rank and version are the file's
};
std::string EncodeManifestFile(const std::string& job_id, int world_size, const Manifest& m);
Status DecodeManifestFile(const std::string& bytes, const std::string& path, ManifestFile* out);

struct NodeMarker {
  struct Rank {
    int32_t rank = 0;
    uint64_t manifest_size = 0;
    ChunkHash manifest_checksum;
  };
  std::string job_id;
  int32_t world_size = 0;
  uint64_t version = 0;
  int32_t node = 0;
  std::vector<Rank> ranks;
  uint64_t epoch = 0;     // the version's timeline
  bool has_epoch = true;  // false: a format 1 marker, written before epochs
};
// "epoch 3", or "no epoch (format 1)": for messages.
std::string MarkerEpochString(const NodeMarker& m);
std::string EncodeNodeMarker(const NodeMarker& m);
Status DecodeNodeMarker(const std::string& bytes, const std::string& path, NodeMarker* out);

}  // namespace ftrun
