// A language model's linear layers on weights laid out for a few rows of activations (row_linear.py).
//
// A decode step multiplies one to a few rows by every weight: its time is the weights' bytes read
// from memory. The layout puts sixteen output channels' weights side by side, in the order the
// inputs are read: [N/16][K][16] in float32, [N/16][K/2][16][2] in bfloat16 (pairs of inputs, as
// the dot-product instruction takes them). A step then reads each block from start to end, one
// 64-byte line per instruction, broadcasts each input (pair) and accumulates sixteen outputs a
// register, no horizontal sums: it reads at the rate a plain read does. On CPUs without AVX-512
// (EPYCs before Zen 4) float32 runs on AVX2: a block's sixteen outputs in two 256-bit registers.
// Where AMX multiplies bf16, many rows run on its tiles from the same layout: a block's K/2 lines of
// sixteen pairs are exactly the B operand a tile multiply takes (sixteen lines of 64 bytes a tile).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

namespace {

constexpr int64_t LANES = 16;  // output channels a 512-bit register of float32 sums holds

// Sixteen bf16 biases from n as float32 (the bits moved to the upper half); zeros without a bias.
__attribute__((target("avx512f,avx512bw"))) inline __m512 widened(const at::BFloat16* bias, int64_t n) {
  if (bias == nullptr) return _mm512_setzero_ps();
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias + n))), 16));
}

// Rows in a few passes of MT share the weights a chunk at a time: every pass computes a chunk of
// CHUNK_LINES lines of its blocks while they are in L1, its sums kept in L1 between chunks. The
// weights then stream from memory once, at an even pace, under all the rows' arithmetic; pass by
// pass over whole blocks, the first pass waited on memory and the next ones computed from L2, one
// after the other. A decode step's products of Qwen3-0.6B's shapes (28 layers and the head, each
// call through kit_rows.linear, a scratch timing, not a make target) on a 2-core AMX Xeon, the two
// libraries in turns, a process each: float32, 16 rows 134 (133-141) against 159 (149-167) ms over
// 3 processes each, 32 rows 192 (188-200) against 206 (203-224); bf16's dot products over 2 each,
// 16 rows 116 (116-117) against 122 (122-123); one row unchanged (one pass).
// Beyond CHUNKED_PASSES passes (a prompt's part) the arithmetic is the cost and the weights come
// from L2 under it: pass by pass, whole blocks.
constexpr int CHUNKED_PASSES = 4;
constexpr int64_t CHUNK_LINES = 16;

// The lines (inputs, or pairs of them) a pass computes before the next pass takes its turn.
inline int64_t chunk_lines(int64_t M, int MT, int64_t lines) {
  const int64_t passes = (M + MT - 1) / MT;
  return passes > 1 && passes <= CHUNKED_PASSES ? CHUNK_LINES : lines;
}

// Lines of each block bf16's loop asks for ahead of the one it reads (prefetcht0). The hardware's
// prefetchers alone left one or two rows' bf16 products below a plain read; asked ahead they read
// faster. Qwen3-0.6B's one-row products (28 layers and the head, 1.19 GB) on a 2-core AMX Xeon,
// the distances in turns in one process (a scratch timing, not a make target): none 46.9 ms, 4
// lines 0.90x, 8 lines 0.88x, 16 0.89x, 64 0.91x; two rows 0.87x at 8. float32's loop reads at a
// plain read's rate without: 0.99x, not added there.
constexpr int64_t BF16_PREFETCH_LINES = 8;

