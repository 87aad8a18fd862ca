// Arithmetic shared by the CPU kernels (dflash_ops.cpp) and the CUDA kernels (dflash_ops_cuda.cu).
// No torch and no CUDA runtime headers: this file compiles with a plain C++ compiler and with plain nvcc.
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define DFLASH_HD __host__ __device__ __forceinline__
#else
#define DFLASH_HD inline
#endif

namespace dflash {

constexpr int64_t kPad = -1;  // padding value of every index output

// Philox-4x32-10 (Salmon et al. 2011), exactly as dflash_trt.sampling.philox4x32.
DFLASH_HD void philox4x32_10(uint32_t c[4], uint32_t k0, uint32_t k1) {
  const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = (uint64_t)M0 * c[0], p1 = (uint64_t)M1 * c[2];
    const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    const uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
    k0 += W0; k1 += W1;
  }
}

// The float64 uniform in [0, 1) of (seed, absolute position): key = seed as (low, high) 32 bits,
// counter = (position low 32, position high 32, 0, 0), 53 bits = word0 << 21 | word1 >> 11.
DFLASH_HD double philox_uniform(int64_t seed, int64_t position) {
  const uint64_t s = (uint64_t)seed, p = (uint64_t)position;
  uint32_t c[4] = {(uint32_t)p, (uint32_t)(p >> 32), 0u, 0u};
  philox4x32_10(c, (uint32_t)s, (uint32_t)(s >> 32));
  const uint64_t bits53 = ((uint64_t)c[0] << 21) | ((uint64_t)c[1] >> 11);
  return (double)bits53 * (1.0 / 9007199254740992.0);  // 2^-53, exact
}

}  // namespace dflash
