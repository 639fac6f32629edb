// `ftrun export`: writes one committed version from a persist directory as
// standard safetensors files, one per rank, plus an index, without any agent:
//
//   ftrun export --persist-dir DIR --job JOB [--version V] [--world-size N]
//                --out OUTDIR [--ranks 0,1]
//
// OUTDIR/rank<r>.safetensors: an 8-byte little-endian header length, a JSON
// header {"__metadata__": {...}, "<tensor name>": {"dtype": "F32", "shape":
// [...], "data_offsets": [begin, end]}, ...} padded with spaces to a multiple
// of 8 bytes, then the tensors' bytes back to back in the manifest's order.
// Names, dtypes and shapes are the ones the rank saved (ftrun dtypes map 1:1:
// uint8 U8, int8 I8, ..., bfloat16 BF16, float32 F32, bool BOOL). The rank's
// user bytes (ftrun.save's pickled structure, or a C++ rank's opaque bytes)
// are the U8 tensor "__ftrun_user_bytes__" of shape [n], last in the file;
// __metadata__ names it ("ftrun.user_bytes") and holds ftrun.job,
// ftrun.version, ftrun.rank, ftrun.world_size and "format": "pt".
// OUTDIR/index.json: {"format": "ftrun.export", "job", "version",
// "world_size", "user_bytes_tensor", "ranks": [{"rank", "file", "bytes",
// "user_bytes", "tensors": [{"name", "dtype" (ftrun's name), "shape",
// "device" (saved from)}]}]}; written last, so an OUTDIR with index.json is a
// finished export.
//
// Every chunk is read through PersistReader::ReadChunk (hash-checked); every
// file is written as <name>.tmp, synced, then renamed. On any failure the
// files written so far are removed (and OUTDIR, if this command created it);
// an export killed midway leaves no index.json (and maybe a *.tmp file).
// On a terminal (stderr a tty) a progress line shows bytes done, rate and
// time left, rewritten a few times a second; otherwise one final line.
#pragma once

namespace ftrun {

// argv[0] is "export". Exit codes: 0 exported; 1 the export failed (a chunk
// missing or corrupt on disk, a write error), naming the file; 2 bad
// arguments: no such persist dir, job or version, a version not complete, a
// world size or rank that does not fit, an out dir that is not empty.
int RunExportCommand(int argc, char** argv);

}  // namespace ftrun
