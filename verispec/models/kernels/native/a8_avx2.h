/* The 8-bit products ("a8": Q8_A8, Q4_A8, Q4_F32_A8, Q8_F32_A8, Q4_SUPER_A8 and Q6_SUPER_A8) on
 * 256-bit vectors, for CPUs without AVX-512 VNNI. linear.c includes this file once per integer dot
 * product, with defined
 *   A8_DOT     VERISPEC_DOT_MADDUBS (AVX2's vpmaddubsw, then vpmaddwd) or VERISPEC_DOT_AVX_VNNI
 *              (vpdpbusd in its VEX form)
 *   A8_TARGET  the instruction sets of that instance (a function attribute)
 *   A8(name)   the name of one of its functions,
 * and everything linear.c defines before its portable 8-bit loop (RoundedRows, the layouts'
 * sizes). It undefines the three at its end.
 *
 * Same integers, same floats: per output and chunk the integer sum is tile_a8_vnni's (sums of
 * integers are exact in any order), then the very operations of add_chunk (tile_q6_a8 for
 * Q6_SUPER_A8) lane by lane, so every row's bits are those of the AVX-512 VNNI path and of the
 * scalar loop. A 64-byte vector of codes holds 4 columns of a block's 16 weight rows (Q8_A8's
 * order): its first 32 bytes rows 0-7, the next rows 8-15, the two "halves" a tile goes through in
 * turn; lane j of a half holds row j's 4 columns, which meet 4 codes of x broadcast.
 *
 * vpmaddubsw multiplies unsigned bytes by signed ones and adds pairs into 16 bits, saturating,
 * so exact while a pair stays within 32767; vpmaddwd by ones then adds pairs into 32 bits. With
 * q_x in [-127, 127]: 4-bit codes (0..15) give pairs of at most 3810, so a chunk's 8 vectors add
 * in 16 bits (16 products, at most 30480) before one vpmaddwd; 6-bit codes (0..63) pairs of at
 * most 16002, so two vectors add in 16 bits; 8-bit codes u = q + 128 become w = u ^ 0x80 = q, and
 * |w| (at most 128) times sign(w) q_x (vpsignb; q_x is never -128) gives pairs of at most 32512,
 * one vpmaddwd each: the sum of q q_x, which is the VNNI path's sum of u q_x started at corr.
 * vpdpbusd (AVX-VNNI) adds 4 products of unsigned and signed bytes into 32 bits without
 * saturating: it takes the codes as stored, started where the AVX-512 VNNI tiles start. */

#define A8_NIB(format)                                                                   \
  ((format) == VERISPEC_Q4_A8 || (format) == VERISPEC_Q4_F32_A8 ||                          \
   (format) == VERISPEC_Q4_SUPER_A8)
#define A8_Q6(format) ((format) == VERISPEC_Q6_SUPER_A8)
/* bytes of a chunk's codes and of its scales as stored */
#define A8_CHUNK_BYTES(format)                                                           \
  (A8_Q6(format) ? Q6_CHUNK_BYTES : A8_NIB(format) ? R * QC / 2 : R * QC)
#define A8_LINE(format)                                                                  \
  ((format) == VERISPEC_Q4_SUPER_A8 ? SUPER_BYTES / SUPER_CHUNKS                         \
   : A8_Q6(format)                  ? Q6_SUPER_BYTES / SUPER_CHUNKS                      \
   : (format) == VERISPEC_Q4_F32_A8 || (format) == VERISPEC_Q8_F32_A8 ? 2 * R * 4 : 2 * R * 2)

/* Half h of chunk `chunk`'s codes as 8 vectors (w[k]: columns 4 k .. 4 k + 3 of rows 8 h ..
 * 8 h + 7): Q8_A8's bytes as stored; Q4_A8's, whose vector k < 4 holds vector k in its low
 * 4 bits and k + 4 in its high 4; Q6_SUPER_A8's u = q + 32 from its planes, as q6_vectors. */