// MT rows of x times NB blocks of sixteen outputs, accumulated in MT x NB registers (at most 24,
// with NB weights and a broadcast: 28 of the 32): for blocks [nb0, nb1) of the output.
template <int MT, int NB>
__attribute__((target("avx512f,avx512bw,avx512bf16")))
void bf16_tiles(const at::BFloat16* x, const at::BFloat16* packed, const at::BFloat16* bias,
                at::BFloat16* y, int64_t M, int64_t K, int64_t N, int64_t nb0, int64_t nb1) {
  const int64_t pairs = K / 2, chunk = chunk_lines(M, MT, pairs);
  alignas(64) float sums[CHUNKED_PASSES][MT][NB][LANES];  // a pass's sums between its chunks
  for (int64_t nb = nb0; nb < nb1; nb += NB) {
    const int blocks = static_cast<int>(std::min<int64_t>(NB, nb1 - nb));
    const int32_t* w[NB];  // a pair of bf16 is one 32-bit lane
    for (int j = 0; j < NB; ++j)
      w[j] = reinterpret_cast<const int32_t*>(packed + (nb + std::min(j, blocks - 1)) * pairs * 2 * LANES);
    for (int64_t p0 = 0; p0 < pairs; p0 += chunk) {
      const int64_t p1 = std::min(pairs, p0 + chunk);
      for (int64_t m0 = 0, pass = 0; m0 < M; m0 += MT, ++pass) {
        const int rows = static_cast<int>(std::min<int64_t>(MT, M - m0));
        const int32_t* xr[MT];
        for (int m = 0; m < MT; ++m)
          xr[m] = reinterpret_cast<const int32_t*>(x + (m0 + std::min(m, rows - 1)) * K);
        __m512 acc[MT][NB];
        for (int m = 0; m < MT; ++m)
          for (int j = 0; j < NB; ++j) acc[m][j] = p0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(sums[pass][m][j]);
        for (int64_t p = p0; p < p1; ++p) {
          __m512i wv[NB];
          for (int j = 0; j < NB; ++j)  // past a block's end: the next block's lines, or none (no fault)
            _mm_prefetch(reinterpret_cast<const char*>(w[j] + (p + BF16_PREFETCH_LINES) * LANES), _MM_HINT_T0);
          for (int j = 0; j < NB; ++j) wv[j] = _mm512_loadu_si512(w[j] + p * LANES);
          for (int m = 0; m < MT; ++m) {
            const __m512bh xb = (__m512bh)_mm512_set1_epi32(xr[m][p]);
            for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], xb, (__m512bh)wv[j]);
          }
        }
        if (p1 < pairs) {
          for (int m = 0; m < MT; ++m)
            for (int j = 0; j < NB; ++j) _mm512_store_ps(sums[pass][m][j], acc[m][j]);
          continue;
        }
        for (int j = 0; j < blocks; ++j) {
          const int64_t n = (nb + j) * LANES;
          const __m512 b = widened(bias, n);
          for (int m = 0; m < rows; ++m)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + (m0 + m) * N + n),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc[m][j], b)));
        }
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
  const int64_t chunk = chunk_lines(M, MT, K);
  alignas(64) float sums[CHUNKED_PASSES][MT][NB][LANES];  // a pass's sums between its chunks
  for (int64_t nb = nb0; nb < nb1; nb += NB) {
    const int blocks = static_cast<int>(std::min<int64_t>(NB, nb1 - nb));
    const float* w[NB];
    for (int j = 0; j < NB; ++j) w[j] = packed + (nb + std::min(j, blocks - 1)) * K * LANES;
    for (int64_t k0 = 0; k0 < K; k0 += chunk) {
      const int64_t k1 = std::min(K, k0 + chunk);
      for (int64_t m0 = 0, pass = 0; m0 < M; m0 += MT, ++pass) {
        const int rows = static_cast<int>(std::min<int64_t>(MT, M - m0));
        const float* xr[MT];
        for (int m = 0; m < MT; ++m) xr[m] = x + (m0 + std::min(m, rows - 1)) * K;
        __m512 acc[MT][NB];
        for (int m = 0; m < MT; ++m)
          for (int j = 0; j < NB; ++j) acc[m][j] = k0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(sums[pass][m][j]);
        for (int64_t k = k0; k < k1; ++k) {
          __m512 wv[NB];
          for (int j = 0; j < NB; ++j) wv[j] = _mm512_loadu_ps(w[j] + k * LANES);
          for (int m = 0; m < MT; ++m) {
            const __m512 xb = _mm512_set1_ps(xr[m][k]);
            for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_fmadd_ps(xb, wv[j], acc[m][j]);
          }
        }
        if (k1 < K) {
          for (int m = 0; m < MT; ++m)
            for (int j = 0; j < NB; ++j) _mm512_store_ps(sums[pass][m][j], acc[m][j]);
          continue;
        }
        for (int j = 0; j < blocks; ++j) {
          const int64_t n = (nb + j) * LANES;
          const __m512 b = bias != nullptr ? _mm512_loadu_ps(bias + n) : _mm512_setzero_ps();
          for (int m = 0; m < rows; ++m) _mm512_storeu_ps(y + (m0 + m) * N + n, _mm512_add_ps(acc[m][j], b));
        }
      }
    }
  }
}

