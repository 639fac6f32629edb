// The fingerprint kernel (see fingerprint_kernel.h).
#include <algorithm>
#include <cstdint>

#include "plugin/client/fingerprint_kernel.h"

namespace ftrun {
namespace {

// One fingerprint slice: 256 threads x 8 words of 16 bytes = 32 KiB. A chunk
// is split into many slices so even a single 4 MiB chunk fills the GPU.
constexpr int kThreads = 256;
constexpr int kWordsPerThread = 8;
constexpr unsigned long long kSliceWords = kThreads * kWordsPerThread;
constexpr unsigned long long kMaxBlocks = 1u << 16;  // grid-stride beyond this

__device__ __forceinline__ unsigned long long Fmix64(unsigned long long k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}

// Little-endian either way, so a chunk fingerprints the same at any alignment.
// Bytes past `avail` (the chunk's tail) read as zero.
__device__ __forceinline__ void LoadWord(const unsigned char* p, unsigned long long avail, bool aligned,
                                         unsigned long long* a, unsigned long long* b) {
  if (aligned && avail >= 16) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    *a = v.x | (static_cast<unsigned long long>(v.y) << 32);
    *b = v.z | (static_cast<unsigned long long>(v.w) << 32);
    return;
  }
  unsigned long long lo = 0, hi = 0;
  for (int i = 0; i < 16; ++i) {
    const unsigned long long byte = static_cast<unsigned long long>(i) < avail ? p[i] : 0;
    (i < 8 ? lo : hi) |= byte << (8 * (i & 7));
  }
  *a = lo;
  *b = hi;
}

// A chunk's fingerprint is the XOR over its words of two 64-bit mixes of
// (word, index). XOR lets slices combine in any order (atomicXor) and the
// index in every mix makes moved or swapped words count as changes.
__global__ void __launch_bounds__(kThreads)
    FingerprintKernel(const unsigned char* data, unsigned long long nbytes, unsigned long long chunk_size,
                      unsigned long long slices_per_chunk, unsigned long long total_slices, unsigned long long* out) {
  for (unsigned long long s = blockIdx.x; s < total_slices; s += gridDim.x) {
    const unsigned long long chunk = s / slices_per_chunk;
    const unsigned long long slice = s % slices_per_chunk;
    const unsigned char* base = data + chunk * chunk_size;
    const unsigned long long rest = nbytes - chunk * chunk_size;
    const unsigned long long len = rest < chunk_size ? rest : chunk_size;
    const unsigned long long words = (len + 15) / 16;
    // A TensorRef may point into the middle of a buffer: no vector loads then.
    const bool aligned = (reinterpret_cast<uintptr_t>(base) & 15) == 0;
    // All loads first: keeps 8 of them in flight per thread.
    unsigned long long a[kWordsPerThread], b[kWordsPerThread];
#pragma unroll
    for (int i = 0; i < kWordsPerThread; ++i) {
      const unsigned long long w = slice * kSliceWords + static_cast<unsigned long long>(i) * kThreads + threadIdx.x;
      a[i] = b[i] = 0;
      if (w < words) LoadWord(base + w * 16, len - w * 16, aligned, &a[i], &b[i]);
    }
    unsigned long long l0 = 0, l1 = 0;
#pragma unroll
    for (int i = 0; i < kWordsPerThread; ++i) {
      const unsigned long long w = slice * kSliceWords + static_cast<unsigned long long>(i) * kThreads + threadIdx.x;
      if (w >= words) continue;
      const unsigned long long p = w * 0x9e3779b97f4a7c15ull;  // odd: distinct per index
      const unsigned long long x = Fmix64(a[i] ^ p ^ 0x243f6a8885a308d3ull);
      const unsigned long long y = Fmix64(b[i] ^ (p + 0x13198a2e03707344ull));
      l0 ^= Fmix64(x + y);
      l1 ^= Fmix64(x ^ ((y << 29) | (y >> 35)) ^ 0xa4093822299f31d0ull);
    }
    for (int off = 16; off > 0; off >>= 1) {
      l0 ^= __shfl_xor_sync(0xffffffffu, l0, off);
      l1 ^= __shfl_xor_sync(0xffffffffu, l1, off);
    }
    if ((threadIdx.x & 31) == 0 && (l0 | l1) != 0) {
      atomicXor(&out[2 * chunk], l0);
      atomicXor(&out[2 * chunk + 1], l1);
    }
  }
}

}  // namespace

cudaError_t LaunchChunkFingerprints(const void* data, uint64_t nbytes, uint64_t chunk_size, unsigned long long* out,
                                    cudaStream_t stream) {
  if (nbytes == 0) return cudaSuccess;
  const unsigned long long slices_per_chunk = ((chunk_size + 15) / 16 + kSliceWords - 1) / kSliceWords;
  const unsigned long long slices = (nbytes + chunk_size - 1) / chunk_size * slices_per_chunk;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(std::min(slices, kMaxBlocks)));
  cfg.blockDim = dim3(kThreads);
  cfg.stream = stream;
  return cudaLaunchKernelEx(&cfg, FingerprintKernel, static_cast<const unsigned char*>(data),
                            static_cast<unsigned long long>(nbytes), static_cast<unsigned long long>(chunk_size),
                            slices_per_chunk, slices, out);
}

}  // namespace ftrun
