// One op per dense decoder layer (Llama / SmolLM2 / Qwen3) on the batch-invariant CPU kernels:
//   qkv = linear(rms_norm(x)) (one op: bi_norm_linear, the QKV projections fused); [q/k norm]; rope; K/V written
//   to their cache slots; o = paged_attention; x1 = x + o_proj(o); act = silu(gate) * up of linear(rms_norm(x1))
//   (one op: the add, the norm, the fused gate|up projection and the SiLU); out = x1 + down_proj(act), an add
//   that the next layer's bi_norm_linear makes (fused_decoder_stack)
// It exists to take the Python and small-op overhead out of a decode step: the kernels themselves are the
// dflash_trt::bi_* ops of invariant.cpp, called through typed dispatcher handles looked up once, so this file
// computes nothing that could round differently from the op-by-op path except rope, the K/V write and the
// residual adds, which reproduce PyTorch's roundings exactly (see rope_rows). Bitwise equality with the
// op-by-op path is what keeps speculative output equal to autoregressive output; tests/test_fused_layer.py
// checks it.
//
// fused_decoder_stack runs a model's layers one after another in one op (a FusedStack holds their states), so
// a step crosses from Python into C++ once; it returns the outputs of the layers the drafter captures too.
//
// Built with -ffp-contract=off (plugins/build.py): rope's x*cos + rot*sin must stay three rounded operations.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace fl {

using at::Tensor;
using OptT = c10::optional<Tensor>;

// ---- the batch-invariant kernels, through the dispatcher ------------------------------------------------------

struct Handles {
  c10::TypedOperatorHandle<Tensor(const Tensor&, const Tensor&, int64_t, const OptT&, int64_t, const OptT&)> linear;
  c10::TypedOperatorHandle<std::tuple<Tensor, Tensor>(const Tensor&, const OptT&, const Tensor&, double, const Tensor&,
                                                       int64_t, const OptT&, int64_t, const OptT&, int64_t, int64_t)>
      norm_linear;
  c10::TypedOperatorHandle<Tensor(const Tensor&, const Tensor&, double)> rms_norm;
  c10::TypedOperatorHandle<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, double)> add_norm;
  c10::TypedOperatorHandle<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                  const Tensor&, const Tensor&, const Tensor&, double, bool)>
      attention;
};

static const Handles& H() {
  // looked up on first use: the dflash_bi extension registers the ops and is loaded first (plugins/layer.py)
  static const Handles h = [] {
    auto& d = c10::Dispatcher::singleton();
    return Handles{
        d.findSchemaOrThrow("dflash_trt::bi_linear", "")
            .typed<Tensor(const Tensor&, const Tensor&, int64_t, const OptT&, int64_t, const OptT&)>(),
        d.findSchemaOrThrow("dflash_trt::bi_norm_linear", "")
            .typed<std::tuple<Tensor, Tensor>(const Tensor&, const OptT&, const Tensor&, double, const Tensor&,
                                              int64_t, const OptT&, int64_t, const OptT&, int64_t, int64_t)>(),
        d.findSchemaOrThrow("dflash_trt::bi_rms_norm", "").typed<Tensor(const Tensor&, const Tensor&, double)>(),
        d.findSchemaOrThrow("dflash_trt::bi_add_rms_norm", "")
            .typed<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, double)>(),
        d.findSchemaOrThrow("dflash_trt::bi_paged_attention", "")
            .typed<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&, double, bool)>(),
    };
  }();
  return h;
}

// ---- the layer's constant state -------------------------------------------------------------------------------

static OptT opt(const Tensor& t) { return t.numel() ? OptT(t) : OptT(); }  // an empty tensor stands for None

struct Proj {  // one packed linear (plugins/invariant.py PackedLinear) and its bias
  Tensor data;
  int64_t n = 0;
  OptT bias, scale;
  int64_t k_splits = 1;
  Tensor run(const Tensor& x) const { return H().linear.call(x, data, n, bias, k_splits, scale); }
  // on rms_norm(x + residual) (weight w), each thread norming the rows itself; inter > 0: gate in columns
  // [0, inter), up from up_col, and SiLU(gate) * up [T, inter] returned. Returns the output and x + residual
  // (empty without a residual)
  std::tuple<Tensor, Tensor> run_normed(const Tensor& x, const OptT& residual, const Tensor& w, double eps,
                                        int64_t inter = 0, int64_t up_col = 0) const {
    return H().norm_linear.call(x, residual, w, eps, data, n, bias, k_splits, scale, inter, up_col);
  }
};

