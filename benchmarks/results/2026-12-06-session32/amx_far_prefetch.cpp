// g++ -O2 -mamx-tile -mamx-bf16 -mavx512f -o amx amx.cpp && ./amx VARIANT ROWS [PREFETCH]: bf16 k-pair panels on AMX tiles,
// one core's share of the embedded target's 30 layers, row blocks of <= 16 (amx_lin_rows.txt lists the variants)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>
#include <chrono>
#include <cstdlib>
struct alignas(64) Cfg { uint8_t palette, start; uint8_t res[14]; uint16_t colsb[16]; uint8_t rows[16]; };
static void cfg(const int* rows) { Cfg c{}; c.palette = 1; for (int t = 0; t < 8; ++t) { c.rows[t] = rows[t]; c.colsb[t] = 64; }
  __asm__ volatile("ldtilecfg %0" : : "m"(c)); }
static int g_near = 1, g_far = 0, g_farhint = 1;
#define PF(w, q) do { for (int l = 0; l < 32; ++l) _mm_prefetch((const char*)(w + (q + 16 * g_near) * 32 + 16 * l), _MM_HINT_T0); \
  if (g_far) { if (g_farhint == 1) for (int l = 0; l < 32; ++l) _mm_prefetch((const char*)(w + (q + 16 * g_far) * 32 + 16 * l), _MM_HINT_T1); \
  else for (int l = 0; l < 32; ++l) _mm_prefetch((const char*)(w + (q + 16 * g_far) * 32 + 16 * l), _MM_HINT_T2); } } while (0)
