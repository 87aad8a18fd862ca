// g++ -O2 -mamx-tile -mamx-bf16 -o lat lat.cpp && ./lat: tdpbf16ps issue rate with 1, 2 and 4 accumulator chains, and a
// step of tile loads and products, all in L1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstdio>
#include <cstdint>
#include <chrono>
#include <x86intrin.h>
struct alignas(64) Cfg { uint8_t palette, start; uint8_t res[14]; uint16_t colsb[16]; uint8_t rows[16]; };
int main() {
  syscall(SYS_arch_prctl, 0x1023, 18);
  Cfg c{}; c.palette = 1; for (int t = 0; t < 8; ++t) { c.rows[t] = 16; c.colsb[t] = 64; }
  __asm__ volatile("ldtilecfg %0" : : "m"(c));
  alignas(64) static uint16_t buf[16 * 32];
  for (auto& v : buf) v = 0;
  _tile_loadd(2, buf, 64); _tile_loadd(3, buf, 64); _tile_loadd(4, buf, 64); _tile_loadd(7, buf, 64);
  _tile_zero(0); _tile_zero(1); _tile_zero(5); _tile_zero(6);
  const int N = 2000000;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = std::chrono::steady_clock::now(); uint64_t c0 = __rdtsc();
    for (int i = 0; i < N; ++i) { _tile_dpbf16ps(0, 2, 3); _tile_dpbf16ps(1, 2, 4); }
    uint64_t c1 = __rdtsc(); auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < N; ++i) { _tile_dpbf16ps(0, 2, 3); _tile_dpbf16ps(1, 2, 4); _tile_dpbf16ps(5, 7, 3); _tile_dpbf16ps(6, 7, 4); }
    uint64_t c2 = __rdtsc(); auto t2 = std::chrono::steady_clock::now();
    for (int i = 0; i < N; ++i) { _tile_dpbf16ps(0, 2, 3); }
    uint64_t c3 = __rdtsc(); auto t3 = std::chrono::steady_clock::now();
    printf("2 chains: %.1f ns/dp (%.1f tsc)  4 chains: %.1f ns/dp (%.1f tsc)  1 chain: %.1f ns/dp\n",
      std::chrono::duration<double, std::nano>(t1 - t0).count() / (2.0 * N), (c1 - c0) / (2.0 * N),
      std::chrono::duration<double, std::nano>(t2 - t1).count() / (4.0 * N), (c2 - c1) / (4.0 * N),
      std::chrono::duration<double, std::nano>(t3 - t2).count() / (1.0 * N));
  }
  // with loads of B from L1 each step
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < N; ++i) { _tile_loadd(3, buf, 64); _tile_loadd(4, buf, 64); _tile_loadd(2, buf, 64); _tile_dpbf16ps(0, 2, 3); _tile_dpbf16ps(1, 2, 4); }
    auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < N; ++i) { _tile_loadd(3, buf, 64); _tile_loadd(4, buf, 64); _tile_loadd(2, buf, 64); _tile_loadd(7, buf, 64); _tile_dpbf16ps(0, 2, 3); _tile_dpbf16ps(1, 2, 4); _tile_dpbf16ps(5, 7, 3); _tile_dpbf16ps(6, 7, 4);}
    auto t2 = std::chrono::steady_clock::now();
    printf("step 1 block (3 loads 2 dp): %.1f ns/step; 2 blocks (4 loads 4 dp): %.1f ns/step\n",
      std::chrono::duration<double, std::nano>(t1 - t0).count() / N, std::chrono::duration<double, std::nano>(t2 - t1).count() / N);
  }
}