struct FusedLayer : torch::CustomClassHolder {
  Tensor in_norm, post_norm, q_norm, k_norm;  // q/k norm: empty when the model has none
  double eps = 0, qk_eps = 0, attn_scale = 0;
  Proj qkv, o, gate_up, down;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  int64_t k_col = 0, v_col = 0;     // where k and v start in the fused qkv output (q starts at 0)
  int64_t inter = 0, up_col = 0;    // intermediate size; where up starts in the fused gate_up output
  bool causal = true;  // false: every row sees all of its sequence's keys (a DFlash drafter's block)

  // tensors: in_norm, post_norm, q_norm, k_norm, then (data, bias, scale) of qkv, o, gate_up, down
  // ints: heads, kv_heads, head_dim, k_col, v_col, inter, up_col, n of qkv/o/gate_up/down, k_splits of o/down,
  //       causal
  // floats: eps, qk_eps, attn_scale
  FusedLayer(std::vector<Tensor> t, std::vector<int64_t> i, std::vector<double> f) {
    TORCH_CHECK(t.size() == 16 && i.size() == 14 && f.size() == 3, "FusedLayer: 16 tensors, 14 ints, 3 floats");
    in_norm = t[0]; post_norm = t[1]; q_norm = t[2]; k_norm = t[3];
    Proj* ps[4] = {&qkv, &o, &gate_up, &down};
    for (int j = 0; j < 4; ++j) {
      ps[j]->data = t[4 + 3 * j];
      ps[j]->bias = opt(t[5 + 3 * j]);
      ps[j]->scale = opt(t[6 + 3 * j]);
      ps[j]->n = i[7 + j];
    }
    heads = i[0]; kv_heads = i[1]; head_dim = i[2]; k_col = i[3]; v_col = i[4]; inter = i[5]; up_col = i[6];
    o.k_splits = i[11]; down.k_splits = i[12];
    causal = i[13] != 0;
    eps = f[0]; qk_eps = f[1]; attn_scale = f[2];
    TORCH_CHECK(head_dim % 2 == 0, "FusedLayer: rotate-half rope needs an even head dim");
  }
};

// ---- rope, the K/V write, the residual add --------------------------------------------------------------------

// bf16 <-> fp32 on the raw bits, written so that the compiler vectorises the rope loops: widening is exact, and
// rounding is round-to-nearest-even with NaN mapped to 0x7FC0, bit for bit what c10::BFloat16(float) does
static inline float widen(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
static inline uint16_t round_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t r = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  return f != f ? (uint16_t)0x7FC0 : r;
}
template <typename T>
static inline float ld(const T* p, int64_t i) {
  if constexpr (std::is_same<T, float>::value) return p[i];
  else return widen(reinterpret_cast<const uint16_t*>(p)[i]);
}
template <typename T>
static inline void st(T* p, int64_t i, float v) {
  if constexpr (std::is_same<T, float>::value) p[i] = v;
  else reinterpret_cast<uint16_t*>(p)[i] = round_bf16(v);
}
template <typename T>
static inline float rnd(float v) {  // v rounded to T, as a float
  if constexpr (std::is_same<T, float>::value) return v;
  else return widen(round_bf16(v));
}

