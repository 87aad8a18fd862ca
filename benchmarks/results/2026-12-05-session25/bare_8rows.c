#include <immintrin.h>
#include <stdint.h>
#include <omp.h>
// 8 rows x one k-pair panel [Q][32] u32 at a time, panels split in two halves over two threads, as the library
// splits them; x pairs k-major [Q][8]; out: per panel 8 x 32 floats
static inline __attribute__((always_inline)) void seg8(const uint32_t* xh, const uint32_t* w, long Q, float* out){
  __m512 a[8], b[8];
  for (int m=0;m<8;m++) a[m]=b[m]=_mm512_setzero_ps();
  #pragma GCC unroll 2
  for(long q=0;q<Q;q++){
    __m512bh w0=(__m512bh)_mm512_loadu_si512(w+q*32), w1=(__m512bh)_mm512_loadu_si512(w+q*32+16);
    _mm_prefetch((const char*)(w+(q+32)*32), _MM_HINT_T0); _mm_prefetch((const char*)(w+(q+32)*32+16), _MM_HINT_T0);
    _mm_prefetch((const char*)(w+(q+256)*32), _MM_HINT_T1); _mm_prefetch((const char*)(w+(q+256)*32+16), _MM_HINT_T1);
    const uint32_t* x=xh+q*8;
    for (int m=0;m<8;m++){ __m512bh xb=(__m512bh)_mm512_set1_epi32(x[m]); a[m]=_mm512_dpbf16_ps(a[m],xb,w0); b[m]=_mm512_dpbf16_ps(b[m],xb,w1); }
  }
  for (int m=0;m<8;m++){ _mm512_storeu_ps(out+m*32, a[m]); _mm512_storeu_ps(out+m*32+16, b[m]); }
}
void run8(const uint32_t* w, long P, long Q, const uint32_t* xh, float* out, int nt){
  #pragma omp parallel num_threads(nt)
  {
    int me=omp_get_thread_num(), k=omp_get_num_threads(); long p0=me*P/k, p1=(me+1)*P/k;
    for (long p=p0;p<p1;p++) seg8(xh, w+p*Q*32, Q, out+p*256);
  }
}