// float32 on AVX2 and FMA: the same layout, each block's line read as two 256-bit halves, and
// sixteen registers for MT x NB x 2 sums, the weights and a broadcast (a weight used by one row
// only is read by the FMA itself). Written out as float32's is, for the same reason: its target.
template <int MT, int NB>
__attribute__((target("avx2,fma")))
void f32_tiles_avx2(const float* x, const float* packed, const float* bias, float* y, int64_t M, int64_t K,
                    int64_t N, int64_t nb0, int64_t nb1) {
  for (int64_t nb = nb0; nb < nb1; nb += NB) {
    const int blocks = static_cast<int>(std::min<int64_t>(NB, nb1 - nb));
    const float* w[NB];
    for (int j = 0; j < NB; ++j) w[j] = packed + (nb + std::min(j, blocks - 1)) * K * LANES;
    for (int64_t m0 = 0; m0 < M; m0 += MT) {
      const int rows = static_cast<int>(std::min<int64_t>(MT, M - m0));
      const float* xr[MT];
      for (int m = 0; m < MT; ++m) xr[m] = x + (m0 + std::min(m, rows - 1)) * K;
      constexpr int H = 2 * NB;  // halves
      __m256 acc[MT][H];
      for (int m = 0; m < MT; ++m)
        for (int h = 0; h < H; ++h) acc[m][h] = _mm256_setzero_ps();
      for (int64_t k = 0; k < K; ++k) {
        __m256 wv[H];
        for (int h = 0; h < H; ++h) wv[h] = _mm256_loadu_ps(w[h / 2] + k * LANES + 8 * (h % 2));
        for (int m = 0; m < MT; ++m) {
          const __m256 xb = _mm256_broadcast_ss(xr[m] + k);
          for (int h = 0; h < H; ++h) acc[m][h] = _mm256_fmadd_ps(xb, wv[h], acc[m][h]);
        }
      }
      // Constant bounds, the rest skipped: an index known only at run time would keep the sums in
      // memory, stored at every step of the loop above (a third of the speed at 256 rows).
      for (int h = 0; h < H; ++h) {
        if (h >= 2 * blocks) continue;
        const int64_t n = (nb + h / 2) * LANES + 8 * (h % 2);
        const __m256 b = bias != nullptr ? _mm256_loadu_ps(bias + n) : _mm256_setzero_ps();
        for (int m = 0; m < MT; ++m)
          if (m < rows) _mm256_storeu_ps(y + (m0 + m) * N + n, _mm256_add_ps(acc[m][h], b));
      }
    }
  }
}

// AMX: Linux hands a process the tiles' 8 KB of state only when asked (arch_prctl), once. A kernel
// (or a container's seccomp) may refuse: the tiles are then never used, and row_linear.py says so.
constexpr int ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
bool tiles_permitted() {
  static const bool permitted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  return permitted;
}

constexpr int64_t TILE_K = 32;  // inputs a tile multiply takes: sixteen pairs, a 64-byte line of a row

// The tile configuration (palette 1): tiles 0-3 the sums of two row tiles by two blocks, 4-5 the
// row tiles (up to sixteen rows of 32 inputs), 6-7 two blocks' weights (sixteen lines of pairs).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