// out[t, h, :] = x*cos + rot(x)*sin with rot(x) = cat(-x[half:], x[:half]), every operation rounded to T as
// PyTorch's three separate elementwise ops round it (its bf16 kernels compute in fp32 and round each result).
// x rows are t * ldx apart, heads D apart; cos/sin [T, D] contiguous in T. The two halves are separate loops
// so that each is a straight vector loop.
template <typename T>
static inline __attribute__((always_inline)) void rope_rows_t(const T* x, int64_t ldx, const T* cos, const T* sin,
                                                              int64_t nt, int64_t nh, int64_t D, T* out) {
  const int64_t half = D / 2;
  for (int64_t t = 0; t < nt; ++t) {
    const T* c = cos + t * D;
    const T* s = sin + t * D;
    for (int64_t h = 0; h < nh; ++h) {
      const T* xr = x + t * ldx + h * D;
      T* o = out + (t * nh + h) * D;
      for (int64_t i = 0; i < half; ++i) {
        const float a = rnd<T>(ld(xr, i) * ld(c, i));
        const float b = rnd<T>(-ld(xr, i + half) * ld(s, i));
        st(o, i, a + b);
      }
      for (int64_t i = half; i < D; ++i) {
        const float a = rnd<T>(ld(xr, i) * ld(c, i));
        const float b = rnd<T>(ld(xr, i - half) * ld(s, i));
        st(o, i, a + b);
      }
    }
  }
}

// The library is built for any x86-64; the rope loops also get an AVX-512 build, picked when the library loads.
// They are elementwise, so every vector width computes the same bits.
__attribute__((target_clones("arch=x86-64-v4", "default"))) static void rope_rows_f32(
    const float* x, int64_t ldx, const float* cos, const float* sin, int64_t nt, int64_t nh, int64_t D, float* out) {
  rope_rows_t<float>(x, ldx, cos, sin, nt, nh, D, out);
}
__attribute__((target_clones("arch=x86-64-v4", "default"))) static void rope_rows_bf16(
    const at::BFloat16* x, int64_t ldx, const at::BFloat16* cos, const at::BFloat16* sin, int64_t nt, int64_t nh,
    int64_t D, at::BFloat16* out) {
  rope_rows_t<at::BFloat16>(x, ldx, cos, sin, nt, nh, D, out);
}
template <typename T>
static void rope_rows(const T* x, int64_t ldx, const T* cos, const T* sin, int64_t nt, int64_t nh, int64_t D,
                      T* out) {
  if constexpr (std::is_same<T, float>::value) rope_rows_f32(x, ldx, cos, sin, nt, nh, D, out);
  else rope_rows_bf16(x, ldx, cos, sin, nt, nh, D, out);
}

// out = a + b as PyTorch's `a + b` computes it (a bf16 sum formed in fp32 and rounded once); clones as rope's
template <typename T>
static inline __attribute__((always_inline)) void add_rows_t(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) st(out, i, ld(a, i) + ld(b, i));
}
__attribute__((target_clones("arch=x86-64-v4", "default"))) static void add_rows_f32(const float* a, const float* b,
                                                                                      float* out, int64_t n) {
  add_rows_t<float>(a, b, out, n);
}
__attribute__((target_clones("arch=x86-64-v4", "default"))) static void add_rows_bf16(
    const at::BFloat16* a, const at::BFloat16* b, at::BFloat16* out, int64_t n) {
  add_rows_t<at::BFloat16>(a, b, out, n);
}
static Tensor residual_add(const Tensor& a, const Tensor& b) {
  TORCH_CHECK(a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && a.is_contiguous() && b.is_contiguous(),
              "fused_decoder_layer: residual add of mismatched tensors");
  Tensor out = at::empty_like(a);
  if (a.scalar_type() == at::kFloat)
    add_rows_f32(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), a.numel());
  else
    add_rows_bf16(a.data_ptr<at::BFloat16>(), b.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>(), a.numel());
  return out;
}

// cache[slot[t], :, :] = rows[t] cast to the cache's dtype (what index_copy_(0, slot_mapping, k.to(dtype)) does)
template <typename S, typename C>
static void write_rows(const S* rows, int64_t ld_rows, const int64_t* slots, int64_t nt, int64_t width, C* cache,
                       int64_t n_slots) {
  for (int64_t t = 0; t < nt; ++t) {
    const int64_t s = slots[t];
    TORCH_CHECK(s >= 0 && s < n_slots, "fused_decoder_layer: slot ", s, " out of range [0, ", n_slots, ")");
    const S* src = rows + t * ld_rows;
    C* dst = cache + s * width;
    if constexpr (std::is_same<S, C>::value) {
      std::memcpy(dst, src, sizeof(C) * width);
    } else {
      for (int64_t j = 0; j < width; ++j) dst[j] = static_cast<C>(static_cast<float>(src[j]));
    }
  }
}

