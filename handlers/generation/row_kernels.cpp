// A language model's linear layers on weights laid out for a few rows of activations (row_linear.py).
//
// A decode step multiplies one to a few rows by every weight: its time is the weights' bytes read
// from memory. The layout puts sixteen output channels' weights side by side, in the order the
// inputs are read: [N/16][K][16] in float32, [N/16][K/2][16][2] in bfloat16 (pairs of inputs, as
// the dot-product instruction takes them). A step then reads each block from start to end, one
// 64-byte line per instruction, broadcasts each input (pair) and accumulates sixteen outputs a
// register, no horizontal sums: it reads at the rate a plain read does.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>

namespace {

constexpr int64_t LANES = 16;  // output channels a 512-bit register of float32 sums holds

// MT rows of x times NB blocks of sixteen outputs, accumulated in MT x NB registers (at most 24,
// with NB weights and a broadcast: 28 of the 32): for blocks [nb0, nb1) of the output.
template <int MT, int NB>
__attribute__((target("avx512f,avx512bw,avx512bf16")))
void bf16_tiles(const at::BFloat16* x, const at::BFloat16* packed, const at::BFloat16* bias,
                at::BFloat16* y, int64_t M, int64_t K, int64_t N, int64_t nb0, int64_t nb1) {
  const int64_t pairs = K / 2;
  for (int64_t nb = nb0; nb < nb1; nb += NB) {
    const int blocks = static_cast<int>(std::min<int64_t>(NB, nb1 - nb));
    const int32_t* w[NB];  // a pair of bf16 is one 32-bit lane
    for (int j = 0; j < NB; ++j)
      w[j] = reinterpret_cast<const int32_t*>(packed + (nb + std::min(j, blocks - 1)) * pairs * 2 * LANES);
    for (int64_t m0 = 0; m0 < M; m0 += MT) {
      const int rows = static_cast<int>(std::min<int64_t>(MT, M - m0));
      const int32_t* xr[MT];
      for (int m = 0; m < MT; ++m)
        xr[m] = reinterpret_cast<const int32_t*>(x + (m0 + std::min(m, rows - 1)) * K);
      __m512 acc[MT][NB];
      for (int m = 0; m < MT; ++m)
        for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_setzero_ps();
      for (int64_t p = 0; p < pairs; ++p) {
        __m512i wv[NB];
        for (int j = 0; j < NB; ++j) wv[j] = _mm512_loadu_si512(w[j] + p * LANES);
        for (int m = 0; m < MT; ++m) {
          const __m512bh xb = (__m512bh)_mm512_set1_epi32(xr[m][p]);
          for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], xb, (__m512bh)wv[j]);
        }
      }
      for (int j = 0; j < blocks; ++j) {
        const int64_t n = (nb + j) * LANES;
        __m512 b = _mm512_setzero_ps();
        if (bias != nullptr)  // bf16 to float32: the bits moved to the upper half
          b = _mm512_castsi512_ps(_mm512_slli_epi32(
              _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias + n))), 16));
        for (int m = 0; m < rows; ++m)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + (m0 + m) * N + n),
                              (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc[m][j], b)));
      }
    }
  }
}

// The same loop in float32: FMA on one input at a time. Written out, not shared with bf16's through
// a template: a function's instruction set (its target) cannot depend on a template parameter, and
// float32 must not need bf16's instructions.
template <int MT, int NB>
__attribute__((target("avx512f")))
void f32_tiles(const float* x, const float* packed, const float* bias, float* y, int64_t M, int64_t K,
               int64_t N, int64_t nb0, int64_t nb1) {
  for (int64_t nb = nb0; nb < nb1; nb += NB) {
    const int blocks = static_cast<int>(std::min<int64_t>(NB, nb1 - nb));
    const float* w[NB];
    for (int j = 0; j < NB; ++j) w[j] = packed + (nb + std::min(j, blocks - 1)) * K * LANES;
    for (int64_t m0 = 0; m0 < M; m0 += MT) {
      const int rows = static_cast<int>(std::min<int64_t>(MT, M - m0));
      const float* xr[MT];
      for (int m = 0; m < MT; ++m) xr[m] = x + (m0 + std::min(m, rows - 1)) * K;
      __m512 acc[MT][NB];
      for (int m = 0; m < MT; ++m)
        for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_setzero_ps();
      for (int64_t k = 0; k < K; ++k) {
        __m512 wv[NB];
        for (int j = 0; j < NB; ++j) wv[j] = _mm512_loadu_ps(w[j] + k * LANES);
        for (int m = 0; m < MT; ++m) {
          const __m512 xb = _mm512_set1_ps(xr[m][k]);
          for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_fmadd_ps(xb, wv[j], acc[m][j]);
        }
      }
      for (int j = 0; j < blocks; ++j) {
        const int64_t n = (nb + j) * LANES;
        const __m512 b = bias != nullptr ? _mm512_loadu_ps(bias + n) : _mm512_setzero_ps();
        for (int m = 0; m < rows; ++m) _mm512_storeu_ps(y + (m0 + m) * N + n, _mm512_add_ps(acc[m][j], b));
      }
    }
  }
}

