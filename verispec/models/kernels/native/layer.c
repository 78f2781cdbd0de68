/* A decoder stack in native code (verispec_decoder_stack, at the end): every layer of one
 * forward in one call, the products on linear.c's kernel, the rest here: RMSNorm with the
 * residual add, rotary embedding with the KV-cache write, paged attention, the SiLU gate.
 *
 * Why: in eager torch a decode step of a 30-layer model runs some 20 small operators per layer,
 * each a dispatch through Python, an allocation and a wake of the thread pool, and together they
 * cost as much as streaming the weights (native_layer.py).
 *
 * Row invariance: every output row is computed from its own inputs by one fixed sequence of
 * operations (attention visits a row's visible keys in cache order), so a row does not depend
 * on how many rows share the call; a verify row equals the decode step of the same token, bit
 * for bit, like the linear kernel's rows (linear.c).
 *
 * Needs AVX2 and FMA (the library is loaded only where linear.c's kernel can run).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "verispec.h"

#define FAST __attribute__((target("avx2,fma")))
#define INLINE static inline __attribute__((always_inline))

FAST INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* sum_i a[i] * b[i]: two 8-lane accumulators, then one fixed reduction, then the tail. */
FAST INLINE float dot(const float *a, const float *b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  if (i + 8 <= n) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    i += 8;
  }
  float s = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}

/* y[i] += a * x[i]. */
FAST INLINE void axpy(float a, const float *x, float *y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; i++) y[i] += a * x[i];
}

/* e^x in 8 lanes, within about 2 ulp (Cephes' expf polynomial); inputs are clamped to
 * [-87.3, 88], so very negative ones give about 1e-38 rather than 0. */
FAST INLINE __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* e^x of one value by the same arithmetic as exp8 (tails of vector loops). */
FAST INLINE float exp1(float x) {
  float in[8] = {x}, out[8];
  _mm256_storeu_ps(out, exp8(_mm256_loadu_ps(in)));
  return out[0];
}

/* out = w * (x * rsqrt(mean(x^2) + eps)) for one row of n values. */
FAST static void norm_row(const float *x, const float *w, float *out, int64_t n, float eps) {
  const float inv = 1.0f / sqrtf(dot(x, x, n) / (float)n + eps);
  for (int64_t i = 0; i < n; i++) out[i] = w[i] * (x[i] * inv);
}

/* For each of `rows` rows of n values: x += delta (when delta is not NULL), then
 * out = RMSNorm(x) * w. x is the residual stream, updated in place. */
FAST static void add_rms_norm(float *x, const float *delta, const float *w, float *out,
                                int64_t rows, int64_t n, float eps, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows >= 8)
  for (int64_t t = 0; t < rows; t++) {
    float *xr = x + t * n;
    if (delta) {
      const float *dr = delta + t * n;
      for (int64_t i = 0; i < n; i++) xr[i] += dr[i];
    }
    norm_row(xr, w, out + t * n, n, eps);
  }
}

/* Rotate one head of dim values by its row's cos and sin (transformers' half-split form):
 * x[i] * cos[i] + r[i] * sin[i] with r = (-x[half:], x[:half]). */
FAST static void rotate(float *x, const float *cos, const float *sin, int64_t dim) {
  const int64_t half = dim / 2;
  float r[dim];
  for (int64_t i = 0; i < half; i++) r[i] = -x[half + i], r[half + i] = x[i];
  for (int64_t i = 0; i < dim; i++) x[i] = x[i] * cos[i] + r[i] * sin[i];
}

/* The rotary tables cos, sin [rows, dim] of the rows' positions, as rope.py's rope_cos_sin:
 * angle i (and i + dim / 2) of a row = (float)position * inv_freq[i]. */
static void rotary_tables(const int64_t *positions, const float *inv_freq, float *cos,
                          float *sin, int64_t rows, int64_t dim) {
  const int64_t half = dim / 2;
  for (int64_t t = 0; t < rows; t++)
    for (int64_t i = 0; i < half; i++) {
      const float angle = (float)positions[t] * inv_freq[i];
      cos[t * dim + i] = cos[t * dim + half + i] = cosf(angle);
      sin[t * dim + i] = sin[t * dim + half + i] = sinf(angle);
    }
}

/* qkv [rows, (heads + 2 kv_heads) * dim]: queries, keys, values of each new token. In place:
 * the per-head norms (q_norm / k_norm [dim], Qwen3; NULL to skip), then rotation of queries
 * and keys by cos / sin [rows, dim]; then the keys and values are stored at kv slot slots[t] of
 * kc / vc [slots, kv_heads, dim]. */
