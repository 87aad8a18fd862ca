#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <immintrin.h>
static uint32_t rng=12345; static uint32_t r32(){rng^=rng<<13;rng^=rng>>17;rng^=rng<<5;return rng;}
static float u2f(uint32_t u){float f;memcpy(&f,&u,4);return f;}
static uint16_t rbf(){ // random bf16 with wide exponent range incl denormals/zeros
  uint32_t s=r32()&1, m=r32()&0x7f, e; uint32_t c=r32()%8;
  if(c==0) e=0; else if(c<3) e=r32()%20; else if(c<5) e=60+r32()%20; else e=100+r32()%50;
  return (uint16_t)((s<<15)|(e<<7)|m);
}
int main(int argc,char**argv){
  int daz=atoi(argv[1]); long bad=0, tot=0;
  unsigned csr=_mm_getcsr(); if(daz) _mm_setcsr(csr|0x8040);
  for(int it=0; it<200000; it++){
    uint32_t a[16],b[16]; float c[16];
    for(int i=0;i<16;i++){a[i]=rbf()|((uint32_t)rbf()<<16); b[i]=rbf()|((uint32_t)rbf()<<16);
      uint32_t cu = r32(); uint32_t e=(r32()%4==0)? (r32()%3) : (r32()%40+60); cu=(cu&0x807fffff)|(e<<23); c[i]=u2f(cu);}
    __m512 acc=_mm512_loadu_ps(c);
    __m512 r1=_mm512_dpbf16_ps(acc,(__m512bh)_mm512_loadu_si512(a),(__m512bh)_mm512_loadu_si512(b));
    __m512i A=_mm512_loadu_si512(a), B=_mm512_loadu_si512(b), hm=_mm512_set1_epi32(0xFFFF0000);
    __m512 ao=_mm512_castsi512_ps(_mm512_and_si512(A,hm)), ae=_mm512_castsi512_ps(_mm512_slli_epi32(A,16));
    __m512 bo=_mm512_castsi512_ps(_mm512_and_si512(B,hm)), be=_mm512_castsi512_ps(_mm512_slli_epi32(B,16));
    __m512 r2=_mm512_fmadd_ps(ae,be,_mm512_fmadd_ps(ao,bo,acc));
    uint32_t x1[16],x2[16]; _mm512_storeu_si512(x1,_mm512_castps_si512(r1)); _mm512_storeu_si512(x2,_mm512_castps_si512(r2));
    for(int i=0;i<16;i++){tot++; if(x1[i]!=x2[i]){ if(bad<3) printf("diff %08x %08x c=%08x a=%08x b=%08x\n",x1[i],x2[i],*(uint32_t*)&c[i],a[i],b[i]); bad++;}}
  }
  _mm_setcsr(csr);
  printf("daz/ftz %d: %ld of %ld differ\n", daz, bad, tot);
}