A8_TARGET INLINE void A8(half_codes)(const uint8_t *chunk, const int h, __m256i *w,
                                    const WeightFormat format) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  if (A8_Q6(format)) {
    const __m256i high = _mm256_set1_epi8(0x30);
    const __m256i h0 = _mm256_loadu_si256((const __m256i *)(chunk + 4 * 64 + 32 * h));
    const __m256i h1 = _mm256_loadu_si256((const __m256i *)(chunk + 5 * 64 + 32 * h));
    _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) {
      const __m256i l = _mm256_loadu_si256((const __m256i *)(chunk + 64 * v + 32 * h));
      _Pragma("GCC unroll 2") for (int n = 0; n < 2; n++) {
        const int k = 2 * v + n, f = k % 4;
        const __m256i a = n ? _mm256_srli_epi16(l, 4) : l, hv = k < 4 ? h0 : h1;
        const __m256i two = f == 0   ? _mm256_slli_epi16(hv, 4)
                            : f == 1 ? _mm256_slli_epi16(hv, 2)
                            : f == 2 ? hv
                                     : _mm256_srli_epi16(hv, 2); /* field f at bits 4, 5 */
        w[k] = _mm256_or_si256(_mm256_and_si256(a, low), _mm256_and_si256(two, high));
      }
    }
  } else if (A8_NIB(format)) {
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
      const __m256i v = _mm256_loadu_si256((const __m256i *)(chunk + 64 * k + 32 * h));
      w[k] = _mm256_and_si256(v, low);
      w[k + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
  } else {
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
      w[k] = _mm256_loadu_si256((const __m256i *)(chunk + 64 * k + 32 * h));
  }
}

/* Half h of chunk c's scales as float32, lane j for row 8 h + j: d and m (Q8_A8, Q4_A8: float16;
 * Q4_F32_A8, Q8_F32_A8: float32; Q4_SUPER_A8: d16 sc and (-dmin) mn, super_dm's products), or
 * Q6_SUPER_A8's d of the chunk's first and last 16 columns (q6_d's products) in d and m. */
A8_TARGET INLINE void A8(half_scales)(const char *sb, int64_t c, const int h, __m256 *d,
                                     __m256 *m, const WeightFormat format) {
  if (format == VERISPEC_Q4_SUPER_A8 || A8_Q6(format)) {
    const int q6 = A8_Q6(format);
    const int64_t super_bytes = q6 ? Q6_SUPER_BYTES : SUPER_BYTES;
    const uint8_t *s = (const uint8_t *)sb + (c / SUPER_CHUNKS) * super_bytes;
    const uint8_t *sub = s + (q6 ? 2 : 4) * R + (c % SUPER_CHUNKS) * 2 * R + 8 * h;
    const __m256 d16 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 16 * h)));
    const __m256 second = q6 ? d16 : _mm256_cvtph_ps(_mm_loadu_si128(
                                        (const __m128i *)(s + 2 * R + 16 * h))); /* -dmin */
    const __m128i a = _mm_loadl_epi64((const __m128i *)sub);
    const __m128i b = _mm_loadl_epi64((const __m128i *)(sub + R));
    *d = _mm256_mul_ps(d16, _mm256_cvtepi32_ps(q6 ? _mm256_cvtepi8_epi32(a)
                                                   : _mm256_cvtepu8_epi32(a)));
    *m = _mm256_mul_ps(second, _mm256_cvtepi32_ps(q6 ? _mm256_cvtepi8_epi32(b)
                                                        : _mm256_cvtepu8_epi32(b)));
  } else if (format == VERISPEC_Q4_F32_A8 || format == VERISPEC_Q8_F32_A8) {
    *d = _mm256_loadu_ps((const float *)sb + c * 2 * R + 8 * h);
    *m = _mm256_loadu_ps((const float *)sb + c * 2 * R + R + 8 * h);
  } else {
    *d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const H16 *)sb + c * 2 * R + 8 * h)));
    *m = _mm256_cvtph_ps(
        _mm_loadu_si128((const __m128i *)((const H16 *)sb + c * 2 * R + R + 8 * h)));
  }
}

