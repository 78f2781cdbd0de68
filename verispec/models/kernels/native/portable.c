/* verispec's products in plain C, for every weight format of verispec.h: what a CPU gets where
 * linear.c's instruction sets are missing (linear.c's verispec_linear hands isa 0 here), and,
 * on machines other than x86-64, the library's products altogether (the end of this file
 * stands in for linear.c's entry points there). No intrinsics: loops over 16-row blocks that
 * the compiler vectorizes for whatever it targets. The weights stay as packed, in every format.
 *
 * Numerics. The 8-bit-input formats (Q8_A8, Q4_A8, Q4_F32_A8, Q8_F32_A8, Q4_SUPER_A8,
 * Q6_SUPER_A8: "a8") give linear.c's bits: x is rounded by round_chunk's operations (nearest, ties
 * to even), a chunk's sums are exact integers (in any order), and each output then adds its chunks
 * by the very operations of linear.c's add_chunk and tile_q6_a8, in the same order, fmaf where
 * those use an fma. No other multiply and add may fuse into one rounding, so contraction is turned
 * off for this file. The float-input formats compute the same weights (d q + m with d q exact, one
 * rounding, as fma(d, q, m)), and each output adds its products in an order of its own: column k
 * into lane k % 16, columns in order, each product rounded before it is added, then the 16 lanes by
 * halves (8 + 8, 4 + 4, 2 + 2, 1 + 1). That order does not depend on the rows of the call, the
 * threads or the machine: a row is bit for bit its one-row product (row invariance) on every
 * CPU, though not linear.c's float results, whose fmas round once (close to them: tested). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "verispec.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define R 16            /* weight rows per block, lanes per output */
#define QC 32           /* columns per chunk of codes */
#define TILE_ROWS 8     /* rows of x per pass over a block (float formats) */
#define CHUNK_ROWS 128  /* rows of x per pass over the weight, as linear.c */
#define SUPER_CHUNKS 8  /* chunks per 256 columns (K-quant super-blocks) */
/* Scales of 256 columns of Q4_SUPER_DM and Q4_SUPER_A8, of Q6_SUPER_D and Q6_SUPER_A8; and the
 * latter two's codes of a chunk. */
#define SUPER_BYTES (4 * R + SUPER_CHUNKS * 2 * R)
#define Q6_SUPER_BYTES (2 * R + SUPER_CHUNKS * 2 * R)
#define Q6_CHUNK_BYTES (R * QC * 3 / 4)

/* float16 bits -> float32, exactly (as F16C's vcvtph2ps: subnormals normalised): by the
 * machine's own conversion where C has a float16 type (aarch64's __fp16), else by masks rather
 * than branches, so that loops over it vectorize. */
