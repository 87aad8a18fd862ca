// g++ -O3 -march=sapphirerapids -fno-tree-vectorize silu_table.cpp: SiLU read from a 2^16-entry bf16 table by
// one gather (mode 0; placeholder table values, the timing is the point) and the same in scalar code (mode 1)

#include <immintrin.h>
#include <cstdio>
#include <cstdint>
#include <chrono>
#include <vector>
#include <cstring>
static inline __m512i rb(__m512 x){__m512i b=_mm512_castps_si512(x);__m512i l=_mm512_and_si512(_mm512_srli_epi32(b,16),_mm512_set1_epi32(1));
 __m512i r=_mm512_add_epi32(b,_mm512_add_epi32(l,_mm512_set1_epi32(0x7FFF)));r=_mm512_and_si512(r,_mm512_set1_epi32((int)0xFFFF0000u));
 __mmask16 nan=_mm512_cmp_ps_mask(x,x,_CMP_UNORD_Q);return _mm512_mask_blend_epi32(nan,r,_mm512_set1_epi32(0x7FC00000));}
static inline __m512 ld(const uint16_t*p){return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)),16));}
alignas(64) static uint16_t tab[65536+32];
void silu_t(const uint16_t*g,const uint16_t*u,uint16_t*y,int n){
 for(int c=0;c<n;c+=16){__m512i gi=_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(g+c)));
  __m512i sv=_mm512_i32gather_epi32(gi,(const void*)tab,2);
  __m512 s=_mm512_castsi512_ps(_mm512_slli_epi32(sv,16));
  __m512 o=_mm512_mul_ps(s,ld(u+c));
  _mm256_storeu_si256((__m256i*)(y+c),_mm512_cvtepi32_epi16(_mm512_srli_epi32(rb(o),16)));}}
void silu_s(const uint16_t*g,const uint16_t*u,uint16_t*y,int n){
 for(int c=0;c<n;c++){uint32_t b=(uint32_t)tab[g[c]]<<16; float s; memcpy(&s,&b,4); uint32_t ub=(uint32_t)u[c]<<16; float uf; memcpy(&uf,&ub,4);
  float o=s*uf; uint32_t ob; memcpy(&ob,&o,4); y[c]=(uint16_t)((ob+0x7FFF+((ob>>16)&1))>>16);}}
int main(){int N=240*1536;std::vector<uint16_t>g(N),u(N),y(N);
 for(int i=0;i<65536;i++) tab[i]=(uint16_t)(i*7);
 for(int i=0;i<N;i++){float f=((i*2654435761u)%1000)/100.f-5; uint32_t b;memcpy(&b,&f,4);g[i]=b>>16;u[i]=(b>>16)^1;}
 for(int m=0;m<2;m++) for(int rep=0;rep<3;rep++){auto t0=std::chrono::steady_clock::now();
  for(int k=0;k<200;k++){ if(m==0) silu_t(g.data(),u.data(),y.data(),N); else silu_s(g.data(),u.data(),y.data(),N);}
  double us=std::chrono::duration<double,std::micro>(std::chrono::steady_clock::now()-t0).count()/200;
  printf("mode %d %.1f us %.2f ns/elt\n",m,us,us*1e3/N);}}
