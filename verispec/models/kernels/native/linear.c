/* verispec's native linear kernel: y[t, n] = sum_k x[t, k] * W[n, k] (+ b[n]) for the few-row
 * products of decode and verify steps, with W stored as float32 or float16 in a packed layout
 * that one pass reads front to back.
 *
 * Packed layout of W [N, K] (N and K padded with zeros to multiples of 16):
 *   packed[b][c][j][l] = W[16 b + j, 16 c + l]      b < N/16, c < K/16, j < 16, l < 16
 * so the 16 rows of block b lie in one contiguous run, 16 columns at a time.
 *
 * Order of work in a block: x row 0 against all 16 rows at once (this pass streams the block
 * from memory in address order); then the other x rows, in tiles, against groups of the same
 * rows, now in cache, each weight vector converted once per tile.
 *
 * Row invariance: each output is one accumulator (16 lanes, or 2 x 8 on AVX2) that adds the
 * products of its 16-column chunks in column order, then is reduced by one fixed sequence;
 * rows of x never share an accumulator. A row's result therefore does not depend on how many
 * rows the call has, nor on its place among them: a verify row is bit-for-bit the decode step
 * of the same input.
 *
 * Threads: one OpenMP loop over the blocks. Built with -fopenmp, the library links the libgomp
 * that torch has already loaded (same soname), so torch and this kernel share one pool.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "verispec.h"

#define R 16 /* weight rows per block = columns per chunk */
#define INLINE static inline __attribute__((always_inline))

/* ---------------------------------------------------------------- AVX-512 (16 lanes) */

#define AVX512 __attribute__((target("avx512f,avx512bw,f16c,fma")))

AVX512 INLINE __m512 w16_f32(const float *w) { return _mm512_loadu_ps(w); }
AVX512 INLINE __m512 w16_f16(const uint16_t *w) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)w));
}

/* The sums of 16 accumulators a[j * stride + i] (j, i < 4) in one vector, lane 4 i + j holding
 * a[j * stride + i]'s: each summed by the very sequence of _mm512_reduce_add_ps (halves of 256,
 * then 128 bits, then lanes 0 + 2 and 1 + 3, then those two), so a sum does not depend on
 * which routine reduced it; 30 shuffles and 15 additions in place of 16 such reductions. */
