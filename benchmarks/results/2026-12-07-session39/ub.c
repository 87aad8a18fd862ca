#include <stdio.h>
#include <immintrin.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define N 100000000L
int main(){
  __m512 a0=_mm512_setzero_ps(),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0,a8=a0,a9=a0;
  __m512i x=_mm512_set1_epi32(0x3f803f80), y=_mm512_set1_epi32(0x3f803f80);
  double t=now();
  for(long i=0;i<N/10;i++){
#define D(a) asm volatile("vdpbf16ps %2,%1,%0":"+v"(a):"v"(x),"v"(y));
    D(a0)D(a1)D(a2)D(a3)D(a4)D(a5)D(a6)D(a7)D(a8)D(a9)
  }
  double dt=now()-t; printf("vdpbf16ps zmm: %.2f Ginstr/s\n", N/dt*1e-9);
  __m512i b0=_mm512_setzero_si512(),b1=b0,b2=b0,b3=b0,b4=b0,b5=b0,b6=b0,b7=b0,b8=b0,b9=b0;
  t=now();
  for(long i=0;i<N/10;i++){
#define E(a) asm volatile("vpdpbusd %2,%1,%0":"+v"(a):"v"(x),"v"(y));
    E(b0)E(b1)E(b2)E(b3)E(b4)E(b5)E(b6)E(b7)E(b8)E(b9)
  }
  dt=now()-t; printf("vpdpbusd zmm: %.2f Ginstr/s\n", N/dt*1e-9);
  t=now();
  for(long i=0;i<N/10;i++){
#define F(a) asm volatile("vfmadd231ps %2,%1,%0":"+v"(a):"v"(x),"v"(y));
    F(a0)F(a1)F(a2)F(a3)F(a4)F(a5)F(a6)F(a7)F(a8)F(a9)
  }
  dt=now()-t; printf("vfmadd231ps zmm: %.2f Ginstr/s\n", N/dt*1e-9);
  float s[16]; _mm512_storeu_ps(s,_mm512_add_ps(a0,_mm512_castsi512_ps(b0))); return (int)s[0]&1;
}
