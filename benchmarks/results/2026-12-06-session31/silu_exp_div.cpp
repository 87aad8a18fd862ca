// g++ -O3 -march=sapphirerapids silu_exp_div.cpp: the bf16 SiLU*up loop as the AVX-512 pass ran it (mode 0)
// and without its divide (mode 1), ns per element

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
static inline __m512 vexp(__m512 x){
 x=_mm512_min_ps(_mm512_max_ps(x,_mm512_set1_ps(-87.3f)),_mm512_set1_ps(88.7f));
 const __m512 magic=_mm512_set1_ps(12582912.0f);
 __m512 fx=_mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x,_mm512_set1_ps(1.44269504088896341f)),magic),magic);
 __m512 r=_mm512_fmadd_ps(fx,_mm512_set1_ps(-0.693359375f),x); r=_mm512_fmadd_ps(fx,_mm512_set1_ps(2.12194440e-4f),r);
 __m512 p=_mm512_set1_ps(1.9875691500e-4f);
 p=_mm512_fmadd_ps(p,r,_mm512_set1_ps(1.3981999507e-3f));p=_mm512_fmadd_ps(p,r,_mm512_set1_ps(8.3334519073e-3f));
 p=_mm512_fmadd_ps(p,r,_mm512_set1_ps(4.1665795894e-2f));p=_mm512_fmadd_ps(p,r,_mm512_set1_ps(1.6666665459e-1f));
 p=_mm512_fmadd_ps(p,r,_mm512_set1_ps(5.0000001201e-1f));p=_mm512_fmadd_ps(p,_mm512_mul_ps(r,r),r);p=_mm512_add_ps(p,_mm512_set1_ps(1.0f));
 __m512i n=_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx),_mm512_set1_epi32(127)),23);
 return _mm512_mul_ps(p,_mm512_castsi512_ps(n));}
template<int MODE> void silu(const uint16_t*g,const uint16_t*u,uint16_t*y,int n){
 const __m512 one=_mm512_set1_ps(1.f);
 for(int c=0;c<n;c+=16){__m512 G=ld(g+c),U=ld(u+c);
  __m512 d=_mm512_add_ps(one,vexp(_mm512_sub_ps(_mm512_setzero_ps(),G)));
  __m512 s = MODE==1? _mm512_mul_ps(G,d) : _mm512_div_ps(G,d);
  s=_mm512_castsi512_ps(rb(s));
  __m512 o=_mm512_mul_ps(s,U);
  _mm256_storeu_si256((__m256i*)(y+c),_mm512_cvtepi32_epi16(_mm512_srli_epi32(rb(o),16)));}}
int main(){int N=240*1536;std::vector<uint16_t>g(N),u(N),y(N);
 for(int i=0;i<N;i++){float f=((i*2654435761u)%1000)/100.f-5; uint32_t b;memcpy(&b,&f,4);g[i]=b>>16;u[i]=(b>>16)^1;}
 for(int m=0;m<2;m++) for(int rep=0;rep<3;rep++){auto t0=std::chrono::steady_clock::now();
  for(int k=0;k<200;k++){ if(m==0) silu<0>(g.data(),u.data(),y.data(),N); else silu<1>(g.data(),u.data(),y.data(),N);}
  double us=std::chrono::duration<double,std::micro>(std::chrono::steady_clock::now()-t0).count()/200;
  printf("mode %d %.1f us %.2f ns/elt\n",m,us,us*1e3/N);}}