AVX512 INLINE __m512 reduce16(const __m512 *a, const int stride) {
  __m512 s[8], u[4], v[2];
  _Pragma("GCC unroll 8") for (int m = 0; m < 8; m++) { /* a_(2m), a_(2m+1): their 256-bit halves */
    const __m512 p = a[(2 * m / 4) * stride + (2 * m) % 4];
    const __m512 q = a[((2 * m + 1) / 4) * stride + (2 * m + 1) % 4];
    s[m] = _mm512_add_ps(_mm512_shuffle_f32x4(p, q, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(p, q, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  _Pragma("GCC unroll 4") for (int m = 0; m < 4; m++) /* then their 128-bit halves */
    u[m] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * m], s[2 * m + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(s[2 * m], s[2 * m + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  _Pragma("GCC unroll 2") for (int m = 0; m < 2; m++) /* lanes 0 + 2 and 1 + 3 */
    v[m] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * m], u[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(u[2 * m], u[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* y[t0 + i, n0 + g + j] = the sum of acc[j * stride + i] (+ bias) for j < G, i < TN, weight
 * rows past `rows` left out: a full 4 x 4 tile by reduce16, others one reduce_add_ps each. */
AVX512 INLINE void store_sums(const __m512 *acc, const int stride, const float *bias, float *y,
                              int64_t ldy, int64_t n0, int64_t rows, int64_t t0, const int g,
                              const int G, const int TN) {
  if (G == 4 && TN == 4 && g + 4 <= rows) {
    const __m512 z = reduce16(acc, stride);
    const __m128 b = bias ? _mm_loadu_ps(bias + n0 + g) : _mm_setzero_ps();
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
      const __m128 s = _mm512_extractf32x4_ps(z, i); /* row t0 + i, weight rows g .. g + 3 */
      _mm_storeu_ps(y + (t0 + i) * ldy + n0 + g, bias ? _mm_add_ps(s, b) : s);
    }
    return;
  }
  _Pragma("GCC unroll 16") for (int j = 0; j < G; j++) {
    const int64_t n = n0 + g + j;
    if (g + j >= rows) break;
    _Pragma("GCC unroll 6") for (int i = 0; i < TN; i++) {
      const float s = _mm512_reduce_add_ps(acc[j * stride + i]);
      y[(t0 + i) * ldy + n] = bias ? s + bias[n] : s;
    }
  }
}

/* Rows t0 .. t0 + TN - 1 of x against weight rows g .. g + G - 1 of the block at wb. */
#define TILE512(NAME, WT, LOAD)                                                            \
  AVX512 INLINE void NAME(const float *x, const WT *wb, const float *bias, float *y,       \
                          int64_t K, int64_t ldy, int64_t n0, int64_t rows, int64_t t0,    \
                          const int g, const int G, const int TN) {                        \
    __m512 acc[16][6];                                                                     \
    _Pragma("GCC unroll 16") for (int j = 0; j < G; j++)                                   \
      _Pragma("GCC unroll 6") for (int i = 0; i < TN; i++) acc[j][i] = _mm512_setzero_ps(); \
    for (int64_t k = 0; k < K; k += R) {                                                   \
      /* one row: the next block's chunk k into L2 (schedule(static) gives a thread        \
       * consecutive blocks) while this one computes: a decode step 3-6% faster */         \
      if (G == 16)                                                                         \
        for (int l = 0; l < R * R * (int)sizeof(WT); l += 64)                              \
          _mm_prefetch((const char *)(wb + R * K + k * R) + l, _MM_HINT_T1);               \
      __m512 xv[6];                                                                        \
      _Pragma("GCC unroll 6") for (int i = 0; i < TN; i++)                                 \
        xv[i] = _mm512_loadu_ps(x + (t0 + i) * K + k);                                     \
      const WT *wk = wb + k * R + R * g;                                                   \
      _Pragma("GCC unroll 16") for (int j = 0; j < G; j++) {                               \
        const __m512 wv = LOAD(wk + R * j);                                                \
        _Pragma("GCC unroll 6") for (int i = 0; i < TN; i++)                               \
          acc[j][i] = _mm512_fmadd_ps(wv, xv[i], acc[j][i]);                               \
      }                                                                                    \
    }                                                                                      \
    store_sums(&acc[0][0], 6, bias, y, ldy, n0, rows, t0, g, G, TN);                      \
  }

/* One block of 16 weight rows against all T rows of x. */
#define BLOCK512(NAME, TILE, WT)                                                           \
  AVX512 INLINE void NAME(const float *x, const WT *wb, const float *bias, float *y,       \
                          int64_t T, int64_t K, int64_t ldy, int64_t n0, int64_t rows) {   \
    TILE(x, wb, bias, y, K, ldy, n0, rows, 0, 0, 16, 1);                                   \
    for (int g = 0; g < R; g += 4) {                                                       \
      int64_t t0 = 1;                                                                      \
      for (; t0 + 6 <= T; t0 += 6) TILE(x, wb, bias, y, K, ldy, n0, rows, t0, g, 4, 6);    \
      switch (T - t0) {                                                                    \
        case 5: TILE(x, wb, bias, y, K, ldy, n0, rows, t0, g, 4, 5); break;                \
        case 4: TILE(x, wb, bias, y, K, ldy, n0, rows, t0, g, 4, 4); break;                \
        case 3: TILE(x, wb, bias, y, K, ldy, n0, rows, t0, g, 4, 3); break;                \
        case 2: TILE(x, wb, bias, y, K, ldy, n0, rows, t0, g, 4, 2); break;                \
        case 1: TILE(x, wb, bias, y, K, ldy, n0, rows, t0, g, 4, 1); break;                \
        default: break;                                                                    \
      }                                                                                    \
    }                                                                                      \
  }

/* A whole product: the blocks shared out over the threads. */
#define KERNEL(TARGET, NAME, BLOCK, WT)                                                       \
  TARGET static void NAME(const float *x, const WT *w, const float *bias, float *y,        \
                          int64_t T, int64_t N, int64_t K, int64_t ldy, int threads) {     \
    const int64_t blocks = (N + R - 1) / R;                                                \
    _Pragma("omp parallel for schedule(static) num_threads(threads)")                     \
    for (int64_t b = 0; b < blocks; b++) {                                                 \
      const int64_t n0 = b * R, rows = N - n0 < R ? N - n0 : R;                            \
      BLOCK(x, w + b * R * K, bias, y, T, K, ldy, n0, rows);                               \
    }                                                                                      \
  }

TILE512(tile_f32_avx512, float, w16_f32)
TILE512(tile_f16_avx512, uint16_t, w16_f16)
BLOCK512(block_f32_avx512, tile_f32_avx512, float)
BLOCK512(block_f16_avx512, tile_f16_avx512, uint16_t)
KERNEL(AVX512, linear_f32_avx512, block_f32_avx512, float)
KERNEL(AVX512, linear_f16_avx512, block_f16_avx512, uint16_t)

/* ---------------------------------------------------------- AVX2 + F16C (2 x 8 lanes) */

#define AVX2 __attribute__((target("avx2,f16c,fma")))

AVX2 INLINE __m256 w8_f32(const float *w) { return _mm256_loadu_ps(w); }
AVX2 INLINE __m256 w8_f16(const uint16_t *w) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w));
}
AVX2 INLINE float reduce8(__m256 lo8, __m256 hi8) {
  const __m256 v = _mm256_add_ps(lo8, hi8);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

/* AVX2 has 16 vector registers: a tile is at most 8 accumulator pairs (G x TN <= 8... with
 * G = 8, TN = 1 for row 0; G = 2, TN = 2 for the rest). */
#define TILE256(NAME, WT, LOAD)                                                            \
  AVX2 INLINE void NAME(const float *x, const WT *wb, const float *bias, float *y,         \
                        int64_t K, int64_t ldy, int64_t n0, int64_t rows, int64_t t0,      \
                        const int g, const int G, const int TN) {                          \
    __m256 lo[8][2], hi[8][2];                                                             \
    _Pragma("GCC unroll 8") for (int j = 0; j < G; j++)                                    \
      _Pragma("GCC unroll 2") for (int i = 0; i < TN; i++)                                 \
        lo[j][i] = hi[j][i] = _mm256_setzero_ps();                                         \
    for (int64_t k = 0; k < K; k += R) {                                                   \
      __m256 x0[2], x1[2];                                                                 \
      _Pragma("GCC unroll 2") for (int i = 0; i < TN; i++) {                               \
        x0[i] = _mm256_loadu_ps(x + (t0 + i) * K + k);                                     \
        x1[i] = _mm256_loadu_ps(x + (t0 + i) * K + k + 8);                                 \
      }                                                                                    \
      const WT *wk = wb + k * R + R * g;                                                   \
      _Pragma("GCC unroll 8") for (int j = 0; j < G; j++) {                                \
        const __m256 w0 = LOAD(wk + R * j), w1 = LOAD(wk + R * j + 8);                     \
        _Pragma("GCC unroll 2") for (int i = 0; i < TN; i++) {                             \
          lo[j][i] = _mm256_fmadd_ps(w0, x0[i], lo[j][i]);                                 \
          hi[j][i] = _mm256_fmadd_ps(w1, x1[i], hi[j][i]);                                 \
        }                                                                                  \
      }                                                                                    \
    }                                                                                      \
    _Pragma("GCC unroll 8") for (int j = 0; j < G; j++) {                                  \
      const int64_t n = n0 + g + j;                                                        \
      if (g + j >= rows) break;                                                            \
      _Pragma("GCC unroll 2") for (int i = 0; i < TN; i++) {                               \
        const float s = reduce8(lo[j][i], hi[j][i]);                                       \
        y[(t0 + i) * ldy + n] = bias ? s + bias[n] : s;                                    \
      }                                                                                    \
    }                                                                                      \
  }

#define BLOCK256(NAME, TILE, WT)                                                           \
  AVX2 INLINE void NAME(const float *x, const WT *wb, const float *bias, float *y,         \
                        int64_t T, int64_t K, int64_t ldy, int64_t n0, int64_t rows) {     \
    TILE(x, wb, bias, y, K, ldy, n0, rows, 0, 0, 8, 1);                                    \
    TILE(x, wb, bias, y, K, ldy, n0, rows, 0, 8, 8, 1);                                    \
    for (int g = 0; g < R; g += 2) {                                                       \
      int64_t t0 = 1;                                                                      \
      for (; t0 + 2 <= T; t0 += 2) TILE(x, wb, bias, y, K, ldy, n0, rows, t0, g, 2, 2);    \
      if (t0 < T) TILE(x, wb, bias, y, K, ldy, n0, rows, t0, g, 2, 1);                     \
    }                                                                                      \
  }

TILE256(tile_f32_avx2, float, w8_f32)
TILE256(tile_f16_avx2, uint16_t, w8_f16)
BLOCK256(block_f32_avx2, tile_f32_avx2, float)
BLOCK256(block_f16_avx2, tile_f16_avx2, uint16_t)
KERNEL(AVX2, linear_f32_avx2, block_f32_avx2, float)
KERNEL(AVX2, linear_f16_avx2, block_f16_avx2, uint16_t)

/* ------------------------------------------- affine 8-bit codes: w = d * q + m, exactly */

/* Codes layout for W [N, K] (N padded to 16, K to 32): codes[b][c][j][l] = q of W[16 b + j,
 * 32 c + l] (int8), scales[b][c][0][j] = d and scales[b][c][1][j] = m of that row's 32 columns
 * (float32). fma(d, q, m) is d * q + m rounded once; the loader (affine.affine_codes)
 * only uses codes where d * q is exact in float32 and the result equals the weight bit for bit,
 * so this reads the very same weights in 1.25 bytes each (GGUF Q4_1 and Q8_0 blocks dequantized
 * to float32 are of this form). Per output: one accumulator, each 32-column chunk added as its
 * first 16 then its last 16 columns (AVX2: 4 x 8, alternating two accumulators). */

#define QC 32 /* columns per chunk */
#define UNPACK_ROWS 32 /* rows of x from which a block is unpacked once (AVX-512) */
#define MODE_NIB(mode) ((mode) == 1 || (mode) == 3 || (mode) == 6) /* two codes a byte */
/* scales stored otherwise than as float32 d and m, converted once a block */
#define MODE_WIDEN(mode) ((mode) == 1 || (mode) == 2 || (mode) == 6 || (mode) == 7)
/* The tiles' scale layout (g16): 0 = d and m each 32 columns, [C][2][16]; 1 = Q8_F32_DM_HALVES's d
 * and m each 16 columns, [C][4][16]; 2 = Q8_F32_D_HALVES's d alone each 16 columns, [C][2][16], m =
 * 0. */
#define MODE_G16(mode) ((mode) == 4 ? 1 : (mode) == 5 || (mode) == 7 ? 2 : 0)
#define SCALE_STRIDE(g16) ((g16) == 1 ? 4 * R : 2 * R) /* floats a chunk */
#define SCALE_HIGH(g16) ((g16) == 1 ? 2 * R : (g16) == 2 ? R : 0) /* the last 16 columns' d */

/* Q4_F16_DM is Q8_F32_DM with every code in 0..15 (GGUF Q4_1 blocks), two codes a byte, and d, m
 * stored as float16 (GGUF's own, so exactly): 0.625 bytes a weight instead of 1.25. A chunk's
 * 16 rows are 4 vectors of 16 32-bit lanes: lane l of vector v holds 8 codes, columns l and
 * 16 + l of rows 4 v .. 4 v + 3, row 4 v + r's in bits 8 r .. 8 r + 3 (column l) and 8 r + 4
 * .. 8 r + 7 (column 16 + l). So one shift puts any 16 codes of a row in the lanes' low bits,
 * where vpermps reads its index: codes[b][c][v][l][r] = q(16 b + 4 v + r, 32 c + l) | q(16 b +
 * 4 v + r, 32 c + 16 + l) << 4. Q8_F16_D is Q8_F32_DM with every m
 * 0 (GGUF Q8_0 blocks) and only d stored, as float16: 1.0625 bytes a weight. Their weights are
 * the same values, built by the same fma(d, q, m) from the same d and m (converted to float32
 * once a block, 0 for Q8_F16_D's m), so every product gives Q8_F32_DM's bits. With 4-bit codes a
 * tile of one or two rows looks each weight up in a table of the 16 a chunk's row can take
 * (lut16) instead of converting its code; in larger tiles the rows share each conversion and
 * the table does not pay. SmolLM2 float32 (Q4_F16_DM layers) against Q8_F32_DM in one process, 256
 * cached tokens: decode 0.73, 2 rows 0.82, 4 rows 0.83, 8 rows 0.88 of the time. */

/* GGUF K-quants: their d and m are products of float16 values (Q4_K: d16 * scale, -dmin16 *
 * min), not float16 values themselves. Q4_F32_DM is Q4_F16_DM's codes with Q8_F32_DM's float32
 * scales (GGUF Q4_K: 0.75 bytes a weight). Q8_F32_DM_HALVES is Q8_F32_DM's codes with float32 d and
 * m for each 16 columns (GGUF Q6_K's sub-blocks): scales[b][c][2 h][j] = d and scales[b][c][2 h +
 * 1][j] = m of row 16 b + j's columns 32 c + 16 h .. 32 c + 16 h + 15 (1.5 bytes a weight);
 * Q8_F32_D_HALVES is Q8_F32_DM_HALVES with every m 0 and only d stored, scales[b][c][h][j] (1.25
 * bytes a weight). Each is computed by the very operations of Q8_F32_DM (Q8_F32_D_HALVES's m a zero
 * vector), so Q4_F32_DM gives Q8_F32_DM's bits, Q8_F32_DM_HALVES too where a chunk's two halves
 * share d and m, and Q8_F32_D_HALVES Q8_F32_DM_HALVES's with m 0. */

/* The codes of columns 16 h .. 16 h + 15 of row g + j of the chunk at qc (g a multiple of 4), in
 * 32-bit lanes: Q8_F32_DM's and Q8_F16_D's bytes widened; Q4_F16_DM's (nib) in the lanes' low 4
 * bits, above them other codes. Q4_F16_DM's row 4 v + r is the vector's byte r (a byte shift,
 * which runs beside the multiply-adds), its high halves the vector shifted by 4 bits once for its
 * 4 rows. */
AVX512 INLINE __m512i codes16(const int8_t *qc, const int g, const int j, const int h,
                              const int nib) {
  if (!nib)
    return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qc + (g + j) * QC + 16 * h)));
  const __m512i v = _mm512_loadu_si512(qc + (g + j) / 4 * 64);
  const __m512i s = h ? _mm512_srli_epi32(v, 4) : v;
  switch (j % 4) {
    case 1: return _mm512_bsrli_epi128(s, 1);
    case 2: return _mm512_bsrli_epi128(s, 2);
    case 3: return _mm512_bsrli_epi128(s, 3);
    default: return s;
  }
}

AVX512 INLINE __m512 q16(__m512i q, __m512 d, __m512 m, const int nib) {
  if (nib) q = _mm512_and_si512(q, _mm512_set1_epi32(0x0F));
  return _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(q), m);
}

/* The weights of 16 codes in 0..15 (codes16's lanes; vpermps reads only their low 4 bits) from
 * the table of fma(d, i, m), i = 0..15: q16's values. */
AVX512 INLINE __m512 lut16(const __m512i q, __m512 table) {
  return _mm512_permutexvar_ps(q, table);
}

#define Q6_CHUNK_BYTES (R * QC * 3 / 4) /* Q6_SUPER_D's codes a chunk (see widen_q6) */
AVX512 INLINE void unpack_q6_avx512(const int8_t *in, int8_t *out, int64_t C);

/* sb: the block's scales as float32; next and next_scales: the next block's codes and scales
 * as stored, code_line and line bytes a chunk; nib: Q4_F16_DM's or Q4_F32_DM's codes, two a byte
 * (one or two rows look their weights up); g16: the scales' layout (MODE_G16: Q8_F32_DM_HALVES's or
 * Q8_F32_D_HALVES's d for each 16 columns). Q8_F32_D_HALVES's m is a zero vector in the same fma,
 * so it computes Q8_F32_DM_HALVES's bits for m = 0. q6: cb is Q6_SUPER_D's codes as stored, each
 * chunk unpacked into Q8_F32_D_HALVES's in L1 as the tile reaches it (one row of x: the tile then
 * covers the block, so every chunk is unpacked once). */
AVX512 INLINE void tile_q8_avx512(const float *x, const int8_t *cb, const float *sb,
                                  const float *bias, float *y, int64_t K, int64_t ldy,
                                  int64_t n0, int64_t rows, int64_t t0, const int g,
                                  const int G, const int TN, const int8_t *next,
                                  const char *next_scales, const int64_t line,
                                  const int64_t code_line, const int nib, const int g16,
                                  const int q6) {
  const int RB = nib ? QC / 2 : QC; /* bytes of a chunk's row */
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 acc[16][4];
  _Pragma("GCC unroll 16") for (int j = 0; j < G; j++)
    _Pragma("GCC unroll 4") for (int i = 0; i < TN; i++) acc[j][i] = _mm512_setzero_ps();
  const int64_t chunks = K / QC;
  for (int64_t c = 0; c < chunks; c++) {
    const int8_t *qc = cb + c * R * RB;
    int8_t six[R * QC] __attribute__((aligned(64))); /* q6: chunk c, Q8_F32_D_HALVES's codes */
    if (q6) {
      unpack_q6_avx512(cb + c * Q6_CHUNK_BYTES, six, 1);
      qc = six;
    }
    const float *sc = sb + c * SCALE_STRIDE(g16);
    if (next) { /* the next block's chunk c into L2, while this one computes from cache */
      _Pragma("GCC unroll 8") for (int l = 0; l < code_line; l += 64)
        _mm_prefetch((const char *)(next + c * code_line + l), _MM_HINT_T1);
      for (int64_t l = 0; l < line; l += 64)
        _mm_prefetch(next_scales + c * line + l, _MM_HINT_T1);
    }
    __m512 x0[4], x1[4];
    _Pragma("GCC unroll 4") for (int i = 0; i < TN; i++) {
      x0[i] = _mm512_loadu_ps(x + (t0 + i) * K + c * QC);
      x1[i] = _mm512_loadu_ps(x + (t0 + i) * K + c * QC + 16);
    }
    _Pragma("GCC unroll 16") for (int j = 0; j < G; j++) {
      const __m512 d = _mm512_set1_ps(sc[g + j]);
      const __m512 m = g16 == 2 ? _mm512_setzero_ps() : _mm512_set1_ps(sc[R + g + j]);
      const __m512i q0 = codes16(qc, g, j, 0, nib), q1 = codes16(qc, g, j, 1, nib);
      __m512 w0, w1;
      if (nib && TN <= 2) {
        const __m512 table = _mm512_fmadd_ps(d, iota, m);
        w0 = lut16(q0, table), w1 = lut16(q1, table);
      } else if (g16) {
        const float *hi = sc + SCALE_HIGH(g16);
        w0 = q16(q0, d, m, 0);
        w1 = q16(q1, _mm512_set1_ps(hi[g + j]),
                 g16 == 2 ? _mm512_setzero_ps() : _mm512_set1_ps(hi[R + g + j]), 0);
      } else {
        w0 = q16(q0, d, m, nib), w1 = q16(q1, d, m, nib);
      }
      _Pragma("GCC unroll 4") for (int i = 0; i < TN; i++) {
        acc[j][i] = _mm512_fmadd_ps(w0, x0[i], acc[j][i]);
        acc[j][i] = _mm512_fmadd_ps(w1, x1[i], acc[j][i]);
      }
    }
  }
  store_sums(&acc[0][0], 4, bias, y, ldy, n0, rows, t0, g, G, TN);
}

/* A block's codes as float32 in the float32 packed layout: the very values the code tiles
 * compute, so the float32 block routine gives every row exactly what they would. Pays for
 * prefill-sized calls (the conversion is shared by all rows), not for verify-sized ones. */
AVX512 INLINE void unpack_q8_avx512(const int8_t *cb, const float *sb, float *out, int64_t K,
                                    const int nib, const int g16) {
  const int RB = nib ? QC / 2 : QC, S = SCALE_STRIDE(g16), H = SCALE_HIGH(g16);
  for (int64_t c = 0; c < K / QC; c++)
    _Pragma("GCC unroll 16") for (int j = 0; j < R; j++) {
      const __m512 zero = _mm512_setzero_ps();
      const __m512 d0 = _mm512_set1_ps(sb[c * S + j]), d1 = _mm512_set1_ps(sb[c * S + H + j]);
      const __m512 m0 = g16 == 2 ? zero : _mm512_set1_ps(sb[c * S + R + j]);
      const __m512 m1 = g16 == 2 ? zero : _mm512_set1_ps(sb[c * S + H + R + j]);
      const int8_t *qc = cb + c * R * RB;
      _mm512_storeu_ps(out + (2 * c) * R * R + j * R, q16(codes16(qc, 0, j, 0, nib), d0, m0, nib));
      _mm512_storeu_ps(out + (2 * c + 1) * R * R + j * R,
                       q16(codes16(qc, 0, j, 1, nib), d1, m1, nib));
    }
}

#define Q8_TILE(T0, G, TN, NIB)                                                          \
  tile_q8_avx512(x, cb, sf, bias, y, K, ldy, n0, rows, T0, g, G, TN, next, next_scales, line, \
                 code_line, NIB, g16, 0)

/* GGUF Q4_K's scales as the file stores them (Q4_SUPER_DM and Q4_SUPER_A8): d = d16 sc and m =
 * -dmin mn, d16 and dmin float16 values per 256 columns, sc and mn 6-bit integers per 32. A block's
 * scales are, for each 256 columns s, SUPER_BYTES bytes: d16 of its 16 rows (float16), then
 * -dmin (float16, negated exactly), then for each of its 8 chunks sc of the 16 rows and mn of
 * the 16 rows (uint8). 40 bytes a chunk instead of 128: 0.578 bytes a weight instead of 0.75.
 * Each product d16 sc is exact in float32 (11 + 6 significant bits), and (-dmin) mn is
 * -(dmin mn) exactly, so the widened d and m are Q4_F32_DM's float32 values bit for bit. */
#define SUPER_CHUNKS 8
#define SUPER_BYTES (4 * R + SUPER_CHUNKS * 2 * R)

/* A block's super scales (in, C chunks) as float32 d and m (out [C][2][16], Q4_F32_DM's). */
AVX2 INLINE void widen_super(const uint8_t *in, float *out, int64_t C) {
  for (int64_t c = 0; c < C; c++) {
    const uint8_t *s = in + (c / SUPER_CHUNKS) * SUPER_BYTES;
    const uint8_t *sub = s + 4 * R + (c % SUPER_CHUNKS) * 2 * R;
    for (int h = 0; h < 2; h++) /* d, then m */
      for (int i = 0; i < R; i += 8) {
        const __m256 whole = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 2 * (h * R + i))));
        const __m256 part = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
            (const __m128i *)(sub + h * R + i))));
        _mm256_storeu_ps(out + 2 * R * c + h * R + i, _mm256_mul_ps(whole, part));
      }
  }
}