// Blocks [nb0, nb1) in tiles NB wide, the remainder in narrower ones: a tile wider than what is left
// would compute blocks again only to drop them (on a machine with many threads a thread's range can
// be one or two blocks: at 16 rows, where the arithmetic bounds the step, that cost 1.5x).
template <typename T, int MT, int NB>
void span(const T* x, const T* packed, const T* bias, T* y, int64_t M, int64_t K, int64_t N, int64_t nb0,
          int64_t nb1) {
  const int64_t whole = nb0 + (nb1 - nb0) / NB * NB;
  if (whole > nb0) {
    if constexpr (std::is_same_v<T, float>)
      f32_tiles<MT, NB>(x, packed, bias, y, M, K, N, nb0, whole);
    else
      bf16_tiles<MT, NB>(x, packed, bias, y, M, K, N, nb0, whole);
  }
  if constexpr (NB > 1)
    if (whole < nb1) span<T, MT, NB - 1>(x, packed, bias, y, M, K, N, whole, nb1);
}

// Each thread a contiguous range of output blocks (at::parallel_for: torch's threads, as set for
// the worker), so every weight byte is read once whatever the rows.
template <typename T, int MT, int NB>
void tiles(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias, at::Tensor& y) {
  const int64_t M = x.size(0), K = x.size(1), N = y.size(1);
  const T* xp = x.const_data_ptr<T>();
  const T* wp = packed.const_data_ptr<T>();
  const T* bp = bias.has_value() ? bias->const_data_ptr<T>() : nullptr;
  T* yp = y.data_ptr<T>();
  at::parallel_for(0, N / LANES, 1, [&](int64_t nb0, int64_t nb1) { span<T, MT, NB>(xp, wp, bp, yp, M, K, N, nb0, nb1); });
}

// Tiles by rows: one row reads eight blocks at once (eight lines in flight); more rows share each
// block read among more registers. Measured on Qwen2.5-0.5B's shapes (row_linear.py).
template <typename T>
void by_rows(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias, at::Tensor& y) {
  const int64_t M = x.size(0);
  if (M == 1) tiles<T, 1, 8>(x, packed, bias, y);
  else if (M == 2) tiles<T, 2, 6>(x, packed, bias, y);
  else if (M <= 4) tiles<T, 4, 4>(x, packed, bias, y);
  else if (M <= 8) tiles<T, 8, 2>(x, packed, bias, y);
  else tiles<T, 8, 3>(x, packed, bias, y);
}

int64_t pairs_of(const at::ScalarType dtype) { return dtype == at::kBFloat16 ? 2 : 1; }

at::Tensor pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2, "kit_rows.pack: a 2-d weight, not ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == at::kFloat || weight.scalar_type() == at::kBFloat16,
              "kit_rows.pack: float32 or bfloat16, not ", weight.scalar_type());
  const int64_t N = weight.size(0), K = weight.size(1), g = pairs_of(weight.scalar_type());
  TORCH_CHECK(N % LANES == 0 && K % g == 0, "kit_rows.pack: ", N, " outputs are not a multiple of 16 or ", K,
              " inputs not of ", g);
  return weight.reshape({N / LANES, LANES, K / g, g}).permute({0, 2, 1, 3}).contiguous();
}

at::Tensor linear(const at::Tensor& input, const at::Tensor& packed, const c10::optional<at::Tensor>& bias) {
  const auto dtype = packed.scalar_type();
  TORCH_CHECK(input.scalar_type() == dtype, "kit_rows.linear: input ", input.scalar_type(), ", weights ", dtype);
  const int64_t K = packed.size(1) * packed.size(3), N = packed.size(0) * LANES;
  TORCH_CHECK(input.size(-1) == K, "kit_rows.linear: input of ", input.size(-1), " features, weights of ", K);
  const at::Tensor x = input.reshape({-1, K}).contiguous();
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  const c10::optional<at::Tensor> b = bias.has_value() ? c10::optional<at::Tensor>(bias->contiguous()) : bias;
  if (x.size(0) > 0) {
    if (dtype == at::kBFloat16)
      by_rows<at::BFloat16>(x, packed, b, y);
    else
      by_rows<float>(x, packed, b, y);
  }
  auto shape = input.sizes().vec();
  shape.back() = N;
  return y.view(shape);
}

}  // namespace

TORCH_LIBRARY(kit_rows, m) {
  m.def("pack(Tensor weight) -> Tensor", &pack);
  m.def("linear(Tensor input, Tensor packed, Tensor? bias) -> Tensor", &linear);
}
