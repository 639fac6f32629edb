// Chunk fingerprints on the GPU: for every chunk of a device buffer, a
// 128-bit value that changes when any byte of the chunk changes (not a
// cryptographic hash; it only decides which chunks to copy, and the copied
// bytes get their XXH3-128 id on the host).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ftrun {

// XORs each chunk's fingerprint into out[2*k], out[2*k+1] (k = chunk index;
// out must be zeroed first) for the ceil(nbytes / chunk_size) chunks of
// data, on `stream`. data may have any alignment.
cudaError_t LaunchChunkFingerprints(const void* data, uint64_t nbytes, uint64_t chunk_size, unsigned long long* out,
                                    cudaStream_t stream);

}  // namespace ftrun