FAST static void rope_store(float *qkv, const float *cos, const float *sin,
                              const float *q_norm, const float *k_norm, float eps,
                              const int64_t *slots, float *kc, float *vc, int64_t rows,
                              int64_t heads, int64_t kv_heads, int64_t dim) {
  const int64_t width = (heads + 2 * kv_heads) * dim;
  for (int64_t t = 0; t < rows; t++) {
    float *row = qkv + t * width;
    for (int64_t h = 0; h < heads + kv_heads; h++) {
      float *x = row + h * dim;
      const float *w = h < heads ? q_norm : k_norm;
      if (w) norm_row(x, w, x, dim, eps);
      rotate(x, cos + t * dim, sin + t * dim, dim);
    }
    const int64_t at = slots[t] * kv_heads * dim;
    for (int64_t i = 0; i < kv_heads * dim; i++) {
      kc[at + i] = row[heads * dim + i];
      vc[at + i] = row[(heads + kv_heads) * dim + i];
    }
  }
}

#define AHEAD 16 /* keys ahead whose lines are prefetched */

/* Ask for the cache lines of n floats at x (cached keys and values come from memory: a step
 * streams megabytes of weights between two reads of one layer's cache). */
INLINE void fetch(const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) _mm_prefetch((const char *)(x + i), _MM_HINT_T0);
}

/* The dot products of q with 8 keys k[0..7] (dim a multiple of 8) as 8 lanes: each key by the
 * same sequence (8-lane products in column order, then one fixed pairwise reduction), so a
 * key's score does not depend on the other keys of its group. */
FAST INLINE __m256 dot8(const float *q, const float *const *k, int64_t dim) {
  __m256 a[8];
  for (int u = 0; u < 8; u++) a[u] = _mm256_setzero_ps();
  for (int64_t i = 0; i < dim; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    for (int u = 0; u < 8; u++) a[u] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[u] + i), a[u]);
  }
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* scores[j] = q . key j * scale for n keys at kc + slots[j] * stride. */
FAST static void key_scores(const float *q, const float *kc, const int64_t *slots, int64_t n,
                            int64_t stride, int64_t dim, float scale, float *scores) {
  if (dim % 8) {
    for (int64_t j = 0; j < n; j++) scores[j] = dot(q, kc + slots[j] * stride, dim) * scale;
    return;
  }
  const __m256 sv = _mm256_set1_ps(scale);
  for (int64_t j = 0; j < n; j += 8) {
    for (int64_t f = j + AHEAD; f < j + AHEAD + 8 && f < n; f++) fetch(kc + slots[f] * stride, dim);
    const float *k[8];
    for (int u = 0; u < 8; u++) k[u] = kc + slots[j + u < n ? j + u : n - 1] * stride;
    float lane[8];
    _mm256_storeu_ps(lane, _mm256_mul_ps(dot8(q, k, dim), sv));
    for (int u = 0; u < 8 && j + u < n; u++) scores[j + u] = lane[u];
  }
}

/* out = sum_j p[j] * value j, over n values at vc + slots[j] * stride, in key order; 64 columns
 * at a time in registers when dim allows. */
FAST static void weighted_values(const float *p, const float *vc, const int64_t *slots,
                                 int64_t n, int64_t stride, int64_t dim, float *out) {
  int64_t c = 0;
  for (; c + 64 <= dim; c += 64) {
    __m256 acc[8];
    for (int u = 0; u < 8; u++) acc[u] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j++) {
      if (j + AHEAD < n) fetch(vc + slots[j + AHEAD] * stride + c, 64);
      const __m256 pj = _mm256_set1_ps(p[j]);
      const float *v = vc + slots[j] * stride + c;
      for (int u = 0; u < 8; u++) acc[u] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 8 * u), acc[u]);
    }
    for (int u = 0; u < 8; u++) _mm256_storeu_ps(out + c + 8 * u, acc[u]);
  }
  if (c == dim) return;
  for (int64_t i = c; i < dim; i++) out[i] = 0.0f;
  for (int64_t j = 0; j < n; j++) axpy(p[j], vc + slots[j] * stride + c, out + c, dim - c);
}

/* scores[j] <- e^(scores[j] - max) in place; returns their sum (softmax without the division,
 * which is applied to the weighted values). */