#if defined(__aarch64__)
static inline float half_float(const uint16_t h) {
  __fp16 f;
  memcpy(&f, &h, sizeof f);
  return (float)f;
}
#else
static inline float half_float(const uint16_t h) {
  const uint32_t e = (uint32_t)h >> 10 & 31, m = h & 0x3FF;
  const float small = (float)(int32_t)m * 0x1p-24f; /* subnormal or zero: m 2^-24, exact */
  uint32_t sub;
  memcpy(&sub, &small, sizeof sub);
  const uint32_t zero = 0u - (e == 0), top = 0u - (e == 31); /* all ones where so */
  const uint32_t bits = (sub & zero) | ((0x7F800000u | m << 13) & top) |
                        (((e + 112) << 23 | m << 13) & ~(zero | top));
  const uint32_t u = bits | (uint32_t)(h & 0x8000) << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
#endif

static inline int is_a8(const WeightFormat format) {
  return format == VERISPEC_Q8_A8 || format == VERISPEC_Q4_A8 || format == VERISPEC_Q4_F32_A8 ||
         format == VERISPEC_Q8_F32_A8 || format == VERISPEC_Q4_SUPER_A8 ||
         format == VERISPEC_Q6_SUPER_A8;
}

/* Codes two a byte (Q4_F16_DM, Q4_A8, Q4_F32_DM, Q4_F32_A8, Q4_SUPER_DM, Q4_SUPER_A8). */
static inline int is_nibbles(const WeightFormat format) {
  return format == VERISPEC_Q4_F16_DM || format == VERISPEC_Q4_F32_DM ||
         format == VERISPEC_Q4_SUPER_DM || format == VERISPEC_Q4_A8 ||
         format == VERISPEC_Q4_F32_A8 || format == VERISPEC_Q4_SUPER_A8;
}

/* Bytes of a chunk's codes (16 rows, 32 columns) as packed. */
static inline int64_t chunk_code_bytes(const WeightFormat format) {
  if (format == VERISPEC_Q6_SUPER_D || format == VERISPEC_Q6_SUPER_A8) return Q6_CHUNK_BYTES;
  return is_nibbles(format) ? R * QC / 2 : R * QC;
}

/* Bytes of a chunk's scales as packed (linear.c's chunk_scale_bytes and a8_scale_bytes). */
static inline int64_t chunk_scale_bytes(const WeightFormat format) {
  switch (format) {
    case VERISPEC_Q4_F16_DM:
    case VERISPEC_Q8_A8:
    case VERISPEC_Q4_A8: return 2 * R * 2; /* float16 d and m */
    case VERISPEC_Q8_F16_D: return R * 2;  /* float16 d */
    case VERISPEC_Q8_F32_DM_HALVES: return 4 * R * 4;
    case VERISPEC_Q4_SUPER_DM:
    case VERISPEC_Q4_SUPER_A8: return SUPER_BYTES / SUPER_CHUNKS;
    case VERISPEC_Q6_SUPER_D:
    case VERISPEC_Q6_SUPER_A8: return Q6_SUPER_BYTES / SUPER_CHUNKS;
    /* float32 d and m (Q8_F32_DM, Q4_F32_DM, Q4_F32_A8, Q8_F32_A8), or d of each half
     * (Q8_F32_D_HALVES) */
    default: return 2 * R * 4;
  }
}

/* The 6-bit values u (0..63) of a Q6_SUPER_D or Q6_SUPER_A8 chunk at p, by position: u[64 k + i]
 * from byte 64 (k / 2) + i's nibble k % 2 and byte 256 + 64 (k / 4) + i's bits 2 (k % 4), 2 (k % 4)
 * + 1 (blocks.c's verispec_pack_q6 gives the layout). */
static inline void q6_values(const uint8_t *p, uint8_t *u) {
  for (int k = 0; k < 8; k++)
    for (int i = 0; i < 64; i++)
      u[64 * k + i] = (uint8_t)((p[64 * (k / 2) + i] >> (4 * (k % 2)) & 15) |
                                (p[256 + 64 * (k / 4) + i] >> (2 * (k % 4)) & 3) << 4);
}

/* Chunk c's d and m of a Q4_K super-scaled block (Q4_SUPER_DM, Q4_SUPER_A8) as float32: d16 sc and
 * (-dmin) mn, exact products (linear.c's widen_super). */
static inline void super_dm(const uint8_t *block_scales, int64_t c, float *d, float *m) {
  const uint8_t *s = block_scales + (c / SUPER_CHUNKS) * SUPER_BYTES;
  const uint8_t *sub = s + 4 * R + (c % SUPER_CHUNKS) * 2 * R;
  for (int j = 0; j < R; j++) {
    uint16_t d16, negmin;
    memcpy(&d16, s + 2 * j, 2);
    memcpy(&negmin, s + 2 * (R + j), 2);
    d[j] = half_float(d16) * (float)sub[j];
    m[j] = half_float(negmin) * (float)sub[R + j];
  }
}

/* Chunk c's d of a Q6_K block (Q6_SUPER_D, Q6_SUPER_A8) for its first and last 16 columns: d16 sc,
 * exact (linear.c's widen_q6). */
static inline void q6_d(const uint8_t *block_scales, int64_t c, float d[2][R]) {
  const uint8_t *s = block_scales + (c / SUPER_CHUNKS) * Q6_SUPER_BYTES;
  const int8_t *sub = (const int8_t *)(s + 2 * R + (c % SUPER_CHUNKS) * 2 * R);
  for (int h = 0; h < 2; h++)
    for (int j = 0; j < R; j++) {
      uint16_t d16;
      memcpy(&d16, s + 2 * j, 2);
      d[h][j] = half_float(d16) * (float)sub[h * R + j];
    }
}

/* ------------------------------------------------------------------- float-input formats */

/* A chunk's weights as float32, in one of two orders, each the order its codes are packed in
 * (so that decoding and multiplying stream both in address order):
 *   by rows: w[j W + l] for row j, column l < W (W = 16 for F32 and F16, whose chunks are 16
 *     columns; 32 for codes a byte each, and Q6_SUPER_D's, whose planes give that order too);
 *   nibbles (codes two a byte): w[256 h + 64 v + 4 l + r] for row 4 v + r, column 16 h + l.
 * Each output j has 16 lanes, lane l adding columns l, 16 + l, 32 + l, ... in order; its lanes
 * are acc[16 j + l] (by rows) or acc[64 (j / 4) + 4 l + j % 4] (nibbles). */
static inline int64_t lane_at(const int nibbles, const int j, const int l) {
  return nibbles ? 64 * (j / 4) + 4 * l + j % 4 : R * j + l;
}

/* Chunk c of block b of a float-input weight as float32 in its order (above): F32's packed
 * values themselves, else decoded into buf. Codes: w = d q + m (d q exact, so one rounding:
 * fma(d, q, m), linear.c's weights), with d and m of the chunk or of each 16 columns.
 * Returns the weights; *width: columns a chunk. */
static const float *float_chunk(const WeightFormat format, const void *w, const void *scales,
                                int64_t b, int64_t c, int64_t K, float *buf, int *width) {
  *width = format == VERISPEC_F32 || format == VERISPEC_F16 ? R : QC;
  if (format == VERISPEC_F32) return (const float *)w + (b * (K / R) + c) * R * R;
  if (format == VERISPEC_F16) {
    const uint16_t *h = (const uint16_t *)w + (b * (K / R) + c) * R * R;
    for (int i = 0; i < R * R; i++) buf[i] = half_float(h[i]);
    return buf;
  }
  const int64_t C = K / QC, at = b * C + c, supers = C / SUPER_CHUNKS;
  const uint8_t *cb = (const uint8_t *)w + at * chunk_code_bytes(format);
  const char *sb = (const char *)scales + at * chunk_scale_bytes(format);
  const float *f = (const float *)sb;
  float d[2][R], m[2][R] = {{0}}; /* of columns 0-15, then 16-31 (halves) */
  for (int j = 0; j < R; j++) {
    uint16_t hd, hm;
    memcpy(&hd, sb + 2 * j, 2);
    memcpy(&hm, sb + 2 * (R + j), 2);
    switch (format) {
      case VERISPEC_Q4_F16_DM: d[0][j] = half_float(hd), m[0][j] = half_float(hm); break;
      case VERISPEC_Q8_F16_D: d[0][j] = half_float(hd); break;
      case VERISPEC_Q8_F32_DM_HALVES:
        d[0][j] = f[j], m[0][j] = f[R + j], d[1][j] = f[2 * R + j], m[1][j] = f[3 * R + j];
        break;
      case VERISPEC_Q8_F32_D_HALVES: d[0][j] = f[j], d[1][j] = f[R + j]; break;
      case VERISPEC_Q4_SUPER_DM:
      case VERISPEC_Q6_SUPER_D: break; /* below */
      default: d[0][j] = f[j], m[0][j] = f[R + j]; /* Q8_F32_DM, Q4_F32_DM */
    }
  }
  if (format == VERISPEC_Q4_SUPER_DM)
    super_dm((const uint8_t *)scales + b * supers * SUPER_BYTES, c, d[0], m[0]);
  if (format == VERISPEC_Q6_SUPER_D)
    q6_d((const uint8_t *)scales + b * supers * Q6_SUPER_BYTES, c, d);
  const int halves = format == VERISPEC_Q8_F32_DM_HALVES || format == VERISPEC_Q8_F32_D_HALVES ||
                     format == VERISPEC_Q6_SUPER_D;
  if (!halves)
    for (int j = 0; j < R; j++) d[1][j] = d[0][j], m[1][j] = m[0][j];
  if (is_nibbles(format)) {
    for (int h = 0; h < 2; h++)
      for (int v = 0; v < 4; v++)
        for (int l = 0; l < R; l++)
          for (int r = 0; r < 4; r++) {
            const int code = cb[64 * v + 4 * l + r] >> (4 * h) & 15;
            buf[256 * h + 64 * v + 4 * l + r] = d[h][4 * v + r] * (float)code + m[h][4 * v + r];
          }
    return buf;
  }
  int8_t q[R * QC]; /* by rows; Q6_SUPER_D's planes hold u = q + 32 */
  if (format == VERISPEC_Q6_SUPER_D) {
    uint8_t u[R * QC];
    q6_values(cb, u);
    for (int i = 0; i < R * QC; i++) q[i] = (int8_t)(u[i] - 32);
  } else {
    memcpy(q, cb, sizeof q);
  }
  for (int j = 0; j < R; j++)
    for (int h = 0; h < 2; h++)
      for (int l = 0; l < R; l++)
        buf[j * QC + R * h + l] = d[h][j] * (float)q[j * QC + R * h + l] + m[h][j];
  return buf;
}

/* Rows t0 .. t0 + n - 1 (n <= TILE_ROWS) of x against block b of a float-input weight. */
static void float_tile(const WeightFormat format, const float *x, const void *w, const void *scales,
                       const float *bias, float *y, int64_t N, int64_t K, int64_t b, int64_t t0,
                       int64_t n) {
  float acc[TILE_ROWS][R * R], buf[R * QC];
  memset(acc, 0, sizeof acc);
  const int nibbles = is_nibbles(format);
  const int64_t chunks = format == VERISPEC_F32 || format == VERISPEC_F16 ? K / R : K / QC;
  for (int64_t c = 0; c < chunks; c++) {
    int width;
    const float *wc = float_chunk(format, w, scales, b, c, K, buf, &width);
    for (int64_t i = 0; i < n; i++) {
      const float *xc = x + (t0 + i) * K + c * width;
      float *a = acc[i];
      if (nibbles) {
        for (int h = 0; h < 2; h++)
          for (int v = 0; v < 4; v++)
            for (int l = 0; l < R; l++)
              for (int r = 0; r < 4; r++) {
                const int64_t p = 64 * v + 4 * l + r;
                a[p] = a[p] + wc[256 * h + p] * xc[R * h + l];
              }
        continue;
      }
      for (int h = 0; h < width / R; h++)
        for (int j = 0; j < R; j++)
          for (int l = 0; l < R; l++)
            a[R * j + l] = a[R * j + l] + wc[j * width + R * h + l] * xc[R * h + l];
    }
  }
  const int64_t n0 = b * R, rows = N - n0 < R ? N - n0 : R;
  for (int64_t i = 0; i < n; i++)
    for (int j = 0; j < rows; j++) {
      float s[8]; /* the 16 lanes summed by halves */
      for (int l = 0; l < 8; l++)
        s[l] = acc[i][lane_at(nibbles, j, l)] + acc[i][lane_at(nibbles, j, l + 8)];
      for (int l = 0; l < 4; l++) s[l] = s[l] + s[l + 4];
      for (int l = 0; l < 2; l++) s[l] = s[l] + s[l + 2];
      const float sum = s[0] + s[1];
      y[(t0 + i) * N + n0 + j] = bias ? sum + bias[n0 + j] : sum;
    }
}

static void linear_float(const WeightFormat format, const float *x, const void *w,
                         const void *scales, const float *bias, float *y, int64_t T, int64_t N,
                         int64_t K, int threads) {
  const int64_t blocks = (N + R - 1) / R;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t b = 0; b < blocks; b++)
    for (int64_t t = 0; t < T; t += TILE_ROWS)
      float_tile(format, x, w, scales, bias, y, N, K, b, t,
                 T - t < TILE_ROWS ? T - t : TILE_ROWS);
}