/* GGUF Q6_K as the file stores it (Q6_SUPER_D): 6-bit codes u = q + 32 as a plane of their low 4
 * bits and one of their high 2 (Q6_CHUNK_BYTES a chunk; blocks.c's verispec_pack_q6 gives the
 * layout), and d = d16 sc, d16 a float16 value per 256 columns, sc an int8 per 16. A block's
 * scales are, for each 256 columns s, Q6_SUPER_BYTES bytes: d16 of its 16 rows (float16), then
 * for each of its 8 chunks sc of the 16 rows for the chunk's first 16 columns, then for its
 * last 16. 0.8203 bytes a weight, as in the file, instead of Q8_F32_D_HALVES's 1.25. A block's
 * codes are unpacked once into Q8_F32_D_HALVES's (q = u - 32, a byte each) and its scales widened
 * into Q8_F32_D_HALVES's float32 d (d16 sc: 11 + 8 significant bits, exact in float32, as blocks.c
 * computes Q8_F32_D_HALVES's d), then Q8_F32_D_HALVES's tiles run on them: Q8_F32_D_HALVES's
 * products, bit for bit. */
#define Q6_SUPER_BYTES (2 * R + SUPER_CHUNKS * 2 * R)

/* A block's Q6_K scales (in, C chunks) as Q8_F32_D_HALVES's float32 d (out [C][2][16]: the 16 rows'
 * d of the chunk's first 16 columns, then of its last 16). */
AVX2 INLINE void widen_q6(const uint8_t *in, float *out, int64_t C) {
  for (int64_t c = 0; c < C; c++) {
    const uint8_t *s = in + (c / SUPER_CHUNKS) * Q6_SUPER_BYTES;
    const uint8_t *sub = s + 2 * R + (c % SUPER_CHUNKS) * 2 * R;
    for (int i = 0; i < 2 * R; i += 8) {
      const __m256 whole = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 2 * (i % R))));
      const __m256 part = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
          (const __m128i *)(sub + i))));
      _mm256_storeu_ps(out + 2 * R * c + i, _mm256_mul_ps(whole, part));
    }
  }
}

/* A block's Q6_SUPER_D codes (in, C chunks) as Q8_F32_D_HALVES's (out, R * QC bytes a chunk): each
 * 64 of them (u & 15 | (u >> 4) << 4) - 32 from one vector of each plane, shifted into place. */
AVX512 INLINE void unpack_q6_avx512(const int8_t *in, int8_t *out, int64_t C) {
  const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8(0x30);
  const __m512i half = _mm512_set1_epi8(32);
  for (int64_t c = 0; c < C; c++) {
    const int8_t *p = in + c * Q6_CHUNK_BYTES;
    int8_t *o = out + c * R * QC;
    const __m512i h0 = _mm512_loadu_si512(p + 4 * 64), h1 = _mm512_loadu_si512(p + 5 * 64);
    _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) {
      const __m512i l = _mm512_loadu_si512(p + 64 * v);
      _Pragma("GCC unroll 2") for (int n = 0; n < 2; n++) { /* Q8_F32_D_HALVES's bytes 64 k .. */
        const int k = 2 * v + n, f = k % 4;
        const __m512i a = n ? _mm512_srli_epi16(l, 4) : l, w = k < 4 ? h0 : h1;
        const __m512i two = f == 0   ? _mm512_slli_epi16(w, 4)
                            : f == 1 ? _mm512_slli_epi16(w, 2)
                            : f == 2 ? w
                                     : _mm512_srli_epi16(w, 2); /* field f at bits 4, 5 */
        const __m512i u = _mm512_ternarylogic_epi32(a, _mm512_and_si512(two, high), low,
                                                    0xEC); /* (a & low) | two's bits 4, 5 */
        _mm512_storeu_si512(o + 64 * k, _mm512_sub_epi8(u, half));
      }
    }
  }
}

/* The same with 32-byte vectors: each plane vector's bytes 0-31, then 32-63. */
AVX2 INLINE void unpack_q6_avx2(const int8_t *in, int8_t *out, int64_t C) {
  const __m256i low = _mm256_set1_epi8(0x0F), high = _mm256_set1_epi8(0x30);
  const __m256i half = _mm256_set1_epi8(32);
  for (int64_t c = 0; c < C; c++) {
    const int8_t *p = in + c * Q6_CHUNK_BYTES;
    int8_t *o = out + c * R * QC;
    for (int e = 0; e < 64; e += 32) {
      const __m256i h0 = _mm256_loadu_si256((const __m256i *)(p + 4 * 64 + e));
      const __m256i h1 = _mm256_loadu_si256((const __m256i *)(p + 5 * 64 + e));
      _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) {
        const __m256i l = _mm256_loadu_si256((const __m256i *)(p + 64 * v + e));
        _Pragma("GCC unroll 2") for (int n = 0; n < 2; n++) {
          const int k = 2 * v + n, f = k % 4;
          const __m256i a = n ? _mm256_srli_epi16(l, 4) : l, w = k < 4 ? h0 : h1;
          const __m256i two = f == 0   ? _mm256_slli_epi16(w, 4)
                              : f == 1 ? _mm256_slli_epi16(w, 2)
                              : f == 2 ? w
                                       : _mm256_srli_epi16(w, 2);
          const __m256i u = _mm256_or_si256(_mm256_and_si256(a, low),
                                            _mm256_and_si256(two, high));
          _mm256_storeu_si256((__m256i *)(o + 64 * k + e), _mm256_sub_epi8(u, half));
        }
      }
    }
  }
}

/* Bytes of a chunk's codes as stored: two a byte (modes 1, 3, 6), Q6_SUPER_D's planes (mode 7),
 * else a byte each. */
#define CHUNK_CODE_BYTES(mode) (MODE_NIB(mode) ? R * QC / 2 : (mode) == 7 ? Q6_CHUNK_BYTES : R * QC)

/* Bytes of a chunk's scales as stored: Q8_F32_DM's float32 d and m (mode 0), Q4_F16_DM's float16 d
 * and m (mode 1), Q8_F16_D's float16 d (mode 2), Q4_F32_DM's float32 d and m (mode 3, as
 * Q8_F32_DM), Q8_F32_DM_HALVES's float32 d and m for each 16 columns (mode 4), Q8_F32_D_HALVES's
 * float32 d for each 16 columns (mode 5), Q4_SUPER_DM's super scales (mode 6: SUPER_BYTES for 8
 * chunks), Q6_SUPER_D's (mode 7: Q6_SUPER_BYTES for 8 chunks). */
INLINE int64_t chunk_scale_bytes(const int mode) {
  static const int64_t bytes[8] = {2 * R * 4, 2 * R * 2, R * 2,    2 * R * 4,
                                   4 * R * 4, 2 * R * 4, SUPER_BYTES / SUPER_CHUNKS,
                                   Q6_SUPER_BYTES / SUPER_CHUNKS};
  return bytes[mode];
}