template <typename S>
static void write_cache(const S* rows, int64_t ld_rows, const Tensor& slots, int64_t nt, int64_t width,
                        const Tensor& cache) {
  const int64_t n_slots = cache.numel() / width;
  const int64_t* sl = slots.data_ptr<int64_t>();
  if (cache.scalar_type() == at::kFloat)
    write_rows(rows, ld_rows, sl, nt, width, cache.data_ptr<float>(), n_slots);
  else
    write_rows(rows, ld_rows, sl, nt, width, cache.data_ptr<at::BFloat16>(), n_slots);
}

template <typename T>
static void attention_inputs(const FusedLayer& L, const Tensor& qkv, const Tensor& qn, const Tensor& kn,
                             const Tensor& cos, const Tensor& sin, const Tensor& k_cache, const Tensor& v_cache,
                             const Tensor& slots, Tensor& q_out) {
  const int64_t nt = qkv.size(0), D = L.head_dim, ld = qkv.stride(0);
  const T* y = qkv.data_ptr<T>();
  const T* c = cos.data_ptr<T>();
  const T* s = sin.data_ptr<T>();
  // q and k: straight from the fused output, or from their normed copies ([T, heads, D] contiguous)
  const T* q = qn.defined() ? qn.data_ptr<T>() : y;
  const int64_t ldq = qn.defined() ? L.heads * D : ld;
  const T* k = kn.defined() ? kn.data_ptr<T>() : y + L.k_col;
  const int64_t ldk = kn.defined() ? L.kv_heads * D : ld;
  rope_rows<T>(q, ldq, c, s, nt, L.heads, D, q_out.data_ptr<T>());
  std::vector<T> k_rot((size_t)(nt * L.kv_heads * D));
  rope_rows<T>(k, ldk, c, s, nt, L.kv_heads, D, k_rot.data());
  write_cache<T>(k_rot.data(), L.kv_heads * D, slots, nt, L.kv_heads * D, k_cache);
  write_cache<T>(y + L.v_col, ld, slots, nt, L.kv_heads * D, v_cache);
}

// ---- the op -----------------------------------------------------------------------------------------------------

// A layer's output is x1 + d, left to whoever reads it next: the next layer's input norm forms the sum in each of
// its threads (a single crossing of d between the cores instead of one into a serial add and one out of it). x is
// the layer's input: a + b where b is given (the previous layer's d and x1), else a.
struct LayerOut {
  Tensor d, x1, x;
};