/* x's codes 4 k .. 4 k + 3 of a row (q: its chunk's 32) in every 32-bit lane, broadcast from
 * memory where it is used: written as a volatile asm so that the compiler neither merges the
 * two halves' broadcasts nor keeps them on the stack (which spilled 64 of them a chunk in
 * tiles of 8 rows and ran at a third of vpmaddubsw's rate). */
A8_TARGET INLINE __m256i A8(codes4)(const int8_t *q, const int k) {
  __m256i v;
  __asm__ volatile("vpbroadcastd %1, %0" : "=x"(v) : "m"(*(const int32_t *)(q + 4 * k)));
  return v;
}

#if A8_DOT == VERISPEC_DOT_AVX_VNNI
/* start plus the products of w[k] and x's codes for k0 <= k < k1 (4 a lane and vector). */
A8_TARGET INLINE __m256i A8(dot)(__m256i start, const __m256i *w, const int8_t *q, const int k0,
                                const int k1) {
  __m256i even = start, odd = _mm256_setzero_si256(); /* two chains in flight */
  _Pragma("GCC unroll 8") for (int k = k0; k < k1; k++) {
    if ((k - k0) % 2 == 0) even = _mm256_dpbusd_avx_epi32(even, w[k], A8(codes4)(q, k));
    else odd = _mm256_dpbusd_avx_epi32(odd, w[k], A8(codes4)(q, k));
  }
  return _mm256_add_epi32(even, odd);
}
#endif

/* A row's integer sum over half a chunk, lane j for weight row j of the half: the sum of its
 * codes (as tile_a8_vnni reads them) times the row's codes q_x, started at corr for 8-bit codes.
 * ops: the half's codes prepared once for all rows of a tile (maddubs and 8-bit codes: |w| in
 * ops[0 .. 7] and w = u ^ 0x80 in ops[8 .. 15]; else the codes themselves). */
A8_TARGET INLINE __m256i A8(row_sum)(const __m256i *ops, const int8_t *q, int32_t corr,
                                    const WeightFormat format) {
#if A8_DOT == VERISPEC_DOT_AVX_VNNI
  return A8(dot)(_mm256_set1_epi32(A8_NIB(format) ? 0 : corr), ops, q, 0, 8);
#else
  (void)corr; /* w = u - 128 sums to the corrected integer itself */
  const __m256i ones = _mm256_set1_epi16(1);
  if (A8_NIB(format)) { /* 16 products of 4-bit codes a 16-bit lane: at most 30480 */
    __m256i s = _mm256_maddubs_epi16(ops[0], A8(codes4)(q, 0));
    _Pragma("GCC unroll 7") for (int k = 1; k < 8; k++)
      s = _mm256_add_epi16(s, _mm256_maddubs_epi16(ops[k], A8(codes4)(q, k)));
    return _mm256_madd_epi16(s, ones);
  }
  __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
  _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
    const __m256i p = _mm256_madd_epi16(
        _mm256_maddubs_epi16(ops[k], _mm256_sign_epi8(A8(codes4)(q, k), ops[8 + k])), ones);
    if (k % 2 == 0) even = _mm256_add_epi32(even, p);
    else odd = _mm256_add_epi32(odd, p);
  }
  return _mm256_add_epi32(even, odd);
#endif
}

/* Q6_SUPER_A8's two sums of a row over half a chunk: columns 0-15 started at -32 times the sum of
 * the row's first 16 codes (half), columns 16-31 at -32 times the rest's (the planes hold
 * q + 32), as tile_q6_a8's. */