/* A block's float16 scales (mode 1 or 2, as stored at in) as float32 d and m (out [C][2][16]),
 * Q8_F16_D's m being 0. */
AVX2 INLINE void widen_scales(const uint16_t *in, float *out, int64_t C, const int mode) {
  const int64_t stored = chunk_scale_bytes(mode) / 2; /* float16 values a chunk */
  for (int64_t c = 0; c < C; c++)
    for (int64_t i = 0; i < 2 * R; i += 8)
      _mm256_storeu_ps(out + 2 * R * c + i,
                       i < stored ? _mm256_cvtph_ps(_mm_loadu_si128(
                                        (const __m128i *)(in + stored * c + i)))
                                  : _mm256_setzero_ps());
}

/* Block b of a product over codes (mode: 0 = Q8_F32_DM, float32 d and m; 1 = Q4_F16_DM, float16 d
 * and m, two codes in 0..15 a byte; 2 = Q8_F16_D, float16 d, m = 0; 3 = Q4_F32_DM, Q4_F16_DM's
 * codes with Q8_F32_DM's scales; 4 = Q8_F32_DM_HALVES, float32 d and m for each 16 columns; 5 =
 * Q8_F32_D_HALVES, float32 d for each 16 columns, m = 0; 6 = Q4_SUPER_DM, Q4_F32_DM's codes with
 * super scales; 7 = Q6_SUPER_D, unpacked into Q8_F32_D_HALVES's codes and d). converted: room
 * for a block's scales as float32 (modes 1, 2, 6 and 7), then for Q6_SUPER_D its codes as
 * Q8_F32_D_HALVES's; scratch: room for a block as float32, for calls of UNPACK_ROWS rows or
 * more. */
AVX512 INLINE void block_q8_avx512(const float *x, const int8_t *codes, const void *scales,
                                   const float *bias, float *y, int64_t T, int64_t N, int64_t K,
                                   int64_t ldy, int64_t b, float *converted, float *scratch,
                                   const int mode) {
  const int nib = MODE_NIB(mode), g16 = MODE_G16(mode);
  const int64_t C = K / QC, line = chunk_scale_bytes(mode), code_line = CHUNK_CODE_BYTES(mode);
  const int64_t blocks = (N + R - 1) / R, block_bytes = C * code_line;
  const int8_t *cb = codes + b * block_bytes;
  const char *sb = (const char *)scales + b * C * line;
  const float *sf = (const float *)sb;
  if (MODE_WIDEN(mode)) { /* stored scales to float32 d and m once a block */
    if (mode == 6) widen_super((const uint8_t *)sb, converted, C);
    else if (mode == 7) widen_q6((const uint8_t *)sb, converted, C);
    else widen_scales((const uint16_t *)sb, converted, C, mode);
    sf = converted;
  }
  const int8_t *next = b + 1 < blocks ? cb + block_bytes : NULL; /* as stored */
  if (mode == 7 && T == 1 && !scratch) { /* Q6_SUPER_D, one row: unpacked chunk by chunk */
    const int64_t n0 = b * R, rows = N - n0 < R ? N - n0 : R;
    const int g = 0;
    tile_q8_avx512(x, cb, sf, bias, y, K, ldy, n0, rows, 0, g, 16, 1, next, sb + C * line, line,
                   code_line, 0, g16, 1);
    return;
  }
  if (mode == 7) { /* Q6_SUPER_D: the block's codes as Q8_F32_D_HALVES's, after its d */
    int8_t *unpacked = (int8_t *)(converted + 2 * R * C);
    unpack_q6_avx512(cb, unpacked, C);
    cb = unpacked;
  }
  const int64_t n0 = b * R, rows = N - n0 < R ? N - n0 : R;
  if (scratch) {
    unpack_q8_avx512(cb, sf, scratch, K, nib, g16);
    block_f32_avx512(x, scratch, bias, y, T, K, ldy, n0, rows);
    return;
  }
  /* One row streams the block against all 16 weight rows at once. Other rows go in tiles
   * of 4 weight rows by up to 4 rows of x, from cache, each weight converted once per
   * tile: all rows when T is 4 n + 2, 3 or 4 (8 rows: two tiles, where a first-row pass
   * would leave three), the rows after such a pass when T is 4 n + 1 (5: pass + one tile,
   * measured 6% faster than tiles of 4 and 1). The first pass or tile asks for the next
   * block (schedule(static) gives a thread consecutive blocks) while it and the others
   * compute: the conversions of a decode row cost as much as its stream, and without the
   * prefetch a SmolLM2 decode step ran 6% longer. 2 or 3 rows go in two tiles of 8
   * weight rows, each weight converted once (over SmolLM2's products 21% and 16% faster
   * than four tiles of 4; 4 rows so ran 28% slower). */
  int64_t t0 = T % 4 == 1 ? 1 : 0;
  const char *next_scales = sb + C * line;
  if (T == 2 || T == 3) {
    for (int g = 0; g < R; g += 8, next = NULL) {
      if (T == 2) Q8_TILE(0, 8, 2, nib);
      else Q8_TILE(0, 8, 3, nib);
    }
    return;
  }
  if (t0) {
    int g = 0;
    Q8_TILE(0, 16, 1, nib);
    next = NULL;
  }
  for (int g = 0; g < R; g += 4, next = NULL) {
    int64_t t = t0;
    for (; t + 4 <= T; t += 4, next = NULL) Q8_TILE(t, 4, 4, nib);
    switch (T - t) {
      case 3: Q8_TILE(t, 4, 3, nib); break;
      case 2: Q8_TILE(t, 4, 2, nib); break;
      case 1: Q8_TILE(t, 4, 1, nib); break;
      default: break;
    }
  }
}

/* The weights of columns 8 p .. 8 p + 7 of row j of the chunk at qc (nib: Q4_F16_DM's codes). */
AVX2 INLINE __m256 q8x8(const int8_t *qc, const int j, const int p, __m256 d, __m256 m,
                        const int nib) {
  __m256i q;
  if (nib) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)(qc + j / 4 * 64 + 32 * (p % 2)));
    const __m128i shift = _mm_cvtsi32_si128(8 * (j % 4) + 4 * (p / 2));
    q = _mm256_and_si256(_mm256_srl_epi32(v, shift), _mm256_set1_epi32(15));
  } else {
    q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qc + j * QC + 8 * p)));
  }
  return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), m);
}

/* AVX2: per chunk, its four 8-column pieces in order; even pieces add into lo, odd into hi. */
AVX2 INLINE void tile_q8_avx2(const float *x, const int8_t *cb, const float *sb,
                              const float *bias, float *y, int64_t K, int64_t ldy, int64_t n0,
                              int64_t rows, int64_t t0, const int g, const int G,
                              const int TN, const int nib, const int g16) {
  const int RB = nib ? QC / 2 : QC;
  __m256 lo[4][2], hi[4][2];
  _Pragma("GCC unroll 4") for (int j = 0; j < G; j++)
    _Pragma("GCC unroll 2") for (int i = 0; i < TN; i++) lo[j][i] = hi[j][i] = _mm256_setzero_ps();
  const int64_t chunks = K / QC;
  for (int64_t c = 0; c < chunks; c++) {
    const int8_t *qc = cb + c * R * RB;
    const float *sc = sb + c * SCALE_STRIDE(g16);
    _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
      /* Q8_F32_DM_HALVES, Q8_F32_D_HALVES: the last 16 columns' d and m */
      const float *sp = sc + (p >= 2 ? SCALE_HIGH(g16) : 0);
      __m256 w[4];
      _Pragma("GCC unroll 4") for (int j = 0; j < G; j++)
        w[j] = q8x8(qc, g + j, p, _mm256_set1_ps(sp[g + j]),
                    g16 == 2 ? _mm256_setzero_ps() : _mm256_set1_ps(sp[R + g + j]), nib);
      _Pragma("GCC unroll 2") for (int i = 0; i < TN; i++) {
        const __m256 xv = _mm256_loadu_ps(x + (t0 + i) * K + c * QC + 8 * p);
        _Pragma("GCC unroll 4") for (int j = 0; j < G; j++) {
          if (p % 2 == 0) lo[j][i] = _mm256_fmadd_ps(w[j], xv, lo[j][i]);
          else hi[j][i] = _mm256_fmadd_ps(w[j], xv, hi[j][i]);
        }
      }
    }
  }
  _Pragma("GCC unroll 4") for (int j = 0; j < G; j++) {
    const int64_t n = n0 + g + j;
    if (g + j >= rows) break;
    _Pragma("GCC unroll 2") for (int i = 0; i < TN; i++) {
      const float s = reduce8(lo[j][i], hi[j][i]);
      y[(t0 + i) * ldy + n] = bias ? s + bias[n] : s;
    }
  }
}

/* Block b as block_q8_avx512 computes it (no scratch: AVX2 calls convert per tile). */
AVX2 INLINE void block_q8_avx2(const float *x, const int8_t *codes, const void *scales,
                               const float *bias, float *y, int64_t T, int64_t N, int64_t K,
                               int64_t ldy, int64_t b, float *converted, float *scratch,
                               const int mode) {
  (void)scratch;
  const int64_t C = K / QC, line = chunk_scale_bytes(mode);
  const int nib = MODE_NIB(mode), g16 = MODE_G16(mode);
  const int8_t *cb = codes + b * C * CHUNK_CODE_BYTES(mode);
  const char *stored = (const char *)scales + b * C * line;
  const float *sb = MODE_WIDEN(mode) ? converted : (const float *)stored;
  if (mode == 6) widen_super((const uint8_t *)stored, converted, C);
  else if (mode == 7) { /* Q6_SUPER_D: Q8_F32_D_HALVES's d, then its codes */
    int8_t *unpacked = (int8_t *)(converted + 2 * R * C);
    widen_q6((const uint8_t *)stored, converted, C);
    unpack_q6_avx2(cb, unpacked, C);
    cb = unpacked;
  } else if (MODE_WIDEN(mode)) /* stored scales to float32 d and m once a block */
    widen_scales((const uint16_t *)stored, converted, C, mode);
  const int64_t n0 = b * R, rows = N - n0 < R ? N - n0 : R;
  for (int g = 0; g < R; g += 4)
    tile_q8_avx2(x, cb, sb, bias, y, K, ldy, n0, rows, 0, g, 4, 1, nib, g16);
  for (int g = 0; g < R; g += 2) {
    int64_t t0 = 1;
    for (; t0 + 2 <= T; t0 += 2)
      tile_q8_avx2(x, cb, sb, bias, y, K, ldy, n0, rows, t0, g, 2, 2, nib, g16);
    if (t0 < T) tile_q8_avx2(x, cb, sb, bias, y, K, ldy, n0, rows, t0, g, 2, 1, nib, g16);
  }
}

/* ------------------------------- 8-bit codes times 8-bit activations (Q8_A8, "a8") */