/* --------------------------------------------------------- 8-bit-input formats ("a8") */

/* x rounded to 8-bit blocks, chunk-major as linear.c's RoundedRows: chunk c of row t is entry
 * c T + t. */
typedef struct {
  int8_t *q;      /* [C][T][32] */
  float *dx, *mx; /* [C][T] */
  int64_t T, C;
} Rounded;

/* One chunk of x rounded as linear.c's round_chunk rounds it: d_x = max |x| / 127, q = x (127
 * / max |x|) to the nearest integer, ties to even (nearbyintf in the default rounding mode, as
 * cvtss2si), NaN and out-of-range values giving cvtss2si's INT32_MIN; mx = d_x sum q. */
static void round_chunk(const float *x, int8_t *q, float *dx, float *mx) {
  float amax = 0.0f;
  for (int l = 0; l < QC; l++) {
    const float a = fabsf(x[l]);
    amax = a > amax ? a : amax;
  }
  const float inv = amax > 0 ? 127.0f / amax : 0.0f;
  uint32_t sum = 0; /* wraps as the x86 sums do, for inputs that are no numbers */
  for (int l = 0; l < QC; l++) {
    const float v = nearbyintf(x[l] * inv);
    const int32_t i = v >= -2147483648.0f && v < 2147483648.0f ? (int32_t)v : INT32_MIN;
    q[l] = (int8_t)i;
    sum += (uint32_t)i;
  }
  *dx = amax / 127.0f;
  *mx = *dx * (float)(int32_t)sum;
}