__attribute__((target("amx-tile")))
void configure(int rows0, int rows1) {  // rows of the first and second row tile (0: none)
  TileConfig c;
  const int rows[2] = {rows0, rows1};
  for (int t = 0; t < 4; ++t) c.rows[t] = rows[t / 2] > 0 ? rows[t / 2] : 1, c.colsb[t] = LANES * 4;
  for (int t = 4; t < 6; ++t) c.rows[t] = rows[t - 4] > 0 ? rows[t - 4] : 1, c.colsb[t] = TILE_K * 2;
  for (int t = 6; t < 8; ++t) c.rows[t] = TILE_K / 2, c.colsb[t] = LANES * 4;
  _tile_loadconfig(&c);
}

// One 16 x 16 float32 sum, plus the bias, rounded into rows [m0, m0 + rows) of y's block at n.
__attribute__((target("avx512f,avx512bw,avx512bf16")))
void store_sums(const float* sums, const at::BFloat16* bias, at::BFloat16* y, int64_t N, int64_t m0, int rows,
                int64_t n) {
  const __m512 b = widened(bias, n);
  for (int m = 0; m < rows; ++m)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + (m0 + m) * N + n),
                        (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(_mm512_loadu_ps(sums + m * LANES), b)));
}

// Blocks [nb0, nb1) two at a time, all rows 32 at a time under each pair: a pair's weights
// (2 x 16 x K pairs) stay in L2 while every row passes over them, so each weight byte comes from
// memory once. K a multiple of 32 (the caller checks).
__attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16")))
void amx_bf16_tiles(const at::BFloat16* x, const at::BFloat16* packed, const at::BFloat16* bias, at::BFloat16* y,
                    int64_t M, int64_t K, int64_t N, int64_t nb0, int64_t nb1) {
  alignas(64) float sums[4][LANES * LANES];
  const int64_t stride = K * 2, block = K * LANES;  // bytes between rows of x; elements in a block
  int configured[2] = {-1, -1};
  for (int64_t nb = nb0; nb < nb1; nb += 2) {
    const bool pair = nb + 1 < nb1;
    const at::BFloat16* w0 = packed + nb * block;
    const at::BFloat16* w1 = pair ? w0 + block : w0;  // an odd block: its sums computed twice, one kept
    for (int64_t m0 = 0; m0 < M; m0 += 2 * LANES) {
      const int rows0 = static_cast<int>(std::min<int64_t>(LANES, M - m0));
      const int rows1 = static_cast<int>(std::clamp<int64_t>(M - m0 - LANES, 0, LANES));
      if (rows0 != configured[0] || rows1 != configured[1]) {
        configure(rows0, rows1);
        configured[0] = rows0, configured[1] = rows1;
      }
      const at::BFloat16* x0 = x + m0 * K;
      const at::BFloat16* x1 = rows1 > 0 ? x0 + LANES * K : x0;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t k = 0; k < K; k += TILE_K) {
        _tile_loadd(4, x0 + k, stride);
        _tile_loadd(5, x1 + k, stride);
        _tile_loadd(6, w0 + k * LANES, LANES * 4);
        _tile_loadd(7, w1 + k * LANES, LANES * 4);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, sums[0], LANES * 4);
      _tile_stored(1, sums[1], LANES * 4);
      _tile_stored(2, sums[2], LANES * 4);
      _tile_stored(3, sums[3], LANES * 4);
      store_sums(sums[0], bias, y, N, m0, rows0, nb * LANES);
      if (pair) store_sums(sums[1], bias, y, N, m0, rows0, (nb + 1) * LANES);
      if (rows1 > 0) {
        store_sums(sums[2], bias, y, N, m0 + LANES, rows1, nb * LANES);
        if (pair) store_sums(sums[3], bias, y, N, m0 + LANES, rows1, (nb + 1) * LANES);
      }
    }
  }
  _tile_release();
}

