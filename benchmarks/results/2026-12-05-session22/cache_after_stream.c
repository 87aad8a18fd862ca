#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define WB (256ul<<20)
typedef struct node { struct node* next; char pad[56]; } node;
float stream_plain(const float* w, size_t n){ __m512 a=_mm512_setzero_ps(),b=a; for(size_t i=0;i<n;i+=32){a=_mm512_add_ps(a,_mm512_loadu_ps(w+i));b=_mm512_add_ps(b,_mm512_loadu_ps(w+i+16));} return _mm512_reduce_add_ps(_mm512_add_ps(a,b)); }
float stream_nta(const float* w, size_t n, int dist){ __m512 a=_mm512_setzero_ps(),b=a; for(size_t i=0;i<n;i+=32){ _mm_prefetch((const char*)(w+i+dist),_MM_HINT_NTA); _mm_prefetch((const char*)(w+i+dist+16),_MM_HINT_NTA); a=_mm512_add_ps(a,_mm512_loadu_ps(w+i));b=_mm512_add_ps(b,_mm512_loadu_ps(w+i+16));} return _mm512_reduce_add_ps(_mm512_add_ps(a,b)); }
float stream_flush(const float* w, size_t n, int behind){ __m512 a=_mm512_setzero_ps(),b=a; for(size_t i=0;i<n;i+=32){ a=_mm512_add_ps(a,_mm512_loadu_ps(w+i));b=_mm512_add_ps(b,_mm512_loadu_ps(w+i+16)); if(i>=(size_t)behind){_mm_clflushopt((void*)(w+i-behind)); _mm_clflushopt((void*)(w+i-behind+16));}} return _mm512_reduce_add_ps(_mm512_add_ps(a,b)); }
int main(int argc,char**argv){
  size_t S = (size_t)atoi(argv[1])<<20; int mode=atoi(argv[2]); int dist=argc>3?atoi(argv[3]):512;
  float* w = aligned_alloc(64, WB); for(size_t i=0;i<WB/4;i++) w[i]=(float)(i&1023);
  size_t nn = S/64; node* nodes = aligned_alloc(64, nn*64); size_t* perm=malloc(nn*8);
  for(size_t i=0;i<nn;i++)perm[i]=i; srand(1); for(size_t i=nn-1;i>0;i--){size_t j=rand()%(i+1);size_t t=perm[i];perm[i]=perm[j];perm[j]=t;}
  for(size_t i=0;i<nn;i++) nodes[perm[i]].next=&nodes[perm[(i+1)%nn]];
  double ts=0, tc=0; float acc=0; node* p=&nodes[perm[0]];
  for(int r=0;r<12;r++){
    double t0=now(); acc += mode==3? stream_flush(w, WB/4, dist) : mode==2? 0 : mode? stream_nta(w, WB/4, dist): stream_plain(w, WB/4); double t1=now();
    for(size_t i=0;i<nn;i++) p=p->next; double t2=now();
    if(r>=2){ts+=t1-t0; tc+=t2-t1;}
  }
  printf("mode %d S %zuMB: stream %.2f GB/s, chase after %.1f ns/node (%.0f us) %p %f\n", mode, S>>20, 10*WB/ts/1e9, tc/10/nn*1e9, tc/10*1e6, (void*)p, acc);
}