static void round_rows(const float *x, int64_t T, int64_t K, Rounded r, int threads) {
  const int64_t n = T * (K / QC);
  if (n < 512) threads = 1; /* not worth a wake-up */
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; i++) {
    const int64_t e = (i % r.C) * r.T + i / r.C;
    round_chunk(x + i * QC, r.q + e * QC, r.dx + e, r.mx + e);
  }
}

/* Chunk c of block b of an a8 weight: its codes as signed values in Q8_A8's order, cw[64 k +
 * 4 j + e] for row j, column 4 k + e (Q8_A8, Q8_F32_A8: the stored u - 128; Q4_A8, Q4_F32_A8,
 * Q4_SUPER_A8: vector k's low 4 bits, and for k + 4 its high 4 bits; Q6_SUPER_A8: u - 32), so that
 * the integer sums are linear.c's (sum u q_x - 128 sum q_x = sum (u - 128) q_x); d[0], m: the
 * chunk's d and m; Q6_SUPER_A8: d[h] of columns 16 h .. 16 h + 15, no m. */
static void a8_chunk(const WeightFormat format, const uint8_t *codes, const char *scales, int64_t b,
                     int64_t c, int64_t C, int8_t *cw, float d[2][R], float m[R]) {
  const int64_t at = b * C + c;
  const uint8_t *cb = codes + at * chunk_code_bytes(format);
  if (format == VERISPEC_Q6_SUPER_A8) {
    uint8_t u[R * QC];
    q6_values(cb, u);
    for (int i = 0; i < R * QC; i++) cw[i] = (int8_t)(u[i] - 32);
    q6_d((const uint8_t *)scales + b * (C / SUPER_CHUNKS) * Q6_SUPER_BYTES, c, d);
    return;
  }
  if (is_nibbles(format)) {
    for (int i = 0; i < R * QC / 2; i++)
      cw[i] = (int8_t)(cb[i] & 15), cw[R * QC / 2 + i] = (int8_t)(cb[i] >> 4);
  } else {
    for (int i = 0; i < R * QC; i++) cw[i] = (int8_t)(cb[i] - 128);
  }
  if (format == VERISPEC_Q4_SUPER_A8) {
    super_dm((const uint8_t *)scales + b * (C / SUPER_CHUNKS) * SUPER_BYTES, c, d[0], m);
    return;
  }
  const char *sb = scales + at * chunk_scale_bytes(format);
  const int f32 = format == VERISPEC_Q4_F32_A8 || format == VERISPEC_Q8_F32_A8;
  for (int j = 0; j < R; j++) {
    uint16_t hd, hm;
    memcpy(&hd, sb + 2 * j, 2);
    memcpy(&hm, sb + 2 * (R + j), 2);
    d[0][j] = f32 ? ((const float *)sb)[j] : half_float(hd);
    m[j] = f32 ? ((const float *)sb)[R + j] : half_float(hm);
  }
}