// The tile loops as types span and tiles take: the element type and the instruction set.
struct Bf16Avx512 {
  using T = at::BFloat16;
  template <int MT, int NB>
  static void run(const T* x, const T* w, const T* b, T* y, int64_t M, int64_t K, int64_t N, int64_t nb0, int64_t nb1) {
    bf16_tiles<MT, NB>(x, w, b, y, M, K, N, nb0, nb1);
  }
};
struct F32Avx512 {
  using T = float;
  template <int MT, int NB>
  static void run(const T* x, const T* w, const T* b, T* y, int64_t M, int64_t K, int64_t N, int64_t nb0, int64_t nb1) {
    f32_tiles<MT, NB>(x, w, b, y, M, K, N, nb0, nb1);
  }
};
struct F32Avx2 {
  using T = float;
  template <int MT, int NB>
  static void run(const T* x, const T* w, const T* b, T* y, int64_t M, int64_t K, int64_t N, int64_t nb0, int64_t nb1) {
    f32_tiles_avx2<MT, NB>(x, w, b, y, M, K, N, nb0, nb1);
  }
};

// Blocks [nb0, nb1) in tiles NB wide, the remainder in narrower ones: a tile wider than what is left
// would compute blocks again only to drop them (on a machine with many threads a thread's range can
// be one or two blocks: at 16 rows, where the arithmetic bounds the step, that cost 1.5x).
template <typename Tiles, int MT, int NB, typename T = typename Tiles::T>
void span(const T* x, const T* packed, const T* bias, T* y, int64_t M, int64_t K, int64_t N, int64_t nb0,
          int64_t nb1) {
  const int64_t whole = nb0 + (nb1 - nb0) / NB * NB;
  if (whole > nb0) Tiles::template run<MT, NB>(x, packed, bias, y, M, K, N, nb0, whole);
  if constexpr (NB > 1)
    if (whole < nb1) span<Tiles, MT, NB - 1>(x, packed, bias, y, M, K, N, whole, nb1);
}

// The output's units (blocks, or AMX's block pairs) over torch's threads (as set for the worker), so
// that every weight byte is read once whatever the rows: each thread takes the next piece of
// `step` units (a multiple of its tile's width) while any is left, PIECES_A_THREAD pieces a thread.
// Not a fixed range a thread: a thread that starts late, reads slower or loses its core for a
// while (a 2-core machine shares its cores with the frontend) leaves its last pieces to the others,
// where with halves the others waited for it at the end of every product (a one-stream decode
// step of Llama-3.2-1B's shape on 2 cores of a Xeon: the first thread ~5 % of its samples waiting
// at that barrier, perf). Same sums: a piece's outputs are computed as a range's were. A decode
// step's products of Qwen3-0.6B's shapes (the scratch timing above, 3 processes each in turns, a
// day the VM ran 30 % slower), medians of the processes' medians (their range), pieces against
// halves: float32 1 row 118 (112-125) against 130 (126-137) ms, 16 rows 177 (176-189) against 205
// (194-214); bf16 16 rows (AMX) 92 (87-93) against 96 (91-123); bf16 2 rows level, 77 and 77.
constexpr int64_t PIECES_A_THREAD = 8;

template <typename Body>
void in_pieces(int64_t units, int64_t width, const Body& body) {
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), units / width));
  const int64_t step = std::max<int64_t>(1, units / (threads * PIECES_A_THREAD) / width) * width;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t u0; (u0 = next.fetch_add(step, std::memory_order_relaxed)) < units;)
        body(u0, std::min(units, u0 + step));
  });
}

template <typename Tiles, int MT, int NB, typename T = typename Tiles::T>
void tiles(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias, at::Tensor& y) {
  const int64_t M = x.size(0), K = x.size(1), N = y.size(1);
  const T* xp = x.const_data_ptr<T>();
  const T* wp = packed.const_data_ptr<T>();
  const T* bp = bias.has_value() ? bias->const_data_ptr<T>() : nullptr;
  T* yp = y.data_ptr<T>();
  in_pieces(N / LANES, NB, [&](int64_t nb0, int64_t nb1) { span<Tiles, MT, NB>(xp, wp, bp, yp, M, K, N, nb0, nb1); });
}