static LayerOut run_layer(const FusedLayer& L, const Tensor& a, const OptT& b, const Tensor& cos_in,
                          const Tensor& sin_in, const Tensor& k_cache, const Tensor& v_cache,
                          const Tensor& slot_mapping, const Tensor& q_start, const Tensor& q_len,
                          const Tensor& kv_len, const Tensor& kv_slots, const Tensor& kv_offsets) {
  const auto dt = a.scalar_type();
  TORCH_CHECK(a.device().is_cpu() && a.dim() == 2, "fused_decoder_layer: x must be a CPU [T, hidden] tensor");
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16, "fused_decoder_layer: x must be float32 or bfloat16");
  TORCH_CHECK(cos_in.scalar_type() == dt && sin_in.scalar_type() == dt, "fused_decoder_layer: cos/sin dtype");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type() &&
                  (k_cache.scalar_type() == at::kFloat || k_cache.scalar_type() == at::kBFloat16) &&
                  k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  k_cache.size(-1) == L.head_dim && k_cache.size(-2) == L.kv_heads,
              "fused_decoder_layer: caches must be contiguous float32/bfloat16 [..., kv_heads, head_dim]");
  const int64_t nt = a.size(0), D = L.head_dim;
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.numel() == nt,
              "fused_decoder_layer: slot_mapping must be int64 with one slot per row");
  const Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous(), slots = slot_mapping.contiguous();
  TORCH_CHECK(cos.dim() == 2 && cos.size(0) == nt && cos.size(1) == D && sin.sizes() == cos.sizes(),
              "fused_decoder_layer: cos/sin must be [T, head_dim]");
  const Handles& h = H();

  // attention block: qkv [T, padded q | k | v columns] on rms_norm(x), x = a + b formed in the same op
  const auto [qkv, xs] = L.qkv.run_normed(a, b, L.in_norm, L.eps);
  const Tensor x = b ? xs : a;
  Tensor qn, kn;
  if (L.q_norm.numel()) {
    qn = h.rms_norm.call(qkv.narrow(1, 0, L.heads * D).view({nt, L.heads, D}), L.q_norm, L.qk_eps);
    kn = h.rms_norm.call(qkv.narrow(1, L.k_col, L.kv_heads * D).view({nt, L.kv_heads, D}), L.k_norm, L.qk_eps);
    TORCH_CHECK(qn.scalar_type() == dt && kn.scalar_type() == dt, "fused_decoder_layer: q/k norm dtype");
    qn = qn.contiguous();
    kn = kn.contiguous();
  }
  Tensor q = at::empty({nt, L.heads, D}, x.options());
  if (dt == at::kFloat)
    attention_inputs<float>(L, qkv, qn, kn, cos, sin, k_cache, v_cache, slots, q);
  else
    attention_inputs<at::BFloat16>(L, qkv, qn, kn, cos, sin, k_cache, v_cache, slots, q);
  const Tensor att = h.attention.call(q, k_cache, v_cache, q_start, q_len, kv_len, kv_slots, kv_offsets,
                                      L.attn_scale, L.causal);
  const Tensor o = L.o.run(att.view({nt, L.heads * D}));

  // MLP block: x1 = x + o (rounded to x's dtype first, as `x + o` is), its norm, gate|up and SiLU in one op
  auto [act, x1] = L.gate_up.run_normed(o, x, L.post_norm, L.eps, L.inter, L.up_col);
  return {L.down.run(act), x1, x};
}

static Tensor fused_decoder_layer(const c10::intrusive_ptr<FusedLayer>& st, const Tensor& x, const Tensor& cos,
                                  const Tensor& sin, const Tensor& k_cache, const Tensor& v_cache,
                                  const Tensor& slot_mapping, const Tensor& q_start, const Tensor& q_len,
                                  const Tensor& kv_len, const Tensor& kv_slots, const Tensor& kv_offsets) {
  const LayerOut r = run_layer(*st, x, OptT(), cos, sin, k_cache, v_cache, slot_mapping, q_start, q_len, kv_len,
                               kv_slots, kv_offsets);
  return residual_add(r.x1, r.d);
}

// A model's consecutive fused layers, run by one op: a decode step crosses from Python into C++ once instead of
// once per layer (each crossing boxes a dozen arguments). Each layer is the same run_layer, so the bits are
// the per-layer op's.
struct FusedStack : torch::CustomClassHolder {
  std::vector<c10::intrusive_ptr<FusedLayer>> layers;
  Tensor final_norm;  // the model's final RMSNorm after the last layer (empty: none)
  double final_eps = 0;
  // every layer's FusedLayer arguments, one after another (16 tensors, 14 ints, 3 floats each)
  FusedStack(std::vector<Tensor> t, std::vector<int64_t> i, std::vector<double> f) {
    const size_t n = f.size() / 3;
    TORCH_CHECK(n > 0 && t.size() == 16 * n && i.size() == 14 * n && f.size() == 3 * n,
                "FusedStack: 16 tensors, 14 ints and 3 floats per layer");
    for (size_t l = 0; l < n; ++l)
      layers.push_back(c10::make_intrusive<FusedLayer>(
          std::vector<Tensor>(t.begin() + 16 * l, t.begin() + 16 * (l + 1)),
          std::vector<int64_t>(i.begin() + 14 * l, i.begin() + 14 * (l + 1)),
          std::vector<double>(f.begin() + 3 * l, f.begin() + 3 * (l + 1))));
  }
  void set_final_norm(Tensor weight, double eps) {
    final_norm = weight;
    final_eps = eps;
  }
};