/* Block b against all T rows of r: per row and weight row j, the chunks in column order, each
 * by linear.c's operations: Q8_A8, Q4_A8, Q4_F32_A8, Q8_F32_A8, Q4_SUPER_A8 acc = fma(d_x d,
 * (float)sum, acc), then acc = fma(m, mx, acc) (add_chunk); Q6_SUPER_A8 acc = fma(d_x d_lo,
 * (float)lo, acc), then the same with its last 16 columns' hi (tile_q6_a8). acc: room for T x 16
 * sums. */
static void a8_block(const WeightFormat format, const Rounded r, const uint8_t *codes,
                     const char *scales, const float *bias, float *y, int64_t N, int64_t b,
                     float *acc) {
  const int64_t T = r.T, C = r.C, n0 = b * R, rows = N - n0 < R ? N - n0 : R;
  const int q6 = format == VERISPEC_Q6_SUPER_A8;
  memset(acc, 0, sizeof(float) * R * T);
  for (int64_t c = 0; c < C; c++) {
    int8_t cw[R * QC];
    float d[2][R], m[R];
    a8_chunk(format, codes, scales, b, c, C, cw, d, m);
    for (int64_t t = 0; t < T; t++) {
      const int64_t tc = c * T + t;
      const int8_t *q = r.q + tc * QC;
      int32_t lanes[2][64] = {{0}}; /* [half][4 j + e]: columns 4 k + e of row j, k < 4, >= 4 */
      for (int k = 0; k < 8; k++)
        for (int j = 0; j < R; j++)
          for (int e = 0; e < 4; e++)
            lanes[k / 4][4 * j + e] += cw[64 * k + 4 * j + e] * q[4 * k + e];
      const float dx = r.dx[tc], mx = r.mx[tc];
      float *a = acc + t * R;
      for (int j = 0; j < R; j++) {
        const int32_t *lo = lanes[0] + 4 * j, *hi = lanes[1] + 4 * j;
        const int32_t slo = lo[0] + lo[1] + lo[2] + lo[3], shi = hi[0] + hi[1] + hi[2] + hi[3];
        if (q6) {
          a[j] = fmaf(dx * d[0][j], (float)slo, a[j]);
          a[j] = fmaf(dx * d[1][j], (float)shi, a[j]);
        } else {
          a[j] = fmaf(dx * d[0][j], (float)(slo + shi), a[j]);
          a[j] = fmaf(m[j], mx, a[j]);
        }
      }
    }
  }
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < rows; j++)
      y[t * N + n0 + j] = bias ? acc[t * R + j] + bias[n0 + j] : acc[t * R + j];
}