FAST static float exp_scores(float *scores, int64_t n) {
  __m256 most = _mm256_set1_ps(-INFINITY); /* max is exact: any order finds the same value */
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) most = _mm256_max_ps(_mm256_loadu_ps(scores + j), most);
  float lanes[8], best = -INFINITY;
  _mm256_storeu_ps(lanes, most);
  for (int u = 0; u < 8; u++) best = lanes[u] > best ? lanes[u] : best;
  for (; j < n; j++) best = scores[j] > best ? scores[j] : best;
  const __m256 top = _mm256_set1_ps(best);
  __m256 sum = _mm256_setzero_ps();
  for (j = 0; j + 8 <= n; j += 8) {
    const __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + j), top));
    _mm256_storeu_ps(scores + j, p);
    sum = _mm256_add_ps(sum, p);
  }
  float total = hsum(sum);
  for (; j < n; j++) total += (scores[j] = exp1(scores[j] - best));
  return total;
}

/* Attention of one query head over n keys at slots (scores: scratch of n floats). */
FAST static void attend_head(const float *q, const float *kc, const float *vc,
                             const int64_t *slots, int64_t n, int64_t stride, int64_t dim,
                             float scale, float *scores, float *out) {
  key_scores(q, kc, slots, n, stride, dim, scale, scores);
  const float total = exp_scores(scores, n);
  weighted_values(scores, vc, slots, n, stride, dim, out);
  const float inv = 1.0f / total;
  for (int64_t i = 0; i < dim; i++) out[i] *= inv;
}

#define SHARE 3 /* query heads of one group that share each load of a key or value */

/* The scores of H <= SHARE query heads q + h * dim of one kv group against the keys at
 * positions j0 .. j1 - 1 of slots (j0 a multiple of 4, j1 <= n): scores[h * ld + j] = q_h .
 * key j * scale, each by dot8's sequence (8-lane products in column order, the same pairwise
 * reduction), so a score does not depend on the range it was computed in. 4 keys by H heads
 * at a time (4 H accumulators), each key loaded once for all heads. */
FAST INLINE void group_scores(const float *q, const int H, const float *kc, const int64_t *slots,
                              int64_t j0, int64_t j1, int64_t n, int64_t stride, int64_t dim,
                              float scale, float *scores, int64_t ld, int ahead) {
  const __m128 sv = _mm_set1_ps(scale);
  for (int64_t j = j0; j < j1; j += 4) {
    for (int64_t f = j + AHEAD; ahead && f < j + AHEAD + 4 && f < n; f++)
      fetch(kc + slots[f] * stride, dim);
    const float *k[4];
    for (int u = 0; u < 4; u++) k[u] = kc + slots[j + u < n ? j + u : n - 1] * stride;
    __m256 a[SHARE][4];
    for (int h = 0; h < H; h++)
      for (int u = 0; u < 4; u++) a[h][u] = _mm256_setzero_ps();
    for (int64_t i = 0; i < dim; i += 8) {
      __m256 qv[SHARE];
      for (int h = 0; h < H; h++) qv[h] = _mm256_loadu_ps(q + h * dim + i);
      for (int u = 0; u < 4; u++) {
        const __m256 kv = _mm256_loadu_ps(k[u] + i);
        for (int h = 0; h < H; h++) a[h][u] = _mm256_fmadd_ps(qv[h], kv, a[h][u]);
      }
    }
    for (int h = 0; h < H; h++) { /* dot8's reduction: lanes 0-3 and 4-7 pairwise, then added */
      const __m256 r = _mm256_hadd_ps(_mm256_hadd_ps(a[h][0], a[h][1]),
                                      _mm256_hadd_ps(a[h][2], a[h][3]));
      float lane[4];
      _mm_storeu_ps(lane, _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(r),
                                                _mm256_extractf128_ps(r, 1)), sv));
      for (int u = 0; u < 4 && j + u < j1; u++) scores[h * ld + j + u] = lane[u];
    }
  }
}

/* Columns c .. c + 31 of H heads' weighted values: out[h * dim + c + i] += sum over keys j0 ..
 * j1 - 1 of p_h[j] * value j (p_h = scores + h * ld; from 0 when j0 is 0), each column's terms
 * added in key order, so splitting the keys into consecutive ranges gives the same bits. */
