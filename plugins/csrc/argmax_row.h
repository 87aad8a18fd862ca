// torch.argmax of one row of fp32 or bf16 values with AVX-512, for the CPU extensions (dflash_ops.cpp's verify,
// invariant.cpp's head op): the first index of the row's maximum, or -1 when the row holds a NaN (torch's argmax
// takes the first NaN; the callers decide those rows). One max pass and one compare pass over 16 lanes, where
// torch's argmax carries an index beside every lane's maximum: a vocabulary-wide row per verify row, every step.
// The caller checks the CPU: AVX-512 F, BW and VL.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <stdint.h>

#include <limits>

namespace dflash {

template <bool BF>
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512 argmax_load(const void* x, int64_t i, int n) {
  const __mmask16 m = (__mmask16)(n >= 16 ? 0xFFFFu : (1u << n) - 1u);
  const __m512 lowest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  if (BF) {  // lanes past n hold -inf, as the fp32 masked load leaves them
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t*)x + i));
    return _mm512_mask_blend_ps(m, lowest, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
  }
  return _mm512_mask_loadu_ps(lowest, m, (const float*)x + i);
}

template <bool BF>
__attribute__((target("avx512f,avx512bw,avx512vl"))) int64_t argmax_row_avx512(const void* x, int64_t n) {
  __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 nan = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = argmax_load<BF>(x, i, (int)(n - i < 16 ? n - i : 16));
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    vmax = _mm512_max_ps(vmax, v);
  }
  if (nan) return -1;
  const __m512 b = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));  // -0.0 and 0.0 compare equal below, as ties
  for (int64_t i = 0; i < n; i += 16) {
    const int k = (int)(n - i < 16 ? n - i : 16);
    const __mmask16 eq = _mm512_cmp_ps_mask(argmax_load<BF>(x, i, k), b, _CMP_EQ_OQ) &
                         (__mmask16)(k >= 16 ? 0xFFFFu : (1u << k) - 1u);
    if (eq) return i + __builtin_ctz((unsigned)eq);
  }
  return -1;
}

}  // namespace dflash
#endif