// Tiles by rows: one row reads eight blocks at once (eight lines in flight); more rows share each
// block read among more registers. Measured on Qwen2.5-0.5B's shapes (row_linear.py).
template <typename Tiles>
void by_rows(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias, at::Tensor& y) {
  const int64_t M = x.size(0);
  if (M == 1) tiles<Tiles, 1, 8>(x, packed, bias, y);
  else if (M == 2) tiles<Tiles, 2, 6>(x, packed, bias, y);
  else if (M <= 4) tiles<Tiles, 4, 4>(x, packed, bias, y);
  else if (M <= 8) tiles<Tiles, 8, 2>(x, packed, bias, y);
  else tiles<Tiles, 8, 3>(x, packed, bias, y);
}

// AVX2's sixteen registers hold half the sums: one row six blocks (twelve halves), more rows fewer.
// Beyond four rows, 3 x 2 computed 8, 16 and 256 rows faster than 6 x 1, 2 x 3 and 4 x 1 (the
// shapes above, 2 threads of a Zen 4 EPYC).
template <>
void by_rows<F32Avx2>(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                      at::Tensor& y) {
  const int64_t M = x.size(0);
  if (M == 1) tiles<F32Avx2, 1, 6>(x, packed, bias, y);
  else if (M == 2) tiles<F32Avx2, 2, 3>(x, packed, bias, y);
  else if (M <= 4) tiles<F32Avx2, 4, 1>(x, packed, bias, y);
  else tiles<F32Avx2, 3, 2>(x, packed, bias, y);
}

// Many rows of bf16 on AMX's tiles: pieces of block pairs.
void amx_rows(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias, at::Tensor& y) {
  using T = at::BFloat16;
  const int64_t M = x.size(0), K = x.size(1), N = y.size(1), blocks = N / LANES;
  const T* xp = x.const_data_ptr<T>();
  const T* wp = packed.const_data_ptr<T>();
  const T* bp = bias.has_value() ? bias->const_data_ptr<T>() : nullptr;
  T* yp = y.data_ptr<T>();
  in_pieces((blocks + 1) / 2, 1, [&](int64_t p0, int64_t p1) {
    amx_bf16_tiles(xp, wp, bp, yp, M, K, N, 2 * p0, std::min(2 * p1, blocks));
  });
}

// The instruction set a call runs on, as row_linear.py's Isa numbers it.
enum class Isa : int64_t { AVX512 = 1, AVX2 = 2, AMX = 3 };

// From this many rows AMX's tiles compute a step faster than AVX-512's dot products (level at four,
// 2x at eight); below, a tile's sixteen rows are mostly empty and the dot products read faster.
constexpr int64_t AMX_ROWS = 4;

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

// A decode step's rows up to its last sequence's: the rows after it are idle (runner.py pads a step
// of one sequence to MIN_ROWS rows, as one row would be a shape compiled apart) and nobody reads
// their outputs: zeros, not computed. One row's tiles keep more weight lines in flight than two
// rows' (1 x 8 blocks against 2 x 6). 0: every row is live. Set around a decode step's forward
// (native.live_rows), read by every product in it.
std::atomic<int64_t> live_rows{0};

void set_live_rows(int64_t rows) {
  TORCH_CHECK(rows >= 0, "kit_rows.set_live_rows: a count of rows, not ", rows);
  live_rows.store(rows, std::memory_order_relaxed);
}