FAST INLINE void group_values(const int H, const float *scores, int64_t ld, const float *vc,
                              const int64_t *slots, int64_t j0, int64_t j1, int64_t n,
                              int64_t stride, int64_t c, float *out, int64_t dim, int ahead) {
  __m256 acc[SHARE][4];
  for (int h = 0; h < H; h++)
    for (int u = 0; u < 4; u++)
      acc[h][u] = j0 ? _mm256_loadu_ps(out + h * dim + c + 8 * u) : _mm256_setzero_ps();
  for (int64_t j = j0; j < j1; j++) {
    if (ahead && j + AHEAD < n) fetch(vc + slots[j + AHEAD] * stride + c, 32);
    const float *v = vc + slots[j] * stride + c;
    __m256 p[SHARE];
    for (int h = 0; h < H; h++) p[h] = _mm256_set1_ps(scores[h * ld + j]);
    for (int u = 0; u < 4; u++) {
      const __m256 vv = _mm256_loadu_ps(v + 8 * u);
      for (int h = 0; h < H; h++) acc[h][u] = _mm256_fmadd_ps(p[h], vv, acc[h][u]);
    }
  }
  for (int h = 0; h < H; h++)
    for (int u = 0; u < 4; u++) _mm256_storeu_ps(out + h * dim + c + 8 * u, acc[h][u]);
}

/* The slots each row sees under one mask (Keys, verispec.h, says which), in cache order: row
 * t's count[t] slots start at slots + t * room. */
typedef struct {
  int64_t *slots, *count, room;
} Visible;

static Visible visible_keys(const Keys *keys, const uint8_t *mask, int64_t rows, int threads) {
  const int64_t max_q = keys->max_q, max_ctx = keys->max_ctx, room = max_ctx > 0 ? max_ctx : 1;
  Visible v = {malloc(sizeof(int64_t) * (size_t)(rows * room)),
               malloc(sizeof(int64_t) * (size_t)rows), room};
  int64_t *seq_of = malloc(sizeof(int64_t) * (size_t)rows);
  for (int64_t s = 0; s < keys->num_seqs; s++)
    for (int64_t t = keys->cu[s]; t < keys->cu[s + 1]; t++) seq_of[t] = s;
#pragma omp parallel for schedule(static) num_threads(threads) if (rows >= 16)
  for (int64_t t = 0; t < rows; t++) {
    const int64_t s = seq_of[t], i = t - keys->cu[s], ctx = keys->ctx[s];
    const int64_t own = ctx - (keys->cu[s + 1] - keys->cu[s]) + i; /* the row's own key */
    const uint8_t *seen = mask ? mask + (s * max_q + i) * max_ctx : NULL;
    const int64_t *table = keys->tables ? keys->tables + s * keys->max_blocks : NULL;
    const int64_t bs = keys->block_size;
    int64_t n = 0, *out = v.slots + t * room;
    for (int64_t j = 0; j < (seen ? ctx : own + 1); j++)
      if (!seen || seen[j]) out[n++] = table ? table[j / bs] * bs + j % bs : keys->kv_start + j;
    v.count[t] = n;
  }
  free(seq_of);
  return v;
}

#define KEY_TILE 64 /* keys whose cached rows every row of a chunk uses while they are hot */

/* Attention of H <= SHARE query heads of one kv group for rows t0 .. t1 - 1, each row over its
 * own visible keys (v), the query of row t and head h at q + t * width + h * dim, its output at
 * out + t * out_stride + h * dim; scores: scratch of (t1 - t0) H v->room floats. The keys go
 * by in tiles of KEY_TILE positions, each tile's keys and values serving every row of the
 * chunk while they are in the cache (rows of one sequence share their context keys). Each
 * result is attend_head's bit for bit (group_scores, exp_scores, group_values in key order), so
 * it does not depend on which rows share the chunk (dim a multiple of 32). */
FAST INLINE void attend_rows_n(const float *q, int64_t width, int64_t t0, int64_t t1,
                               const int H, const float *kc, const float *vc, const Visible *v,
                               int64_t stride, int64_t dim, float scale, float *scores,
                               float *out, int64_t out_stride) {
  const int64_t room = v->room;
  int64_t most = 0;
  for (int64_t t = t0; t < t1; t++) most = v->count[t] > most ? v->count[t] : most;
  for (int64_t j0 = 0; j0 < most; j0 += KEY_TILE)
    for (int64_t t = t0; t < t1; t++) {
      const int64_t n = v->count[t], j1 = j0 + KEY_TILE < n ? j0 + KEY_TILE : n;
      if (j0 < n)
        group_scores(q + t * width, H, kc, v->slots + t * room, j0, j1, n, stride, dim, scale,
                     scores + (t - t0) * H * room, room, t == t0);
    }
  float inv[16][SHARE];
  for (int64_t t = t0; t < t1; t++)
    for (int h = 0; h < H; h++)
      inv[t - t0][h] = 1.0f / exp_scores(scores + ((t - t0) * H + h) * room, v->count[t]);
  for (int64_t c = 0; c < dim; c += 32)
    for (int64_t j0 = 0; j0 < most; j0 += KEY_TILE)
      for (int64_t t = t0; t < t1; t++) {
        const int64_t n = v->count[t], j1 = j0 + KEY_TILE < n ? j0 + KEY_TILE : n;
        if (j0 < n)
          group_values(H, scores + (t - t0) * H * room, room, vc, v->slots + t * room, j0, j1,
                       n, stride, c, out + t * out_stride, dim, t == t0);
      }
  for (int64_t t = t0; t < t1; t++)
    for (int h = 0; h < H; h++)
      for (int64_t i = 0; i < dim; i++) out[t * out_stride + h * dim + i] *= inv[t - t0][h];
}