/* As llama.cpp computes products of its Q4_1 and Q8_0 blocks: each 32-column chunk of a row
 * of x is rounded to d_x * q_x with d_x = max|x| / 127 and q_x = x * (127 / max|x|) rounded to
 * the nearest integer (ties to even), and each output adds its chunks in column order as
 *   acc = fma(d_x * d, (float)(sum_l u_l q_l - 128 sum_l q_l), acc);  acc = fma(m, mx, acc)
 * with u = q_w + 128 the weight's code stored unsigned and mx = d_x * (float)sum_l q_l. The
 * integer sums are exact in any order, so AVX-512 VNNI's vpdpbusd and the portable loop agree
 * bit for bit; rows of x never mix, so the product stays row-invariant.
 * Layout: codes[b][c][k][j][e] = q(W[16 b + j, 32 c + 4 k + e]) + 128 (uint8; k < 8, j < 16,
 * e < 4): one 64-byte vector holds 4 columns of the block's 16 rows, as vpdpbusd takes them.
 * Scales as Q8_F32_DM's but float16 (a GGUF block's d and m are float16 values, so exactly):
 * scales[b][c][0][j] = d, scales[b][c][1][j] = m.
 * Q4_A8 is Q8_A8 with every code in 0..15 (GGUF Q4_1 blocks) stored as itself, two a byte:
 * codes[b][c][k][j][e] = q(W[16 b + j, 32 c + 4 k + e]) | q(W[16 b + j, 32 c + 16 + 4 k + e]) << 4
 * (k < 4), so a vector's low 4 bits are Q8_A8's vector k less 128 and its high 4 bits vector
 * k + 4 less 128; its sums start at 0 instead of -128 sum_l q_l, which gives the same integers.
 * 0.625 bytes a weight instead of 1.125.
 * Q4_F32_A8 and Q8_F32_A8 are Q4_A8 and Q8_A8 with d and m stored as float32 (scales[b][c][0 or
 * 1][j]): a K-quant's d and m (Q4_K, Q5_K) are products of float16 values, not float16 values. The
 * same operations on the same float32 values, so where d and m are float16 values they give
 * Q4_A8's and Q8_A8's bits; 0.75 and 1.25 bytes a weight. */

#define H16 uint16_t /* float16 bits */

/* Chunk-major, so that one tile's rows of a chunk lie side by side and a tile addresses them all
 * from one pointer (row-major, each row took a register of its own and the 8-row tile spilled
 * its pointers: 11% slower from cache). Chunk c of row t is entry c T + t. */
typedef struct {
  int8_t *q;       /* [K / 32][T][32] */
  float *dx, *mx;  /* [K / 32][T] */
  int32_t *corr;   /* [K / 32][T]: -128 * the sum of the chunk's q, where its sum starts */
  int32_t *half;   /* [K / 32][T]: the sum of the chunk's first 16 q (Q6_SUPER_A8's halves) */
  int64_t T, C;    /* rows, chunks per row */
} RoundedRows;

/* Where chunk c of row t sits in r's arrays. */
INLINE int64_t at(const RoundedRows r, int64_t t, int64_t c) { return c * r.T + t; }

/* Row t's chunk c of x rounded as above (q, d_x, mx, the sum's correction and its first half's
 * sum) with AVX-512: max and integer sums are exact in any order, x * inv is one rounding and
 * vcvtps2dq rounds to nearest even, so the bits are portable.c's round_chunk's. */
AVX512 INLINE void round_chunk_avx512(const float *x, int8_t *q, float *dx, float *mx,
                                      int32_t *corr, int32_t *half) {
  const __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
  const __m512 inv = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
  const __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inv));
  const __m512i b = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inv));
  _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(a));
  _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(b));
  const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(a, b));
  *half = _mm512_reduce_add_epi32(a);
  *dx = amax / 127.0f;
  *mx = *dx * (float)sum;
  *corr = -128 * sum;
}

AVX512 static void round_rows_avx512(const float *x, int64_t n, RoundedRows r, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; i++) {
    const int64_t e = at(r, i / r.C, i % r.C);
    round_chunk_avx512(x + i * QC, r.q + e * QC, r.dx + e, r.mx + e, r.corr + e, r.half + e);
  }
}

/* The same with AVX2: 8 lanes at a time, the same operations (max of |x| kept where a lane is
 * NaN, as a scalar comparison does; each code x's int32's low byte, as a cast), so the bits
 * are portable.c's round_chunk's. */
AVX2 INLINE void round_chunk_avx2(const float *x, int8_t *q, float *dx, float *mx,
                                  int32_t *corr, int32_t *half) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4], most = _mm256_setzero_ps();
  _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    most = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), most);
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(most), _mm256_extractf128_ps(most, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
  const __m256 inv = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
  __m256i a[4];
  _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
    a[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
  const __m256i byte = _mm256_set1_epi32(0xFF); /* low bytes, packed without saturating */
  const __m256i p = _mm256_packus_epi16(
      _mm256_packus_epi32(_mm256_and_si256(a[0], byte), _mm256_and_si256(a[1], byte)),
      _mm256_packus_epi32(_mm256_and_si256(a[2], byte), _mm256_and_si256(a[3], byte)));
  _mm256_storeu_si256((__m256i *)q,
                      _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  const __m256i s01 = _mm256_add_epi32(a[0], a[1]); /* the first 16 codes */
  const __m256i all = _mm256_add_epi32(_mm256_add_epi32(s01, a[2]), a[3]);
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s01), _mm256_extracti128_si256(s01, 1));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(all), _mm256_extracti128_si256(all, 1));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(1, 0, 3, 2)));
  *half = _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1))));
  const int32_t sum =
      _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1))));
  *dx = amax / 127.0f;
  *mx = *dx * (float)sum;
  *corr = -128 * sum;
}

AVX2 static void round_rows_avx2(const float *x, int64_t n, RoundedRows r, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; i++) {
    const int64_t e = at(r, i / r.C, i % r.C);
    round_chunk_avx2(x + i * QC, r.q + e * QC, r.dx + e, r.mx + e, r.corr + e, r.half + e);
  }
}

/* x [T, K] rounded chunk by chunk (on one thread below 512 chunks: not worth a wake-up). */
static void round_rows(int isa, const float *x, int64_t T, int64_t K, RoundedRows r,
                       int threads) {
  const int64_t n = T * (K / QC);
  if (n < 512) threads = 1;
  if (isa == 2) {
    round_rows_avx512(x, n, r, threads);
    return;
  }
  round_rows_avx2(x, n, r, threads);
}

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni,avx2,f16c,fma")))

VNNI INLINE __m512 half16(const H16 *h) { /* 16 float16 values, exactly as float32 */
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
}

/* Bytes of an a8 weight's d or m: float16 (Q8_A8 and Q4_A8, GGUF's own d and m) or float32
 * (Q4_F32_A8 and Q8_F32_A8: a K-quant's d and m, products of a float16 and a 6-bit scale). */
#define A8_SCALE_BYTES(f32) ((f32) ? 4 : 2)

/* 16 d or m values from element i of an a8 weight's scales, as float32 (exactly either way). */
VNNI INLINE __m512 scales16(const char *s, int64_t i, const int f32) {
  return f32 ? _mm512_loadu_ps((const float *)s + i) : half16((const H16 *)s + i);
}

/* acc plus one chunk of 16 outputs: the chunk's integer sum scaled by d_x d, then the affine
 * term m mx. Every a8 tile adds its chunks by this, so their outputs are the same bits. */
VNNI INLINE __m512 add_chunk(__m512 acc, __m512i sum, float dx, float mx, __m512 d, __m512 m) {
  acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(dx), d), _mm512_cvtepi32_ps(sum), acc);
  return _mm512_fmadd_ps(m, _mm512_set1_ps(mx), acc);
}

/* Chunk c's 8 vectors of codes (4 columns of the block's 16 rows each) from the block at cb:
 * Q8_A8's as stored, Q4_A8's (nib) from 4 vectors of two codes a byte. */
VNNI INLINE void chunk_codes(const uint8_t *cb, int64_t c, __m512i *w, const int nib) {
  if (!nib) {
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
      w[k] = _mm512_loadu_si512((const void *)(cb + c * R * QC + 64 * k));
    return;
  }
  const __m512i low = _mm512_set1_epi8(0x0F);
  _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
    const __m512i v = _mm512_loadu_si512((const void *)(cb + c * R * QC / 2 + 64 * k));
    w[k] = _mm512_and_si512(v, low);
    w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
  }
}

/* Rows t0 .. t0 + TN - 1 of x against the block's 16 weight rows: one 16-lane accumulator per
 * row of x, lane j for weight row j. A chunk's integer sum is one vpdpbusd chain per row in
 * tiles of more than 4 rows, two (even and odd 4-column groups) in smaller ones, so that at
 * least eight chains are in flight (integer sums: the split changes no bit). nib: Q4_A8. */
VNNI INLINE void tile_a8_vnni(const RoundedRows r, const uint8_t *cb, const char *sb,
                              const float *bias, float *y, int64_t K, int64_t ldy, int64_t n0,
                              int64_t rows, int64_t t0, const int TN, const uint8_t *next,
                              const char *next_scales, const int nib, const int f32) {
  const int64_t C = K / QC, chunk_bytes = nib ? R * QC / 2 : R * QC;
  const int64_t line = 2 * R * A8_SCALE_BYTES(f32); /* bytes of a chunk's d and m */
  __m512 acc[8];
  _Pragma("GCC unroll 8") for (int i = 0; i < TN; i++) acc[i] = _mm512_setzero_ps();
  for (int64_t c = 0; c < C; c++) {
    if (next) { /* the next block's chunk c into L2, while this one computes */
      _Pragma("GCC unroll 8") for (int l = 0; l < chunk_bytes; l += 64)
        _mm_prefetch((const char *)(next + c * chunk_bytes + l), _MM_HINT_T1);
      for (int64_t l = 0; l < line; l += 64) _mm_prefetch(next_scales + c * line + l, _MM_HINT_T1);
    }
    __m512i w[8];
    chunk_codes(cb, c, w, nib);
    const __m512 d = scales16(sb, c * 2 * R, f32), m = scales16(sb, c * 2 * R + R, f32);
    const int64_t tc = at(r, t0, c); /* the tile's rows of chunk c: tc, tc + 1, ... */
    __m512i even[8], odd[8];
    _Pragma("GCC unroll 8") for (int i = 0; i < TN; i++) {
      even[i] = nib ? _mm512_setzero_si512() : _mm512_set1_epi32(r.corr[tc + i]);
      odd[i] = _mm512_setzero_si512();
    }
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) /* the rows' chains side by side */
      _Pragma("GCC unroll 8") for (int i = 0; i < TN; i++) {
        int32_t a;
        __builtin_memcpy(&a, r.q + (tc + i) * QC + 4 * k, 4);
        const __m512i xa = _mm512_set1_epi32(a);
        if (TN > 4 || k % 2 == 0) even[i] = _mm512_dpbusd_epi32(even[i], w[k], xa);
        else odd[i] = _mm512_dpbusd_epi32(odd[i], w[k], xa);
      }
    _Pragma("GCC unroll 8") for (int i = 0; i < TN; i++)
      acc[i] = add_chunk(acc[i], _mm512_add_epi32(even[i], odd[i]), r.dx[tc + i], r.mx[tc + i],
                         d, m);
  }
  const __mmask16 live = (__mmask16)((1u << rows) - 1);
  const __m512 b = bias ? _mm512_maskz_loadu_ps(live, bias + n0) : _mm512_setzero_ps();
  _Pragma("GCC unroll 8") for (int i = 0; i < TN; i++)
    _mm512_mask_storeu_ps(y + (t0 + i) * ldy + n0, live,
                          bias ? _mm512_add_ps(acc[i], b) : acc[i]);
}

/* A block's T rows in tiles of 8 (the prefetch of the next block goes with the first tile),
 * then one of 4, then what is left: TILE(TN) computes rows t .. t + TN - 1 of the block. */