at::Tensor linear(const at::Tensor& input, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                  int64_t isa) {
  const auto dtype = packed.scalar_type();
  TORCH_CHECK(input.scalar_type() == dtype, "kit_rows.linear: input ", input.scalar_type(), ", weights ", dtype);
  const bool avx2 = isa == static_cast<int64_t>(Isa::AVX2), amx = isa == static_cast<int64_t>(Isa::AMX);
  TORCH_CHECK(isa == static_cast<int64_t>(Isa::AVX512) || (avx2 && dtype == at::kFloat) || (amx && dtype == at::kBFloat16),
              "kit_rows.linear: no kernel for instruction set ", isa, " in ", dtype);
  const int64_t K = packed.size(1) * packed.size(3), N = packed.size(0) * LANES;
  TORCH_CHECK(input.size(-1) == K, "kit_rows.linear: input of ", input.size(-1), " features, weights of ", K);
  const at::Tensor all = input.reshape({-1, K}).contiguous();
  const int64_t live = live_rows.load(std::memory_order_relaxed);
  const int64_t rows = live > 0 ? std::min(live, all.size(0)) : all.size(0);
  at::Tensor whole = rows < all.size(0) ? at::zeros({all.size(0), N}, all.options()) : at::empty({rows, N}, all.options());
  const at::Tensor x = all.narrow(0, 0, rows);
  at::Tensor y = whole.narrow(0, 0, rows);
  const c10::optional<at::Tensor> b = bias.has_value() ? c10::optional<at::Tensor>(bias->contiguous()) : bias;
  if (rows > 0) {
    if (amx && rows >= AMX_ROWS && K % TILE_K == 0 && tiles_permitted())
      amx_rows(x, packed, b, y);
    else if (dtype == at::kBFloat16)
      by_rows<Bf16Avx512>(x, packed, b, y);
    else if (avx2)
      by_rows<F32Avx2>(x, packed, b, y);
    else
      by_rows<F32Avx512>(x, packed, b, y);
  }
  auto shape = input.sizes().vec();
  shape.back() = N;
  return whole.view(shape);
}

// Layers held by key (linears.py's keys): a compiled graph calls `keyed_linear(x, key)` and the
// product starts here, with no Python between. Called through Python (kit::linear -> the key's
// kernel -> `linear`) a call cost 3 us more (a 32x16 weight, 2-core Xeon), 169 times a decode
// step of Qwen2.5-0.5B's shape. A layer is held for the process's life, as linears.KERNELS holds
// its kernel.
struct Held {
  at::Tensor packed;
  c10::optional<at::Tensor> bias;
  int64_t isa;
};
std::mutex held_lock;
std::vector<c10::optional<Held>> held;  // by key
std::atomic<int64_t> keyed_nanoseconds{0};  // inside keyed_linear's products, since the process began

void hold(int64_t key, const at::Tensor& packed, const c10::optional<at::Tensor>& bias, int64_t isa) {
  TORCH_CHECK(key >= 0, "kit_rows.hold: a key is not negative, not ", key);
  const std::lock_guard<std::mutex> lock(held_lock);
  if (static_cast<int64_t>(held.size()) <= key) held.resize(key + 1);
  held[key] = Held{packed, bias.has_value() ? c10::optional<at::Tensor>(bias->contiguous()) : bias, isa};
}

at::Tensor keyed_linear(const at::Tensor& input, int64_t key) {
  Held layer;
  {
    const std::lock_guard<std::mutex> lock(held_lock);
    TORCH_CHECK(key >= 0 && key < static_cast<int64_t>(held.size()) && held[key].has_value(),
                "kit_rows.keyed_linear: no layer held under key ", key);
    layer = *held[key];
  }
  const auto started = std::chrono::steady_clock::now();
  at::Tensor y = linear(input, layer.packed, layer.bias, layer.isa);
  keyed_nanoseconds += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count();
  return y;
}

// Seconds inside keyed_linear's products so far: what bench-decode's study counts as the kernels'.
double keyed_seconds() { return static_cast<double>(keyed_nanoseconds.load()) * 1e-9; }

}  // namespace

TORCH_LIBRARY(kit_rows, m) {
  m.def("pack(Tensor weight) -> Tensor", &pack);
  m.def("linear(Tensor input, Tensor packed, Tensor? bias, int isa) -> Tensor", &linear);
  m.def("tiles_permitted() -> bool", &tiles_permitted);
  m.def("set_live_rows(int rows) -> ()", &set_live_rows);
  m.def("hold(int key, Tensor packed, Tensor? bias, int isa) -> ()", &hold);
  m.def("keyed_linear(Tensor input, int key) -> Tensor");  // traced: its shapes from row_linear.py's fake
  m.def("keyed_seconds() -> float", &keyed_seconds);
}

TORCH_LIBRARY_IMPL(kit_rows, CPU, m) { m.impl("keyed_linear", &keyed_linear); }