A8_TARGET INLINE void A8(q6_sums)(const __m256i *w, const int8_t *q, int32_t half, int32_t rest,
                                 __m256i *lo, __m256i *hi) {
#if A8_DOT == VERISPEC_DOT_AVX_VNNI
  *lo = A8(dot)(_mm256_set1_epi32(-32 * half), w, q, 0, 4);
  *hi = A8(dot)(_mm256_set1_epi32(-32 * rest), w, q, 4, 8);
#else
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i s[4]; /* two vectors a 16-bit lane: at most 2 x 16002 */
  _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++)
    s[p] = _mm256_madd_epi16(
        _mm256_add_epi16(_mm256_maddubs_epi16(w[2 * p], A8(codes4)(q, 2 * p)),
                         _mm256_maddubs_epi16(w[2 * p + 1], A8(codes4)(q, 2 * p + 1))),
        ones);
  *lo = _mm256_add_epi32(_mm256_add_epi32(_mm256_set1_epi32(-32 * half), s[0]), s[1]);
  *hi = _mm256_add_epi32(_mm256_add_epi32(_mm256_set1_epi32(-32 * rest), s[2]), s[3]);
#endif
}

/* Rows t0 .. t0 + TN - 1 of x (TN <= 8) against the 16 weight rows of the block at cb (scales
 * at sb, as stored): per chunk, each half's codes prepared once, then each row's integer sum and
 * add_chunk's two fmas (Q6_SUPER_A8: tile_q6_a8's). next, when not NULL, is the next block, whose
 * chunk c is asked for into L2 while chunk c computes. */
A8_TARGET INLINE void A8(tile)(const RoundedRows r, const uint8_t *cb, const char *sb,
                              const float *bias, float *y, int64_t K, int64_t ldy, int64_t n0,
                              int64_t rows, int64_t t0, const int TN, const uint8_t *next,
                              const char *next_scales, const WeightFormat format) {
  const int64_t C = K / QC, chunk_bytes = A8_CHUNK_BYTES(format), line = A8_LINE(format);
  const int bytes = !A8_NIB(format) && !A8_Q6(format) && A8_DOT == VERISPEC_DOT_MADDUBS;
  __m256 acc[8][2];
  _Pragma("GCC unroll 8") for (int i = 0; i < TN; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t c = 0; c < C; c++) {
    if (next) {
      _Pragma("GCC unroll 8") for (int l = 0; l < chunk_bytes; l += 64)
        _mm_prefetch((const char *)(next + c * chunk_bytes + l), _MM_HINT_T1);
      for (int64_t l = 0; l < line; l += 64) _mm_prefetch(next_scales + c * line + l, _MM_HINT_T1);
    }
    const int64_t tc = at(r, t0, c); /* the tile's rows of chunk c: tc, tc + 1, ... */
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
      __m256i ops[16];
      A8(half_codes)(cb + c * chunk_bytes, h, ops, format);
      if (bytes)
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
          ops[8 + k] = _mm256_xor_si256(ops[k], _mm256_set1_epi8((char)0x80));
          ops[k] = _mm256_abs_epi8(ops[8 + k]);
        }
      __m256 d, m;
      A8(half_scales)(sb, c, h, &d, &m, format);
      _Pragma("GCC unroll 8") for (int i = 0; i < TN; i++) {
        const int8_t *q = r.q + (tc + i) * QC;
        const __m256 dx = _mm256_set1_ps(r.dx[tc + i]);
        if (A8_Q6(format)) {
          const int32_t half = r.half[tc + i], rest = -r.corr[tc + i] / 128 - half;
          __m256i lo, hi;
          A8(q6_sums)(ops, q, half, rest, &lo, &hi);
          acc[i][h] = _mm256_fmadd_ps(_mm256_mul_ps(dx, d), _mm256_cvtepi32_ps(lo), acc[i][h]);
          acc[i][h] = _mm256_fmadd_ps(_mm256_mul_ps(dx, m), _mm256_cvtepi32_ps(hi), acc[i][h]);
        } else {
          const __m256i sum = A8(row_sum)(ops, q, r.corr[tc + i], format);
          acc[i][h] = _mm256_fmadd_ps(_mm256_mul_ps(dx, d), _mm256_cvtepi32_ps(sum), acc[i][h]);
          acc[i][h] = _mm256_fmadd_ps(m, _mm256_set1_ps(r.mx[tc + i]), acc[i][h]);
        }
      }
    }
  }
  _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(rows - 8 * h)), lane);
    const __m256 b = bias ? _mm256_maskload_ps(bias + n0 + 8 * h, live) : _mm256_setzero_ps();
    _Pragma("GCC unroll 8") for (int i = 0; i < TN; i++)
      _mm256_maskstore_ps(y + (t0 + i) * ldy + n0 + 8 * h, live,
                          bias ? _mm256_add_ps(acc[i][h], b) : acc[i][h]);
  }
}