#define MAX_CHUNK 16 /* rows of one attend_rows job (inv's size above) */

/* attend_rows_n compiled for each H, its loops over heads unrolled (as a runtime bound they
 * left branches and spilled accumulators in the inner loops). */
FAST static void attend_rows(const float *q, int64_t width, int64_t t0, int64_t t1, const int H,
                             const float *kc, const float *vc, const Visible *v, int64_t stride,
                             int64_t dim, float scale, float *scores, float *out,
                             int64_t out_stride) {
  if (H == 3)
    attend_rows_n(q, width, t0, t1, 3, kc, vc, v, stride, dim, scale, scores, out, out_stride);
  else if (H == 2)
    attend_rows_n(q, width, t0, t1, 2, kc, vc, v, stride, dim, scale, scores, out, out_stride);
  else
    attend_rows_n(q, width, t0, t1, 1, kc, vc, v, stride, dim, scale, scores, out, out_stride);
}

/* group_scores and group_values compiled for each H (as attend_rows). */
FAST static void scores_of(const float *q, const int H, const float *kc, const int64_t *slots,
                           int64_t j0, int64_t j1, int64_t n, int64_t stride, int64_t dim,
                           float scale, float *scores, int64_t ld) {
  if (H == 3) group_scores(q, 3, kc, slots, j0, j1, n, stride, dim, scale, scores, ld, 1);
  else if (H == 2) group_scores(q, 2, kc, slots, j0, j1, n, stride, dim, scale, scores, ld, 1);
  else group_scores(q, 1, kc, slots, j0, j1, n, stride, dim, scale, scores, ld, 1);
}

FAST static void values_of(const int H, const float *scores, int64_t ld, const float *vc,
                           const int64_t *slots, int64_t n, int64_t stride, int64_t c,
                           float *out, int64_t dim) {
  if (H == 3) group_values(3, scores, ld, vc, slots, 0, n, n, stride, c, out, dim, 1);
  else if (H == 2) group_values(2, scores, ld, vc, slots, 0, n, n, stride, c, out, dim, 1);
  else group_values(1, scores, ld, vc, slots, 0, n, n, stride, c, out, dim, 1);
}

#define SPLIT_ROWS 1 /* steps of at most this many rows take attend_split (see attend) */

/* Attention of a few rows (a decode step) in three passes, each shared out over the threads in
 * small jobs, so that 2 threads share 3 kv groups evenly: scores by (row, kv group, tile of
 * KEY_TILE keys), then e^ and the sum by (row, head), then values by (row, kv group, 32
 * columns). Every score, sum and column is computed as attend_rows computes it, so the bits
 * are the same (dim a multiple of 32). */
FAST static void attend_split(const float *qkv, const float *kc, const float *vc,
                              const Visible *v, float *out, int64_t rows, int64_t heads,
                              int64_t kv_heads, int64_t dim, float scale, int threads) {
  const int64_t width = (heads + 2 * kv_heads) * dim, group = heads / kv_heads;
  const int64_t stride = kv_heads * dim, room = v->room, tiles = (room + KEY_TILE - 1) / KEY_TILE;
  const int64_t blocks = dim / 32;
  float *scores = malloc(sizeof(float) * (size_t)(rows * heads * room));
  float *inv = malloc(sizeof(float) * (size_t)(rows * heads));
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t job = 0; job < rows * kv_heads * tiles; job++) {
      const int64_t t = job / (kv_heads * tiles), g = job / tiles % kv_heads;
      const int64_t n = v->count[t], j0 = job % tiles * KEY_TILE;
      if (j0 >= n) continue;
      for (int64_t h = g * group; h < (g + 1) * group; h += SHARE) {
        const int H = (int)((g + 1) * group - h < SHARE ? (g + 1) * group - h : SHARE);
        scores_of(qkv + t * width + h * dim, H, kc + g * dim, v->slots + t * room, j0,
                  j0 + KEY_TILE < n ? j0 + KEY_TILE : n, n, stride, dim, scale,
                  scores + (t * heads + h) * room, room);
      }
    }