// one block
static void k1(const uint16_t* x, int64_t ldb, const uint32_t* w, int64_t nt, float* o, bool pf) {
  _tile_zero(0); _tile_zero(1);
  for (int64_t q = 0; q < nt; q += 16) {
    if (pf) PF(w, q);
    _tile_loadd(3, w + q * 32, 128); _tile_loadd(4, w + q * 32 + 16, 128);
    _tile_loadd(2, x + 2 * q, ldb);
    _tile_dpbf16ps(0, 2, 3); _tile_dpbf16ps(1, 2, 4);
  }
  _tile_stored(0, o, 128); _tile_stored(1, o + 16, 128);
}
static void k1b(const uint16_t* x, int64_t ldb, const uint32_t* w, int64_t nt, float* o, bool pf) {
  _tile_zero(5); _tile_zero(6);
  for (int64_t q = 0; q < nt; q += 16) {
    if (pf) PF(w, q);
    _tile_loadd(3, w + q * 32, 128); _tile_loadd(4, w + q * 32 + 16, 128);
    _tile_loadd(7, x + 2 * q, ldb);
    _tile_dpbf16ps(5, 7, 3); _tile_dpbf16ps(6, 7, 4);
  }
  _tile_stored(5, o, 128); _tile_stored(6, o + 16, 128);
}
// one block, B double-buffered (3/4 and 5/6), A in 2 and 7
static void k1db(const uint16_t* x, int64_t ldb, const uint32_t* w, int64_t nt, float* o, bool pf) {
  _tile_zero(0); _tile_zero(1);
  int64_t q = 0;
  for (; q + 32 <= nt; q += 32) {
    if (pf) { PF(w, q); PF(w, q + 16); }
    _tile_loadd(3, w + q * 32, 128); _tile_loadd(4, w + q * 32 + 16, 128);
    _tile_loadd(2, x + 2 * q, ldb);
    _tile_loadd(5, w + (q + 16) * 32, 128); _tile_loadd(6, w + (q + 16) * 32 + 16, 128);
    _tile_loadd(7, x + 2 * (q + 16), ldb);
    _tile_dpbf16ps(0, 2, 3); _tile_dpbf16ps(1, 2, 4);
    _tile_dpbf16ps(0, 7, 5); _tile_dpbf16ps(1, 7, 6);
  }
  for (; q < nt; q += 16) {
    if (pf) PF(w, q);
    _tile_loadd(3, w + q * 32, 128); _tile_loadd(4, w + q * 32 + 16, 128);
    _tile_loadd(2, x + 2 * q, ldb);
    _tile_dpbf16ps(0, 2, 3); _tile_dpbf16ps(1, 2, 4);
  }
  _tile_stored(0, o, 128); _tile_stored(1, o + 16, 128);
}
static void k2(const uint16_t* xa, const uint16_t* xb, int64_t ldb, const uint32_t* w, int64_t nt, float* oa, float* ob, bool pf) {
  _tile_zero(0); _tile_zero(1); _tile_zero(5); _tile_zero(6);
  for (int64_t q = 0; q < nt; q += 16) {
    if (pf) PF(w, q);
    _tile_loadd(3, w + q * 32, 128); _tile_loadd(4, w + q * 32 + 16, 128);
    _tile_loadd(2, xa + 2 * q, ldb); _tile_loadd(7, xb + 2 * q, ldb);
    _tile_dpbf16ps(0, 2, 3); _tile_dpbf16ps(1, 2, 4);
    _tile_dpbf16ps(5, 7, 3); _tile_dpbf16ps(6, 7, 4);
  }
  _tile_stored(0, oa, 128); _tile_stored(1, oa + 16, 128); _tile_stored(5, ob, 128); _tile_stored(6, ob + 16, 128);
}
// two blocks, k-blocked: S steps of block A (tiles 0-2), then the same S steps of block B (5-7) from L1
static void k4(const uint16_t* xa, const uint16_t* xb, int64_t ldb, const uint32_t* w, int64_t nt, float* oa, float* ob, bool pf, int S) {
  _tile_zero(0); _tile_zero(1); _tile_zero(5); _tile_zero(6);
  for (int64_t q0 = 0; q0 < nt; q0 += 16 * S) {
    const int64_t q1 = q0 + 16 * S < nt ? q0 + 16 * S : nt;
    for (int64_t q = q0; q < q1; q += 16) {
      if (pf) PF(w, q);
      _tile_loadd(3, w + q * 32, 128); _tile_loadd(4, w + q * 32 + 16, 128);
      _tile_loadd(2, xa + 2 * q, ldb);
      _tile_dpbf16ps(0, 2, 3); _tile_dpbf16ps(1, 2, 4);
    }
    for (int64_t q = q0; q < q1; q += 16) {
      _tile_loadd(3, w + q * 32, 128); _tile_loadd(4, w + q * 32 + 16, 128);
      _tile_loadd(7, xb + 2 * q, ldb);
      _tile_dpbf16ps(5, 7, 3); _tile_dpbf16ps(6, 7, 4);
    }
  }
  _tile_stored(0, oa, 128); _tile_stored(1, oa + 16, 128); _tile_stored(5, ob, 128); _tile_stored(6, ob + 16, 128);
}
int main(int argc, char** argv) {
  syscall(SYS_arch_prctl, 0x1023, 18);
  const int variant = atoi(argv[1]); const int rows = atoi(argv[2]); const bool pf = argc > 3 ? atoi(argv[3]) : 1; if (argc > 4) g_near = atoi(argv[4]); if (argc > 5) g_far = atoi(argv[5]); if (argc > 6) g_farhint = atoi(argv[6]);
  // a core's share: 30 layers x {960, 576, 3072, 576} x K {576,576,576,1536} / 2 cols
  struct L { int64_t N, K; }; L ls[4] = {{480, 576}, {288, 576}, {1536, 576}, {288, 1536}};
  std::vector<std::vector<uint32_t>> W;
  for (int l = 0; l < 30; ++l) for (auto& s : ls) { std::vector<uint32_t> w(s.N / 32 * s.K / 2 * 32); for (auto& v : w) v = 0x3f803f80u; W.push_back(std::move(w)); }
  std::vector<uint16_t> x(64 * 1536, 0x3f80);
  alignas(64) static float out[2][16 * 32];
  double best = 1e9;
  for (int it = 0; it < 7; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    int li = 0;
    for (int l = 0; l < 30; ++l) for (auto& s : ls) {
      const uint32_t* w = W[li++].data();
      const int64_t P = s.N / 32, nt = s.K / 2, ldb = s.K * 2;
      const int nb = (rows + 15) / 16, base = rows / nb, extra = rows % nb;
      if (variant == 32 || variant == 33) {  // two blocks on one tile set (0-2: 32, 5-7: 33), both 9 rows
        int ma = (rows + 1) / 2;
        int r[8] = {ma, ma, ma, 16, 16, ma, ma, ma}; cfg(r);
        for (int64_t g = 0; g < P; ++g) {
          if (variant == 32) { k1(x.data(), ldb, w + g * nt * 32, nt, out[0], pf); k1(x.data() + ma * s.K, ldb, w + g * nt * 32, nt, out[1], pf); }
          else { k1b(x.data(), ldb, w + g * nt * 32, nt, out[0], pf); k1b(x.data() + ma * s.K, ldb, w + g * nt * 32, nt, out[1], pf); }
        }
      } else if (variant == 30 || variant == 31) {  // two blocks: tiles 0-2 with ma rows, 5-7 with mb rows
        int ma = (rows + 1) / 2, mb = variant == 30 ? rows / 2 : ma;
        int r[8] = {ma, ma, ma, 16, 16, mb, mb, mb}; cfg(r);
        for (int64_t g = 0; g < P; ++g) {
          k1(x.data(), ldb, w + g * nt * 32, nt, out[0], pf);
          k1b(x.data() + ma * s.K, ldb, w + g * nt * 32, nt, out[1], pf);
        }
      } else if (variant == 2 || variant >= 4) {
        for (int b = 0; b < nb; b += 2) {
          int ma = base + (b < extra), mb = b + 1 < nb ? base + (b + 1 < extra) : 0;
          int r[8] = {ma, ma, ma, 16, 16, mb ? mb : 1, mb ? mb : 1, mb ? mb : 1}; cfg(r);
          for (int64_t g = 0; g < P; ++g) {
            if (mb && variant >= 4) k4(x.data(), x.data() + ma * s.K, ldb, w + g * nt * 32, nt, out[0], out[1], pf, variant - 3);
            else if (mb) k2(x.data(), x.data() + ma * s.K, ldb, w + g * nt * 32, nt, out[0], out[1], pf);
            else k1(x.data(), ldb, w + g * nt * 32, nt, out[0], pf);
          }
        }
      } else {
        int mr = base + (extra > 0); int r[8] = {mr, mr, mr, 16, 16, variant == 3 ? 16 : mr, variant == 3 ? 16 : mr, mr};
        cfg(r);
        for (int64_t g = 0; g < P; ++g)
          for (int b = 0; b < nb; ++b) {
            if (variant == 1) k1(x.data(), ldb, w + g * nt * 32, nt, out[0], pf);
            else if (variant == 13) k1(x.data(), ldb, w + g * nt * 32, nt, out[0], pf && b == 0);
            else k1db(x.data(), ldb, w + g * nt * 32, nt, out[0], pf);
          }
      }
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (ms < best) best = ms;
  }
  printf("v%d rows %d pf %d near %d far %d hint %d: %.2f ms\n", variant, rows, (int)pf, g_near, g_far, g_farhint, best);
}