// out[0]: the last layer's output, after the final norm where the stack has one; out[1] (when capture is not
// empty): the outputs of layers capture[0], capture[1], ... side by side, the last layer's taken after the final
// norm (the drafter's features: transformers' hidden_states give the normed output for the last layer). The
// norm and the features are made here, while the last layer's rows are still in this core's cache: as the first
// Python ops after a pass that streamed every weight, they cost more than the work they do.
static std::vector<Tensor> fused_decoder_stack(const c10::intrusive_ptr<FusedStack>& st, const Tensor& x,
                                               const Tensor& cos, const Tensor& sin, at::TensorList k_caches,
                                               at::TensorList v_caches, const Tensor& slot_mapping,
                                               const Tensor& q_start, const Tensor& q_len, const Tensor& kv_len,
                                               const Tensor& kv_slots, const Tensor& kv_offsets,
                                               at::IntArrayRef capture) {
  const auto& layers = st->layers;
  const int64_t n = (int64_t)layers.size();
  TORCH_CHECK((int64_t)k_caches.size() == n && (int64_t)v_caches.size() == n,
              "fused_decoder_stack: one K and one V cache per layer");
  for (int64_t c : capture) TORCH_CHECK(c >= 0 && c < n, "fused_decoder_stack: capture layer ", c, " out of range");
  std::vector<Tensor> kept(capture.size());
  auto keep = [&](int64_t l, const Tensor& h) {
    for (size_t j = 0; j < capture.size(); ++j)
      if (capture[j] == l) kept[j] = h;
  };
  Tensor a = x;  // each layer's input is a + b (b: none for the first)
  OptT b;
  for (int64_t l = 0; l < n; ++l) {
    const LayerOut r = run_layer(*layers[l], a, b, cos, sin, k_caches[l], v_caches[l], slot_mapping, q_start,
                                 q_len, kv_len, kv_slots, kv_offsets);
    if (l > 0) keep(l - 1, r.x);
    a = r.d;
    b = r.x1;
  }
  // the last layer's output x1 + d (d + x1: the same bits), and the final norm in the same pass
  const Tensor h = st->final_norm.defined() ? std::get<0>(H().add_norm.call(a, *b, st->final_norm, st->final_eps))
                                            : residual_add(*b, a);
  keep(n - 1, h);
  std::vector<Tensor> out{h};
  if (!kept.empty()) out.push_back(at::cat(kept, -1));
  return out;
}

}  // namespace fl

TORCH_LIBRARY_FRAGMENT(dflash_trt, m) {
  m.class_<fl::FusedLayer>("FusedLayer")
      .def(torch::init<std::vector<at::Tensor>, std::vector<int64_t>, std::vector<double>>());
  m.class_<fl::FusedStack>("FusedStack")
      .def(torch::init<std::vector<at::Tensor>, std::vector<int64_t>, std::vector<double>>())
      .def("set_final_norm", &fl::FusedStack::set_final_norm);
  m.def("fused_decoder_stack(__torch__.torch.classes.dflash_trt.FusedStack stack, Tensor x, Tensor cos, "
        "Tensor sin, Tensor[] k_caches, Tensor[] v_caches, Tensor slot_mapping, Tensor q_start, Tensor q_len, "
        "Tensor kv_len, Tensor kv_slots, Tensor kv_offsets, int[] capture) -> Tensor[]");
  m.def("fused_decoder_layer(__torch__.torch.classes.dflash_trt.FusedLayer state, Tensor x, Tensor cos, "
        "Tensor sin, Tensor k_cache, Tensor v_cache, Tensor slot_mapping, Tensor q_start, Tensor q_len, "
        "Tensor kv_len, Tensor kv_slots, Tensor kv_offsets) -> Tensor");
  m.def("fused_layer_ready() -> str", []() -> std::string {
    try {
      fl::H();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  });
}

TORCH_LIBRARY_IMPL(dflash_trt, CPU, m) {
  m.impl("fused_decoder_layer", &fl::fused_decoder_layer);
  m.impl("fused_decoder_stack", &fl::fused_decoder_stack);
}