#pragma omp for schedule(static)
    for (int64_t job = 0; job < rows * heads; job++)
      inv[job] = 1.0f / exp_scores(scores + job * room, v->count[job / heads]);
#pragma omp for schedule(static)
    for (int64_t job = 0; job < rows * kv_heads * blocks; job++) {
      const int64_t t = job / (kv_heads * blocks), g = job / blocks % kv_heads;
      for (int64_t h = g * group; h < (g + 1) * group; h += SHARE) {
        const int H = (int)((g + 1) * group - h < SHARE ? (g + 1) * group - h : SHARE);
        values_of(H, scores + (t * heads + h) * room, room, vc + g * dim, v->slots + t * room,
                  v->count[t], stride, job % blocks * 32, out + t * heads * dim + h * dim, dim);
      }
    }
#pragma omp for schedule(static)
    for (int64_t job = 0; job < rows * heads; job++)
      for (int64_t i = 0; i < dim; i++) out[job * dim + i] *= inv[job];
  }
  free(inv);
  free(scores);
}

/* out [rows, heads * dim] = softmax(q k^T * scale) v for every row and head over its visible
 * keys in the paged cache kc / vc [slots, kv_heads, dim] (grouped-query: head h reads kv head
 * h / (heads / kv_heads)), queries read from qkv [rows, (heads + 2 kv_heads) * dim]; a row's
 * result depends only on its own keys. */
FAST static void attend(const float *qkv, const float *kc, const float *vc, const Visible *v,
                        float *out, int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim,
                        float scale, int threads) {
  const int64_t width = (heads + 2 * kv_heads) * dim, group = heads / kv_heads;
  const int64_t stride = kv_heads * dim;
  /* A decode step goes in three passes of small jobs (attend_split: on SmolLM2 with 400-1024
   * cached tokens 2-4% faster than the jobs below, whose 3 kv groups share 2 threads
   * unevenly; steps of 2-4 rows were 2-5% slower so). Else a job per (chunk of consecutive
   * rows, kv group) loads each cached key and value once for the group's heads and, tile by
   * tile, for the chunk's rows (a verify step's or a prefill's rows share their context);
   * with fewer such jobs than threads, a job per (row, head) keeps threads busy. All give the
   * same bits (attend_rows), so the choice does not make rows differ. */
  if (dim % 32 == 0 && rows <= SPLIT_ROWS && threads > 1) {
    attend_split(qkv, kc, vc, v, out, rows, heads, kv_heads, dim, scale, threads);
    return;
  }
  const int64_t wanted = (2 * threads + kv_heads - 1) / kv_heads;
  int64_t chunks = (rows + MAX_CHUNK - 1) / MAX_CHUNK;
  chunks = wanted > chunks ? wanted : chunks;
  chunks = chunks < rows ? chunks : rows;
  const int shared = dim % 32 == 0 && rows * kv_heads >= threads;
  const int64_t jobs = shared ? chunks * kv_heads : rows * heads;
#pragma omp parallel num_threads(threads) if (rows * heads >= 4)
  {
    float *scores = malloc(sizeof(float) * (size_t)(v->room * SHARE * (shared ? MAX_CHUNK : 1)));
#pragma omp for schedule(dynamic, 1) /* the last chunks of a prefill, which see most keys, first */
    for (int64_t job = 0; job < jobs; job++) {
      if (!shared) {
        const int64_t t = job / heads, h = job % heads, head = (h / group) * dim;
        attend_head(qkv + t * width + h * dim, kc + head, vc + head, v->slots + t * v->room,
                    v->count[t], stride, dim, scale, scores, out + t * heads * dim + h * dim);
        continue;
      }
      const int64_t chunk = chunks - 1 - job / kv_heads, g = job % kv_heads;
      const int64_t t0 = chunk * rows / chunks, t1 = (chunk + 1) * rows / chunks;
      for (int64_t h = g * group; h < (g + 1) * group; h += SHARE) {
        const int n = (int)((g + 1) * group - h < SHARE ? (g + 1) * group - h : SHARE);
        attend_rows(qkv + h * dim, width, t0, t1, n, kc + g * dim, vc + g * dim, v, stride, dim,
                    scale, scores, out + h * dim, heads * dim);
      }
    }
    free(scores);
  }
}