static void linear_a8(const WeightFormat format, const float *x, const void *w, const void *scales,
                      const float *bias, float *y, int64_t T, int64_t N, int64_t K,
                      int threads) {
  const int64_t C = K / QC, blocks = (N + R - 1) / R;
  /* one buffer: dx, mx [C][T] float, then q [C][T][32] */
  float *f = malloc(sizeof(float) * 2 * T * C + (size_t)(T * K));
  const Rounded r = {(int8_t *)(f + 2 * T * C), f, f + T * C, T, C};
  round_rows(x, T, K, r, threads);
#pragma omp parallel num_threads(threads)
  {
    float *acc = malloc(sizeof(float) * R * T);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; b++)
      a8_block(format, r, w, scales, bias, y, N, b, acc);
    free(acc);
  }
  free(f);
}

/* y [T, N] = x [T, K] W^T (+ bias) for W packed in any format of verispec.h (K padded as
 * packed: 16 for F32 and F16, 32 for codes), CHUNK_ROWS rows of x at a time (rows are
 * independent: the split changes no result). */
void verispec_linear_portable(WeightFormat format, const float *x, const void *w,
                              const float *scales, const float *bias, float *y, int64_t T,
                              int64_t N, int64_t K, int threads) {
  for (int64_t t = 0; t < T; t += CHUNK_ROWS) {
    const int64_t n = T - t < CHUNK_ROWS ? T - t : CHUNK_ROWS;
    if (is_a8(format))
      linear_a8(format, x + t * K, w, scales, bias, y + t * N, n, N, K, threads);
    else
      linear_float(format, x + t * K, w, scales, bias, y + t * N, n, N, K, threads);
  }
}

#if !defined(__x86_64__)
/* linear.c is x86-64 code (its intrinsics): on other machines the library is this file and
 * blocks.c, and these stand in for linear.c's entry points, every product on isa 0. layer.c
 * is x86-64 code too: models run their layers in torch there (build.NativeKernel.stack). */
int verispec_abi_version(void) { return VERISPEC_ABI_VERSION; }
int verispec_linear_isa(void) { return 0; }
int verispec_linear_dot(int isa) {
  (void)isa;
  return VERISPEC_DOT_SCALAR;
}
void verispec_linear(int isa, WeightFormat format, const float *x, const void *w,
                     const float *scales, const float *bias, float *y, int64_t T, int64_t N,
                     int64_t K, int threads) {
  (void)isa;
  verispec_linear_portable(format, x, w, scales, bias, y, T, N, K, threads);
}
#endif