#define A8_AVX2_TILE(TN) \
  A8(tile)(r, cb, sb, bias, y, K, ldy, n0, rows, t, TN, next, next_scales, format)

/* Block b of a product against all T rows: tiles of 8 rows (8 rows stream a block once), then
 * at most one of 4 and one of 1-3, as a8_block; the first asks for the next block
 * (schedule(static) gives a thread consecutive blocks) while it and the others compute. */
A8_TARGET INLINE void A8(block)(const RoundedRows r, const uint8_t *codes, const char *scales,
                               const float *bias, float *y, int64_t T, int64_t N, int64_t K,
                               int64_t ldy, int64_t b, const WeightFormat format) {
  const int64_t blocks = (N + R - 1) / R, C = K / QC;
  const int64_t block_bytes = C * A8_CHUNK_BYTES(format), scale_bytes = C * A8_LINE(format);
  const uint8_t *cb = codes + b * block_bytes;
  const char *sb = scales + b * scale_bytes;
  const uint8_t *next = b + 1 < blocks ? cb + block_bytes : NULL;
  const char *next_scales = sb + scale_bytes;
  const int64_t n0 = b * R, rows = N - n0 < R ? N - n0 : R;
  int64_t t = 0;
  ROW_TILES(A8_AVX2_TILE);
}

/* One OpenMP loop over the blocks per format, so that the format is a constant in the loop's body
 * (see Q8_ENTRY). */
#define A8_AVX2_ENTRY(FORMAT)                                                                \
  A8_TARGET static void A8(blocks_##FORMAT)(const RoundedRows r, const uint8_t *codes,       \
                                            const char *scales, const float *bias, float *y, \
                                            int64_t T, int64_t N, int64_t K, int64_t ldy,    \
                                            int threads) {                                   \
    const int64_t blocks = (N + R - 1) / R;                                                 \
    _Pragma("omp parallel for schedule(static) num_threads(threads)")                      \
    for (int64_t b = 0; b < blocks; b++)                                                    \
      A8(block)(r, codes, scales, bias, y, T, N, K, ldy, b, VERISPEC_##FORMAT);             \
  }

A8_AVX2_ENTRY(Q8_A8)
A8_AVX2_ENTRY(Q4_A8)
A8_AVX2_ENTRY(Q4_F32_A8)
A8_AVX2_ENTRY(Q8_F32_A8)
A8_AVX2_ENTRY(Q4_SUPER_A8)
A8_AVX2_ENTRY(Q6_SUPER_A8)

/* An a8 product of weight format `format` over rounded rows r. */
static void A8(linear)(const WeightFormat format, const RoundedRows r, const uint8_t *codes,
                       const char *scales, const float *bias, float *y, int64_t T, int64_t N,
                       int64_t K, int64_t ldy, int threads) {
  switch (format) {
#define A8_CASE(FORMAT)                                                                      \
  case VERISPEC_##FORMAT:                                                                    \
    A8(blocks_##FORMAT)(r, codes, scales, bias, y, T, N, K, ldy, threads);                   \
    break
    A8_CASE(Q8_A8);
    A8_CASE(Q4_A8);
    A8_CASE(Q4_F32_A8);
    A8_CASE(Q8_F32_A8);
    A8_CASE(Q4_SUPER_A8);
    default: A8_CASE(Q6_SUPER_A8);
#undef A8_CASE
  }
}

#undef A8_AVX2_ENTRY
#undef A8_AVX2_TILE
#undef A8_LINE
#undef A8_CHUNK_BYTES
#undef A8_Q6
#undef A8_NIB
#undef A8
#undef A8_TARGET
#undef A8_DOT