/* h [rows, 2 * inter] = (gate, up) -> out [rows, inter] = silu(gate) * up, with
 * silu(g) = g / (1 + e^-g). */
FAST static void silu_mul(const float *h, float *out, int64_t rows, int64_t inter,
                            int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows >= 8)
  for (int64_t t = 0; t < rows; t++) {
    const float *g = h + t * 2 * inter, *u = g + inter;
    float *o = out + t * inter;
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= inter; i += 8) {
      const __m256 gv = _mm256_loadu_ps(g + i);
      const __m256 e = exp8(_mm256_sub_ps(zero, gv));
      const __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(one, e));
      _mm256_storeu_ps(o + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
    }
    for (; i < inter; i++) o[i] = g[i] / (1.0f + exp1(-g[i])) * u[i];
  }
}

/* ------------------------------------------------------------------ the decoder stack */

/* y [rows, out] = x [rows, columns] W^T (+ b), the weight in any of the formats verispec.h's
 * WeightFormat names (Linear, there). */
static void linear(int isa, const Linear *l, const float *x, float *y, int64_t rows,
                   int threads) {
  verispec_linear(isa, l->format, x, l->w, l->scales, l->bias, y, rows, l->out, l->columns,
                  threads);
}

/* The residual stream x [rows, hidden] through every layer, then out = RMSNorm(x) *
 * final_norm. Layer i writes its new keys and values at slots[t] of kc[i] / vc[i] and, when
 * captured[i] is not NULL, copies x as it enters the layer there (EAGLE's features); row t
 * is rotated by its position positions[t] (inv_freq [dim / 2]: rope.py's). Per layer, as
 * llama.py's decoder_layer: x += delta, normed = norm(x); qkv; rotate and store keys and
 * values; attend; x += o(...), normed = norm(x); delta = down(silu(gate) * up). first_input,
 * when not NULL, is layer 0's normed input [rows, its qkv's in] as given (an EAGLE head's
 * normed token embedding and feature side by side; x then holds the feature). head, when not
 * NULL, is the LM head: logits [num_picks, head->out] = head(out rows picks[]), saving a
 * second call from Python (a third of a millisecond on SmolLM2: Python runs from memory
 * after the weights have streamed through the caches). */
void verispec_decoder_stack(int isa, const Layer *layers, int64_t num_layers, float *const *kc,
                            float *const *vc, float *x, const float *first_input,
                            const float *final_norm, float *out, float *const *captured,
                            const int64_t *positions, const float *inv_freq,
                            const int64_t *slots, const Keys *keys, int64_t rows,
                            int64_t hidden, int64_t heads, int64_t kv_heads, int64_t dim,
                            int64_t inter, float eps, int threads, const Linear *head,
                            const int64_t *picks, int64_t num_picks, float *logits) {
  const int64_t width = (heads + 2 * kv_heads) * dim;
  float *normed = malloc(sizeof(float) * (size_t)(rows * hidden));
  float *delta = malloc(sizeof(float) * (size_t)(rows * hidden));
  float *qkv = malloc(sizeof(float) * (size_t)(rows * width));
  float *attn = malloc(sizeof(float) * (size_t)(rows * heads * dim));
  float *gate_up = malloc(sizeof(float) * (size_t)(rows * 2 * inter));
  float *act = malloc(sizeof(float) * (size_t)(rows * inter));
  float *cos = malloc(sizeof(float) * (size_t)(rows * dim));
  float *sin = malloc(sizeof(float) * (size_t)(rows * dim));
  rotary_tables(positions, inv_freq, cos, sin, rows, dim);
  Visible *visible = malloc(sizeof(Visible) * (size_t)keys->num_masks);
  for (int64_t w = 0; w < keys->num_masks; w++)
    visible[w] = visible_keys(keys, keys->masks[w], rows, threads);
  for (int64_t i = 0; i < num_layers; i++) {
    const Layer *l = layers + i;
    const float *input = i == 0 && first_input ? first_input : normed;
    if (input == normed)
      add_rms_norm(x, i ? delta : NULL, l->input_norm, normed, rows, hidden, eps, threads);
    if (captured[i])
      for (int64_t k = 0; k < rows * hidden; k++) captured[i][k] = x[k];
    linear(isa, &l->qkv, input, qkv, rows, threads);
    rope_store(qkv, cos, sin, l->q_norm, l->k_norm, eps, slots, kc[i], vc[i], rows, heads,
               kv_heads, dim);
    attend(qkv, kc[i], vc[i], visible + l->window, attn, rows, heads, kv_heads, dim,
           1.0f / sqrtf((float)dim), threads);
    linear(isa, &l->o, attn, delta, rows, threads);
    add_rms_norm(x, delta, l->post_norm, normed, rows, hidden, eps, threads);
    linear(isa, &l->gate_up, normed, gate_up, rows, threads);
    silu_mul(gate_up, act, rows, inter, threads);
    linear(isa, &l->down, act, delta, rows, threads);
  }
  add_rms_norm(x, num_layers ? delta : NULL, final_norm, out, rows, hidden, eps, threads);
  if (head && num_picks > 0) { /* the LM head on rows picks[] of out (normed is free now) */
    for (int64_t i = 0; i < num_picks; i++)
      for (int64_t c = 0; c < hidden; c++) normed[i * hidden + c] = out[picks[i] * hidden + c];
    linear(isa, head, normed, logits, num_picks, threads);
  }
  for (int64_t w = 0; w < keys->num_masks; w++) free(visible[w].slots), free(visible[w].count);
  free(visible);
  free(sin);
  free(cos);
  free(act);
  free(gate_up);
  free(attn);
  free(qkv);
  free(delta);
  free(normed);
}