#define ROW_TILES(TILE)                                     \
  do {                                                      \
    for (; t + 8 <= T; t += 8, next = NULL) TILE(8);        \
    if (t + 4 <= T) {                                       \
      TILE(4);                                              \
      t += 4, next = NULL;                                  \
    }                                                       \
    switch (T - t) {                                        \
      case 3: TILE(3); break;                               \
      case 2: TILE(2); break;                               \
      case 1: TILE(1); break;                               \
      default: break;                                       \
    }                                                       \
  } while (0)

#define A8_TILE(TN) \
  tile_a8_vnni(r, cb, sb, bias, y, K, ldy, n0, rows, t, TN, next, next_scales, nib, f32)

/* An OpenMP loop over blocks or pairs, compiled for each of Q8_A8, Q4_A8 (nib), Q8_F32_A8 (f32)
 * and Q4_F32_A8 (both): the loop's body becomes a function of its own, in which nib and f32 must be
 * constants (see Q8_ENTRY). */
#define A8_ENTRY(NAME, BODY, NIB, F32, SUP, BLOCKS)                                           \
  VNNI static void NAME(const RoundedRows r, const uint8_t *codes, const char *scales,        \
                        const float *bias, float *y, int64_t T, int64_t N, int64_t K,         \
                        int64_t ldy, int threads) {                                           \
    const int64_t n = (N + BLOCKS * R - 1) / (BLOCKS * R);                                    \
    _Pragma("omp parallel num_threads(threads)") {                                           \
      float *converted = SUP && BLOCKS == 1 ? malloc(sizeof(float) * 2 * R * (K / QC)) : NULL; \
      _Pragma("omp for schedule(static)") for (int64_t b = 0; b < n; b++)                    \
        BODY(r, codes, scales, bias, y, T, N, K, ldy, b, NIB, F32, SUP, converted);           \
      free(converted);                                                                        \
    }                                                                                         \
  }

/* Bytes of a block's scales as an a8 product finds them: float16 or float32 d and m, or (sup,
 * Q4_SUPER_A8) super scales, which it widens into converted before the tiles read Q4_F32_A8's. */
INLINE int64_t a8_scale_bytes(int64_t K, const int f32, const int sup) {
  return sup ? (K / QC) * (SUPER_BYTES / SUPER_CHUNKS) : 2 * R * (K / QC) * A8_SCALE_BYTES(f32);
}

/* Block b of an a8 product (nib: Q4_A8, Q4_F32_A8 and Q4_SUPER_A8; f32: float32 d and m, Q4_F32_A8
 * and Q8_F32_A8; sup: Q4_SUPER_A8, super scales widened into converted, then Q4_F32_A8's
 * operations). */
VNNI INLINE void a8_block(const RoundedRows r, const uint8_t *codes, const char *scales,
                          const float *bias, float *y, int64_t T, int64_t N, int64_t K,
                          int64_t ldy, int64_t b, const int nib, const int f32, const int sup,
                          float *converted) {
  const int64_t blocks = (N + R - 1) / R, block_bytes = nib ? R * K / 2 : R * K;
  const int64_t scale_bytes = a8_scale_bytes(K, f32, sup); /* a block's, as stored */
  const uint8_t *cb = codes + b * block_bytes;
  const char *stored = scales + b * scale_bytes, *sb = stored;
  if (sup) {
    widen_super((const uint8_t *)stored, converted, K / QC);
    sb = (const char *)converted;
  }
  const int64_t n0 = b * R, rows = N - n0 < R ? N - n0 : R;
  /* Tiles of 8 rows, then at most one of 4 and one of 1-3 (a 5-row tile ran slower than
   * 4 + 1): 8 rows stream a block once. The first tile asks for the next block
   * (schedule(static) gives a thread consecutive blocks) while it and the others compute:
   * from 5 rows up the products take about as long as the stream, and without the
   * prefetch an 8-row product over SmolLM2's layers ran 12% longer. */
  const uint8_t *next = b + 1 < blocks ? cb + block_bytes : NULL;
  const char *next_scales = stored + scale_bytes;
  int64_t t = 0;
  ROW_TILES(A8_TILE);
}

/* Chunk c's d and m of a block's Q4_K super scales as stored (Q4_SUPER_A8): d16 sc and (-dmin) mn,
 * the very products widen_super computes (a float16 value times a 6-bit integer, exact). */
VNNI INLINE void super_dm(const uint8_t *in, int64_t c, __m512 *d, __m512 *m) {
  const uint8_t *s = in + (c / SUPER_CHUNKS) * SUPER_BYTES;
  const uint8_t *sub = s + 4 * R + (c % SUPER_CHUNKS) * 2 * R;
  const __m512 d16 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s));
  const __m512 negmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 2 * R)));
  *d = _mm512_mul_ps(d16, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                              _mm_loadu_si128((const __m128i *)sub))));
  *m = _mm512_mul_ps(negmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                 _mm_loadu_si128((const __m128i *)(sub + R)))));
}

/* Two blocks (32 weight rows) against rows t0 .. t0 + TN - 1 (TN <= 4): each broadcast of x
 * feeds two vpdpbusd, one a block, each row's two chains 8 deep; per output the very
 * operations of tile_a8_vnni (integer sums, then add_chunk), so the same bits. next, when not
 * NULL, is the next pair, whose chunk c is asked for into L2 while chunk c computes. */
VNNI INLINE void tile_a8_pair(const RoundedRows r, const uint8_t *cb, const char *sb,
                              const float *bias, float *y, int64_t K, int64_t ldy, int64_t n0,
                              int64_t t0, const int TN, const uint8_t *next,
                              const char *next_scales, const int nib, const int f32,
                              const int sup) {
  const int64_t C = K / QC, block_bytes = nib ? R * K / 2 : R * K;
  const int64_t chunk_bytes = nib ? R * QC / 2 : R * QC;
  /* a chunk's d and m as stored: float16 or float32 values, or (sup) its share of the super
   * scales, which each chunk widens as it comes (super_dm: widen_super's values, bit for bit) */
  const int64_t line = sup ? SUPER_BYTES / SUPER_CHUNKS : 2 * R * A8_SCALE_BYTES(f32);
  const int64_t scale_bytes = C * line;
  const uint8_t *cb1 = cb + block_bytes;
  const char *sb1 = sb + scale_bytes;
  __m512 acc0[4], acc1[4];
  _Pragma("GCC unroll 4") for (int i = 0; i < TN; i++) acc0[i] = acc1[i] = _mm512_setzero_ps();
  for (int64_t c = 0; c < C; c++) {
    if (next)
      for (int b = 0; b < 2; b++) {
        _Pragma("GCC unroll 8") for (int l = 0; l < chunk_bytes; l += 64)
          _mm_prefetch((const char *)(next + b * block_bytes + c * chunk_bytes + l), _MM_HINT_T1);
        for (int64_t l = 0; l < line; l += 64)
          _mm_prefetch(next_scales + b * scale_bytes + c * line + l, _MM_HINT_T1);
      }
    __m512i w0[8], w1[8];
    chunk_codes(cb, c, w0, nib);
    chunk_codes(cb1, c, w1, nib);
    __m512 d0, m0, d1, m1;
    if (sup) {
      super_dm((const uint8_t *)sb, c, &d0, &m0);
      super_dm((const uint8_t *)sb1, c, &d1, &m1);
    } else {
      d0 = scales16(sb, c * 2 * R, f32), m0 = scales16(sb, c * 2 * R + R, f32);
      d1 = scales16(sb1, c * 2 * R, f32), m1 = scales16(sb1, c * 2 * R + R, f32);
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < TN; i++) {
      const int64_t tc = at(r, t0 + i, c);
      const int8_t *q = r.q + tc * QC;
      __m512i s0 = nib ? _mm512_setzero_si512() : _mm512_set1_epi32(r.corr[tc]), s1 = s0;
      _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
        int32_t a;
        __builtin_memcpy(&a, q + 4 * k, 4);
        const __m512i xa = _mm512_set1_epi32(a);
        s0 = _mm512_dpbusd_epi32(s0, w0[k], xa);
        s1 = _mm512_dpbusd_epi32(s1, w1[k], xa);
      }
      acc0[i] = add_chunk(acc0[i], s0, r.dx[tc], r.mx[tc], d0, m0);
      acc1[i] = add_chunk(acc1[i], s1, r.dx[tc], r.mx[tc], d1, m1);
    }
  }
  const __m512 b0 = bias ? _mm512_loadu_ps(bias + n0) : _mm512_setzero_ps();
  const __m512 b1 = bias ? _mm512_loadu_ps(bias + n0 + R) : _mm512_setzero_ps();
  _Pragma("GCC unroll 4") for (int i = 0; i < TN; i++) {
    _mm512_storeu_ps(y + (t0 + i) * ldy + n0, bias ? _mm512_add_ps(acc0[i], b0) : acc0[i]);
    _mm512_storeu_ps(y + (t0 + i) * ldy + n0 + R, bias ? _mm512_add_ps(acc1[i], b1) : acc1[i]);
  }
}

/* Decode and short verify steps (T <= 4, N a multiple of 32): pairs of blocks, one tile each.
 * Two blocks streamed together halve the broadcasts of x a product needs; measured against
 * single blocks, a SmolLM2 decode step -6%. Longer steps keep tiles of 8 rows a block (a pair
 * tile holds at most 4 rows in registers; 8 rows in two pair tiles ran slower). Each tile asks
 * for the next pair while it computes (over a 1.5B model's Q4_K layers, whose weights stream
 * from memory, 1 and 2 rows gained as 3 and 4 had; SmolLM2's, nearly in L3, had not shown it).
 * Q4_SUPER_A8's super scales are widened by chunk inside the tile (super_dm), not a block ahead. */
VNNI INLINE void a8_pair(const RoundedRows r, const uint8_t *codes, const char *scales,
                         const float *bias, float *y, int64_t T, int64_t N, int64_t K,
                         int64_t ldy, int64_t p, const int nib, const int f32, const int sup,
                         float *converted) {
  const int64_t pairs = N / (2 * R), block_bytes = nib ? R * K / 2 : R * K;
  const int64_t scale_bytes = a8_scale_bytes(K, f32, sup); /* a block's, as stored */
  const uint8_t *cb = codes + 2 * p * block_bytes;
  const char *sb = scales + 2 * p * scale_bytes; /* Q4_SUPER_A8: super scales, widened by chunk */
  (void)converted; /* NULL: a pair tile widens each chunk itself (a8_block's buffer) */
  const uint8_t *next = p + 1 < pairs ? cb + 2 * block_bytes : NULL;
  const char *ns = sb + 2 * scale_bytes;
  const int64_t n0 = 2 * p * R;
  switch (T) {
    case 4: tile_a8_pair(r, cb, sb, bias, y, K, ldy, n0, 0, 4, next, ns, nib, f32, sup); break;
    case 3: tile_a8_pair(r, cb, sb, bias, y, K, ldy, n0, 0, 3, next, ns, nib, f32, sup); break;
    case 2: tile_a8_pair(r, cb, sb, bias, y, K, ldy, n0, 0, 2, next, ns, nib, f32, sup); break;
    default: tile_a8_pair(r, cb, sb, bias, y, K, ldy, n0, 0, 1, next, ns, nib, f32, sup); break;
  }
}


/* Q6_SUPER_A8: Q6_SUPER_D's Q6_K codes and scales as stored, times x rounded to 8-bit
 * blocks. Its planes hold u = q + 32 in Q8_A8's order (position 64 k + 4 j + e is row j,
 * column 4 k + e: packing.pack_q6_a8), so one vector of each plane, shifted and masked, is a
 * vpdpbusd operand of 16 rows by 4 columns. A chunk's halves (columns 0-15, vectors k < 4, and
 * 16-31) have their own d = d16 sc, so each row of x has two integer sums, each started at -32
 * times that half's sum of x's codes: sum (u - 32) q_x = sum q q_x. Then per half
 * acc = fma(d_x d, sum, acc), low half first. */
