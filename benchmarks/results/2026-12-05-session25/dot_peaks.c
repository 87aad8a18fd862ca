#include <immintrin.h>
#include <stdio.h>
#include <omp.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define NA 12
#define BODY(OP) \
  double t0=now(); float sink=0; \
  _Pragma("omp parallel num_threads(NT) reduction(+:sink)") { \
    __m512 acc[NA]; __m512i a=_mm512_set1_epi32(0x3f803f80+omp_get_thread_num()), b=_mm512_set1_epi32(0x3f803f81); \
    __m512 fa=_mm512_castsi512_ps(a), fb=_mm512_castsi512_ps(b); \
    for(int i=0;i<NA;i++) acc[i]=_mm512_setzero_ps(); \
    for(long it=0;it<iters;it++){ \
      _Pragma("GCC unroll 12") for(int i=0;i<NA;i++) acc[i]=OP; \
      __asm__ volatile("" : "+v"(a), "+v"(b), "+v"(fa), "+v"(fb)); } \
    for(int i=0;i<NA;i++) sink+=_mm512_reduce_add_ps(acc[i]); } \
  double t=now()-t0; return 1.0*NT*iters*NA/t/1e9;
long iters=20000000;
int NT=2;
double bf(){BODY(_mm512_dpbf16_ps(acc[i],(__m512bh)a,(__m512bh)b))}
double fm(){BODY(_mm512_fmadd_ps(fa,fb,acc[i]))}
double vn(){BODY((__m512)_mm512_dpbusd_epi32((__m512i)acc[i],a,b))}
int main(){
  for(NT=1;NT<=2;NT++){
  double x=bf(), y=fm(), z=vn();
  printf("threads %d: vdpbf16ps %.2f Gi/s = %.1f GMAC/s; fma %.2f Gi/s = %.1f GMAC/s; vpdpbusd %.2f Gi/s = %.1f GMAC/s\n", NT, x, x*32, y, y*16, z, z*64);
  }
}