/* Greedy drafting in one call: `steps` forwards of one new token per sequence, each token the
 * previous forward's argmax over the first `limit` logits (its first largest value, a NaN
 * counting as largest, as numpy's argmax), mapped through ids when not NULL: a head over a
 * reduced vocabulary has row j score token ids[j] (ascending, so the first largest row is the
 * lowest such id, as an argmax over the whole vocabulary with the other ids at -inf finds it);
 * NULL: row j scores token j. first [seqs]: the tokens the first forward feeds;
 * sequence i's token of step s sits at position positions[i] + s and KV slot
 * slots[s * seqs + i]; keys (no masks; tables holding every slot's block) describe the first
 * step, and ctx, the array keys->ctx points at, grows by one a step with keys->max_ctx. out
 * [steps, seqs] receives the argmaxes. A step is verispec_decoder_stack and the head's product
 * on the rows it returns, as a forward from Python computes them, so the tokens are those of a
 * Python loop of forwards (native_layer.greedy_steps), without the Python between steps, which
 * costs about a third of a small draft model's step. */
void verispec_greedy_steps(int isa, const Layer *layers, int64_t num_layers, float *const *kc,
                           float *const *vc, const float *embed, const Linear *head,
                           int64_t limit, const int64_t *ids, const float *final_norm,
                           float *const *captured, const int64_t *first,
                           const int64_t *positions, const float *inv_freq,
                           const int64_t *slots, Keys *keys, int64_t *ctx, int64_t steps,
                           int64_t seqs, int64_t hidden, int64_t heads, int64_t kv_heads,
                           int64_t dim, int64_t inter, float eps, int threads, int64_t *out) {
  float *x = malloc(sizeof(float) * (size_t)(seqs * hidden));
  float *normed = malloc(sizeof(float) * (size_t)(seqs * hidden));
  float *logits = malloc(sizeof(float) * (size_t)(seqs * head->out));
  int64_t *pos = malloc(sizeof(int64_t) * (size_t)seqs);
  int64_t *rows = malloc(sizeof(int64_t) * (size_t)seqs);
  for (int64_t i = 0; i < seqs; i++) rows[i] = i;
  for (int64_t s = 0; s < steps; s++) {
    for (int64_t i = 0; i < seqs; i++) {
      const int64_t token = s ? out[(s - 1) * seqs + i] : first[i];
      for (int64_t c = 0; c < hidden; c++) x[i * hidden + c] = embed[token * hidden + c];
      pos[i] = positions[i] + s;
    }
    verispec_decoder_stack(isa, layers, num_layers, kc, vc, x, NULL, final_norm, normed,
                           captured, pos, inv_freq, slots + s * seqs, keys, seqs, hidden, heads,
                           kv_heads, dim, inter, eps, threads, head, rows, seqs, logits);
    for (int64_t i = 0; i < seqs; i++) {
      const float *row = logits + i * head->out;
      int64_t best = 0;
      for (int64_t j = 0; j < limit; j++) {
        if (isnan(row[j])) {
          best = j;
          break;
        }
        if (row[j] > row[best]) best = j;
      }
      out[s * seqs + i] = ids ? ids[best] : best;
      ctx[i] += 1;
    }
    keys->max_ctx += 1;
  }
  free(rows);
  free(pos);
  free(logits);
  free(normed);
  free(x);
}