VNNI INLINE void q6_vectors(const uint8_t *p, __m512i *w) {
  const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8(0x30);
  const __m512i h0 = _mm512_loadu_si512(p + 4 * 64), h1 = _mm512_loadu_si512(p + 5 * 64);
  _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) {
    const __m512i l = _mm512_loadu_si512(p + 64 * v);
    _Pragma("GCC unroll 2") for (int n = 0; n < 2; n++) {
      const int k = 2 * v + n, f = k % 4;
      const __m512i a = n ? _mm512_srli_epi16(l, 4) : l, hv = k < 4 ? h0 : h1;
      const __m512i two = f == 0   ? _mm512_slli_epi16(hv, 4)
                          : f == 1 ? _mm512_slli_epi16(hv, 2)
                          : f == 2 ? hv
                                   : _mm512_srli_epi16(hv, 2); /* field f at bits 4, 5 */
      w[k] = _mm512_ternarylogic_epi32(a, _mm512_and_si512(two, high), low, 0xEC);
    }
  }
}

/* Chunk c's d of a block's Q6_K scales as stored, for its first and last 16 columns: d16 sc,
 * widen_q6's very products. */
VNNI INLINE void q6_d(const uint8_t *in, int64_t c, __m512 *lo, __m512 *hi) {
  const uint8_t *s = in + (c / SUPER_CHUNKS) * Q6_SUPER_BYTES;
  const uint8_t *sub = s + 2 * R + (c % SUPER_CHUNKS) * 2 * R;
  const __m512 d16 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s));
  *lo = _mm512_mul_ps(d16, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                               _mm_loadu_si128((const __m128i *)sub))));
  *hi = _mm512_mul_ps(d16, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                               _mm_loadu_si128((const __m128i *)(sub + R)))));
}

/* Rows t0 .. t0 + TN - 1 of x against a Q6_SUPER_A8 block's 16 weight rows (TN <= 8); next, when
 * not NULL, is the next block, whose chunk c is asked for into L2 while chunk c computes. */
VNNI INLINE void tile_q6_a8(const RoundedRows r, const uint8_t *cb, const uint8_t *sb,
                            const float *bias, float *y, int64_t K, int64_t ldy, int64_t n0,
                            int64_t rows, int64_t t0, const int TN, const uint8_t *next,
                            const uint8_t *next_scales) {
  const int64_t C = K / QC, line = Q6_SUPER_BYTES / SUPER_CHUNKS;
  __m512 acc[8];
  _Pragma("GCC unroll 8") for (int i = 0; i < TN; i++) acc[i] = _mm512_setzero_ps();
  for (int64_t c = 0; c < C; c++) {
    if (next) {
      _Pragma("GCC unroll 6") for (int l = 0; l < Q6_CHUNK_BYTES; l += 64)
        _mm_prefetch((const char *)(next + c * Q6_CHUNK_BYTES + l), _MM_HINT_T1);
      _mm_prefetch((const char *)(next_scales + c * line), _MM_HINT_T1);
    }
    __m512i w[8];
    q6_vectors(cb + c * Q6_CHUNK_BYTES, w);
    __m512 dlo, dhi;
    q6_d(sb, c, &dlo, &dhi);
    const int64_t tc = at(r, t0, c);
    _Pragma("GCC unroll 8") for (int i = 0; i < TN; i++) {
      const int32_t half = r.half[tc + i], rest = -r.corr[tc + i] / 128 - half;
      __m512i lo = _mm512_set1_epi32(-32 * half), hi = _mm512_set1_epi32(-32 * rest);
      const int8_t *q = r.q + (tc + i) * QC;
      _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
        int32_t a;
        __builtin_memcpy(&a, q + 4 * k, 4);
        const __m512i xa = _mm512_set1_epi32(a);
        if (k < 4) lo = _mm512_dpbusd_epi32(lo, w[k], xa);
        else hi = _mm512_dpbusd_epi32(hi, w[k], xa);
      }
      const __m512 dx = _mm512_set1_ps(r.dx[tc + i]);
      acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dx, dlo), _mm512_cvtepi32_ps(lo), acc[i]);
      acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dx, dhi), _mm512_cvtepi32_ps(hi), acc[i]);
    }
  }
  const __mmask16 live = (__mmask16)((1u << rows) - 1);
  const __m512 b = bias ? _mm512_maskz_loadu_ps(live, bias + n0) : _mm512_setzero_ps();
  _Pragma("GCC unroll 8") for (int i = 0; i < TN; i++)
    _mm512_mask_storeu_ps(y + (t0 + i) * ldy + n0, live,
                          bias ? _mm512_add_ps(acc[i], b) : acc[i]);
}

#define Q6_TILE(TN) tile_q6_a8(r, cb, sb, bias, y, K, ldy, n0, rows, t, TN, next, next_scales)

/* Block b of a Q6_SUPER_A8 product: tiles of 8 rows of x, then at most one of 4 and one of 1-3, as
 * a8_block; the first asks for the next block. */
VNNI INLINE void q6_a8_block(const RoundedRows r, const uint8_t *codes, const char *scales,
                             const float *bias, float *y, int64_t T, int64_t N, int64_t K,
                             int64_t ldy, int64_t b, const int nib, const int f32,
                             const int sup, float *converted) {
  (void)nib, (void)f32, (void)sup, (void)converted;
  const int64_t blocks = (N + R - 1) / R, block_bytes = (K / QC) * Q6_CHUNK_BYTES;
  const int64_t scale_bytes = (K / (SUPER_CHUNKS * QC)) * Q6_SUPER_BYTES;
  const uint8_t *cb = codes + b * block_bytes;
  const uint8_t *sb = (const uint8_t *)scales + b * scale_bytes;
  const uint8_t *next = b + 1 < blocks ? cb + block_bytes : NULL, *next_scales = sb + scale_bytes;
  const int64_t n0 = b * R, rows = N - n0 < R ? N - n0 : R;
  int64_t t = 0;
  ROW_TILES(Q6_TILE);
}

/* By format: Q8_A8, Q8_F32_A8 (8-bit codes), Q4_A8, Q4_F32_A8, Q4_SUPER_A8 (4-bit codes),
 * Q6_SUPER_A8 */
A8_ENTRY(a8_blocks_bytes, a8_block, 0, 0, 0, 1)
A8_ENTRY(a8_blocks_bytes_f32, a8_block, 0, 1, 0, 1)
A8_ENTRY(a8_blocks_nibbles, a8_block, 1, 0, 0, 1)
A8_ENTRY(a8_blocks_nibbles_f32, a8_block, 1, 1, 0, 1)
A8_ENTRY(a8_blocks_nibbles_super, a8_block, 1, 1, 1, 1)
A8_ENTRY(a8_blocks_q6, q6_a8_block, 0, 0, 0, 1)
A8_ENTRY(a8_pairs_bytes, a8_pair, 0, 0, 0, 2)
A8_ENTRY(a8_pairs_bytes_f32, a8_pair, 0, 1, 0, 2)
A8_ENTRY(a8_pairs_nibbles, a8_pair, 1, 0, 0, 2)
A8_ENTRY(a8_pairs_nibbles_f32, a8_pair, 1, 1, 0, 2)
A8_ENTRY(a8_pairs_nibbles_super, a8_pair, 1, 1, 1, 2)

typedef void (*A8Entry)(const RoundedRows, const uint8_t *, const char *, const float *, float *,
                        int64_t, int64_t, int64_t, int64_t, int);
/* Index: 2 nib + f32 (Q8_A8, Q8_F32_A8, Q4_A8, Q4_F32_A8), 4 for Q4_SUPER_A8, 5 for
 * Q6_SUPER_A8 (blocks only). */
static const A8Entry A8_BLOCKS[6] = {a8_blocks_bytes, a8_blocks_bytes_f32, a8_blocks_nibbles,
                                     a8_blocks_nibbles_f32, a8_blocks_nibbles_super,
                                     a8_blocks_q6};
static const A8Entry A8_PAIRS[5] = {a8_pairs_bytes, a8_pairs_bytes_f32, a8_pairs_nibbles,
                                    a8_pairs_nibbles_f32, a8_pairs_nibbles_super};

/* The 256-bit 8-bit products (a8_avx2.h), once on AVX2's vpmaddubsw and, where the compiler
 * knows AVX-VNNI (gcc 11, clang 12), once on its vpdpbusd. */
#define A8_DOT VERISPEC_DOT_MADDUBS
#define A8_TARGET AVX2
#define A8(name) name##_maddubs
#include "a8_avx2.h"

#if defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11
#define HAVE_AVX_VNNI 1
#define A8_DOT VERISPEC_DOT_AVX_VNNI
#define A8_TARGET __attribute__((target("avx2,f16c,fma,avxvnni")))
#define A8(name) name##_avx_vnni
#include "a8_avx2.h"
#else
#define HAVE_AVX_VNNI 0
#endif

static int has_vnni(void) {
  static int known = -1; /* the same answer for every thread: a benign race */
  if (known < 0) {
    __builtin_cpu_init();
    known = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vnni");
  }
  return known;
}

static int has_avx_vnni(void) {
#if HAVE_AVX_VNNI
  static int known = -1; /* as has_vnni's */
  if (known < 0) {
    __builtin_cpu_init();
    known = __builtin_cpu_supports("avxvnni");
  }
  return known;
#else
  return 0;
#endif
}

/* The integer dot product of the 8-bit products at instruction set isa (bits 0-1 of a
 * product's isa argument) on this CPU: AVX-512 VNNI at isa 2 where the CPU has it, else
 * AVX-VNNI where it has that, else AVX2's vpmaddubsw; portable.c's scalar loop at isa 0. */
int verispec_linear_dot(int isa) {
  if ((isa & 3) == 0) return VERISPEC_DOT_SCALAR;
  if ((isa & 3) == 2 && has_vnni()) return VERISPEC_DOT_VNNI;
  return has_avx_vnni() ? VERISPEC_DOT_AVX_VNNI : VERISPEC_DOT_MADDUBS;
}

/* x [T, K] float32 (K a multiple of 32) rounded to 8-bit blocks, then times the codes of weight
 * format `format` (one of the a8 formats) with integer dot product dot: AVX-512 VNNI's vpdpbusd
 * (pairs of blocks for up to 4 rows) or the 256-bit tiles (AVX-VNNI or vpmaddubsw); every
 * one gives the bits of portable.c's loop (isa 0). */
