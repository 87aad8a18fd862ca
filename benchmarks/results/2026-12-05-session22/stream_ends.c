// one-row "GEMV" streams: N buffers of B bytes each, read as panels of 36 KiB, NP panels side by side, split over
// the threads per buffer (a barrier per buffer, as one call per weight), or the whole as one buffer.
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define PB (36864)
static float stream_panels(const char* w, long p0, long p1, int np, int pf_next, const char* next) {
  __m512 acc = _mm512_setzero_ps();
  for (long p = p0; p < p1; p += np) {
    int n = (int)((p + np <= p1) ? np : p1 - p);
    for (long off = 0; off < PB; off += 64) {
      for (int j = 0; j < n; ++j) acc = _mm512_add_ps(acc, _mm512_castsi512_ps(_mm512_load_si512((const void*)(w + (p + j) * PB + off))));
      if (pf_next && next && p + np >= p1 && off >= PB - pf_next * 64) {
        long k = off - (PB - pf_next * 64);
        for (int j = 0; j < np; ++j) _mm_prefetch(next + j * PB + k, _MM_HINT_T0);
      }
    }
  }
  return _mm512_reduce_add_ps(acc);
}
int main(int argc, char** argv) {
  long total = 210l << 20; long B = atol(argv[1]) << 10; int np = atoi(argv[2]); int pf = argc > 3 ? atoi(argv[3]) : 0;
  long P = B / PB; long N = total / (P * PB); long PT = N * P;
  char* w = aligned_alloc(2 << 20, PT * PB + (2 << 20));
  madvise(w, PT * PB, 14 /*MADV_HUGEPAGE*/);
  memset(w, 1, PT * PB);
  double best = 1e9, bestbig = 1e9; float acc = 0;
  for (int r = 0; r < 8; ++r) {
    double t0 = now();
    if (getenv("FORK")) {
      for (long i = 0; i < N; ++i) {
        #pragma omp parallel reduction(+:acc)
        {
          int t = omp_get_thread_num(), T = omp_get_num_threads();
          long p0 = P * t / T, p1 = P * (t + 1) / T;
          acc += stream_panels(w + i * P * PB, p0, p1, np, 0, NULL);
        }
      }
    } else {
    #pragma omp parallel reduction(+:acc)
    {
      int t = omp_get_thread_num(), T = omp_get_num_threads();
      for (long i = 0; i < N; ++i) {
        long p0 = P * t / T, p1 = P * (t + 1) / T;
        const char* next = i + 1 < N ? w + (i + 1) * P * PB + (P * t / T) * PB : NULL;
        acc += stream_panels(w + i * P * PB, p0, p1, np, pf, next);
        #pragma omp barrier
      }
    }
    }
    double t1 = now();
    #pragma omp parallel reduction(+:acc)
    {
      int t = omp_get_thread_num(), T = omp_get_num_threads();
      acc += stream_panels(w, PT * t / T, PT * (t + 1) / T, np, 0, NULL);
    }
    double t2 = now();
    if (t1 - t0 < best) best = t1 - t0;
    if (t2 - t1 < bestbig) bestbig = t2 - t1;
  }
  printf("B %ld KiB x %ld, NP %d, pf %d: per-buffer %.2f ms (%.1f GB/s), one stream %.2f ms (%.1f GB/s): %.1f us lost per buffer %g\n",
         B >> 10, N, np, pf, best * 1e3, PT * PB / best / 1e9, bestbig * 1e3, PT * PB / bestbig / 1e9, (best - bestbig) / N * 1e6, acc);
}