static void linear_a8(int isa, int dot, WeightFormat format, const float *x, const uint8_t *codes,
                      const char *scales, const float *bias, float *y, int64_t T, int64_t N,
                      int64_t K, int64_t ldy, int threads) {
  const int64_t C = K / QC;
  const int q6 = format == VERISPEC_Q6_SUPER_A8, sup = format == VERISPEC_Q4_SUPER_A8;
  const int nib = format != VERISPEC_Q8_A8 && format != VERISPEC_Q8_F32_A8;
  const int f32 = format == VERISPEC_Q4_F32_A8 || format == VERISPEC_Q8_F32_A8;
  /* One buffer for the rounded rows: d_x and mx [2][C][T] float, corr and half [2][C][T] int32,
   * then q [C][T][32]. */
  float *f = malloc(sizeof(float) * 4 * T * C + (size_t)(T * K));
  const RoundedRows r = {(int8_t *)(f + 4 * T * C), f, f + T * C, (int32_t *)(f + 2 * T * C),
                         (int32_t *)(f + 3 * T * C), T, C};
  round_rows(isa, x, T, K, r, threads);
  const int entry = q6 ? 5 : sup ? 4 : 2 * nib + f32;
  if (dot == VERISPEC_DOT_VNNI && T <= 4 && N % (2 * R) == 0 && !q6)
    A8_PAIRS[entry](r, codes, scales, bias, y, T, N, K, ldy, threads);
  else if (dot == VERISPEC_DOT_VNNI)
    A8_BLOCKS[entry](r, codes, scales, bias, y, T, N, K, ldy, threads);
#if HAVE_AVX_VNNI
  else if (dot == VERISPEC_DOT_AVX_VNNI)
    linear_avx_vnni(format, r, codes, scales, bias, y, T, N, K, ldy, threads);
#endif
  else
    linear_maddubs(format, r, codes, scales, bias, y, T, N, K, ldy, threads);
  free(f);
}

/* ------------------------------------------------------------------------ entry points */

/* 2 = AVX-512 (F and BW), 1 = AVX2 + F16C + FMA, 0 = neither (the kernel cannot run here). */
int verispec_linear_isa(void) {
  __builtin_cpu_init();
  const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
                   __builtin_cpu_supports("fma");
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return 2;
  return avx2 ? 1 : 0;
}

/* x [T, K] float32 contiguous (K a multiple of 16), w packed as above, bias [N] or NULL,
 * y [T, ldy] float32; isa as verispec_linear_isa returns it on this machine. */
static void linear_f32(int isa, const float *x, const float *w, const float *bias, float *y,
                       int64_t T, int64_t N, int64_t K, int64_t ldy, int threads) {
  if (isa == 2) linear_f32_avx512(x, w, bias, y, T, N, K, ldy, threads);
  else linear_f32_avx2(x, w, bias, y, T, N, K, ldy, threads);
}

static void linear_f16(int isa, const float *x, const uint16_t *w, const float *bias, float *y,
                       int64_t T, int64_t N, int64_t K, int64_t ldy, int threads) {
  if (isa == 2) linear_f16_avx512(x, w, bias, y, T, N, K, ldy, threads);
  else linear_f16_avx2(x, w, bias, y, T, N, K, ldy, threads);
}

/* x [T, K] float32 (K a multiple of 32), codes and scales laid out as above: the blocks shared
 * out over the threads. One function per instruction set and scale mode, each with its own
 * parallel loop: OpenMP outlines a loop's body into a function of its own, so the mode must be
 * a constant where the loop is written for the body to be compiled for it. */
#define Q8_ENTRY(TARGET, NAME, BLOCK, MODE, UNPACK)                                          \
  TARGET static void NAME(const float *x, const int8_t *codes, const void *scales,           \
                          const float *bias, float *y, int64_t T, int64_t N, int64_t K,      \
                          int64_t ldy, int threads) {                                        \
    const int64_t blocks = (N + R - 1) / R;                                                  \
    _Pragma("omp parallel num_threads(threads)") {                                           \
      /* Q6_SUPER_D: then its codes as Q8_F32_D_HALVES's */                                 \
      float *converted = MODE_WIDEN(MODE) ?                                                  \
          malloc(sizeof(float) * 2 * R * (K / QC) + (MODE == 7 ? R * K : 0)) : NULL;         \
      float *scratch = UNPACK && T >= UNPACK ? malloc(sizeof(float) * R * K) : NULL;         \
      _Pragma("omp for schedule(static)") for (int64_t b = 0; b < blocks; b++)               \
        BLOCK(x, codes, scales, bias, y, T, N, K, ldy, b, converted, scratch, MODE);         \
      free(converted);                                                                       \
      free(scratch);                                                                         \
    }                                                                                        \
  }

Q8_ENTRY(AVX512, q8_avx512_f32, block_q8_avx512, 0, UNPACK_ROWS)
Q8_ENTRY(AVX512, q8_avx512_f16, block_q8_avx512, 1, UNPACK_ROWS)
Q8_ENTRY(AVX512, q8_avx512_d16, block_q8_avx512, 2, UNPACK_ROWS)
Q8_ENTRY(AVX2, q8_avx2_f32, block_q8_avx2, 0, 0)
Q8_ENTRY(AVX2, q8_avx2_f16, block_q8_avx2, 1, 0)
Q8_ENTRY(AVX2, q8_avx2_d16, block_q8_avx2, 2, 0)
Q8_ENTRY(AVX512, q8_avx512_n32, block_q8_avx512, 3, UNPACK_ROWS)
Q8_ENTRY(AVX512, q8_avx512_g16, block_q8_avx512, 4, UNPACK_ROWS)
Q8_ENTRY(AVX512, q8_avx512_d32g16, block_q8_avx512, 5, UNPACK_ROWS)
Q8_ENTRY(AVX2, q8_avx2_n32, block_q8_avx2, 3, 0)
Q8_ENTRY(AVX2, q8_avx2_g16, block_q8_avx2, 4, 0)
Q8_ENTRY(AVX2, q8_avx2_d32g16, block_q8_avx2, 5, 0)
Q8_ENTRY(AVX512, q8_avx512_super, block_q8_avx512, 6, UNPACK_ROWS)
Q8_ENTRY(AVX2, q8_avx2_super, block_q8_avx2, 6, 0)
Q8_ENTRY(AVX512, q8_avx512_q6, block_q8_avx512, 7, UNPACK_ROWS)
Q8_ENTRY(AVX2, q8_avx2_q6, block_q8_avx2, 7, 0)

static void linear_q8(int isa, int mode, const float *x, const int8_t *codes,
                      const void *scales, const float *bias, float *y, int64_t T, int64_t N,
                      int64_t K, int64_t ldy, int threads) {
  static void (*const entries[2][8])(const float *, const int8_t *, const void *, const float *,
                                     float *, int64_t, int64_t, int64_t, int64_t, int) = {
      {q8_avx2_f32, q8_avx2_f16, q8_avx2_d16, q8_avx2_n32, q8_avx2_g16, q8_avx2_d32g16,
       q8_avx2_super, q8_avx2_q6},
      {q8_avx512_f32, q8_avx512_f16, q8_avx512_d16, q8_avx512_n32, q8_avx512_g16,
       q8_avx512_d32g16, q8_avx512_super, q8_avx512_q6}};
  entries[isa == 2][mode](x, codes, scales, bias, y, T, N, K, ldy, threads);
}

#define CHUNK_ROWS 128 /* rows of x per pass: every block re-reads them, so they stay in cache */

int verispec_abi_version(void) { return VERISPEC_ABI_VERSION; }

/* linear_q8's scale mode of a weight format of codes times float inputs. */
static int q8_mode(WeightFormat format) {
  switch (format) {
    case VERISPEC_Q4_F16_DM: return 1;
    case VERISPEC_Q8_F16_D: return 2;
    case VERISPEC_Q4_F32_DM: return 3;
    case VERISPEC_Q8_F32_DM_HALVES: return 4;
    case VERISPEC_Q8_F32_D_HALVES: return 5;
    case VERISPEC_Q4_SUPER_DM: return 6;
    case VERISPEC_Q6_SUPER_D: return 7;
    default: return 0; /* VERISPEC_Q8_F32_DM */
  }
}

/* y [T, N] = x [T, K] W^T (+ bias), CHUNK_ROWS rows of x at a time (rows are independent, so the
 * split changes no result); format, verispec.h's WeightFormat: F32 = float32, F16 = float16,
 * Q8_F32_DM = 8-bit codes with scales, Q8_A8 = 8-bit codes (float16 scales) times x rounded to
 * 8-bit blocks, Q4_F16_DM = Q8_F32_DM with codes in 0..15 two a byte and float16 scales,
 * Q8_F16_D = Q8_F32_DM with m = 0 and float16 d (the same products as Q8_F32_DM), Q4_A8 = Q8_A8
 * with codes in 0..15 two a byte (the same products as Q8_A8), Q4_F32_DM = Q4_F16_DM's codes with
 * Q8_F32_DM's float32 scales (GGUF Q4_K; Q8_F32_DM's products), Q8_F32_DM_HALVES = Q8_F32_DM's
 * codes with float32 d and m for each 16 columns (GGUF Q6_K), Q8_F32_D_HALVES = Q8_F32_DM_HALVES
 * with m = 0 and d alone stored, Q4_F32_A8 = Q4_A8 with float32 d and m (GGUF Q4_K under a8;
 * Q4_A8's products), Q8_F32_A8 = Q8_A8 with float32 d and m (GGUF Q5_K under a8; Q8_A8's
 * products), Q4_SUPER_DM = Q4_F32_DM with Q4_K's scales as stored (super scales; Q4_F32_DM's
 * products), Q4_SUPER_A8 = Q4_F32_A8 with them (Q4_F32_A8's products), Q6_SUPER_D =
 * Q8_F32_D_HALVES with Q6_K's codes and d as stored (6-bit codes in a 4-bit and a 2-bit plane,
 * float16 d16 times int8 sc; Q8_F32_D_HALVES's products), Q6_SUPER_A8 = Q6_SUPER_D's codes (in
 * Q8_A8's order) and scales times x rounded to 8-bit blocks (GGUF Q6_K under a8). */
void verispec_linear(int isa, WeightFormat format, const float *x, const void *w,
                     const float *scales, const float *bias, float *y, int64_t T, int64_t N,
                     int64_t K, int threads) {
  const int level = isa & 3, asked = isa >> 2 & 3;
  if (level == 0) { /* neither AVX2 nor AVX-512 here (or asked for): portable.c's plain C */
    verispec_linear_portable(format, x, w, scales, bias, y, T, N, K, threads);
    return;
  }
  const int best = verispec_linear_dot(level);
  /* never one this CPU lacks; the scalar loop is isa 0's (portable.c) */
  const int dot = asked < VERISPEC_DOT_MADDUBS ? VERISPEC_DOT_MADDUBS : asked < best ? asked : best;
  for (int64_t t = 0; t < T; t += CHUNK_ROWS) {
    const int64_t n = T - t < CHUNK_ROWS ? T - t : CHUNK_ROWS;
    switch (format) {
    case VERISPEC_Q8_A8:
    case VERISPEC_Q4_A8:
    case VERISPEC_Q4_F32_A8:
    case VERISPEC_Q8_F32_A8:
    case VERISPEC_Q4_SUPER_A8:
    case VERISPEC_Q6_SUPER_A8:
      linear_a8(level, dot, format, x + t * K, w, (const char *)scales, bias, y + t * N, n, N,
                K, N, threads);
      break;
    case VERISPEC_Q8_F32_DM:
    case VERISPEC_Q4_F16_DM:
    case VERISPEC_Q8_F16_D:
    case VERISPEC_Q4_F32_DM:
    case VERISPEC_Q8_F32_DM_HALVES:
    case VERISPEC_Q8_F32_D_HALVES:
    case VERISPEC_Q4_SUPER_DM:
    case VERISPEC_Q6_SUPER_D:
      linear_q8(level, q8_mode(format), x + t * K, w, scales, bias, y + t * N, n, N, K, N,
                threads);
      break;
    case VERISPEC_F16:
      linear_f16(level, x + t * K, w, bias, y + t * N, n, N, K, N, threads);
      break;
    default:
      linear_f32(level, x + t * K, w, bias, y + t * N, n, N, K, N, threads);
    }
  }
}
