/* GGUF blocks as affine codes, and affine codes into the kernel's packed layout: the two steps
 * of loading a quantized file (weights/gguf_blocks.py and kernels/packing.py's pack_codes hold the
 * same algorithms in numpy and torch, the reference these are tested against bit for bit).
 *
 * verispec_block_codes: n blocks of one GGML type, as the file stores them one after another,
 * -> codes q [n][values a block] int8 and d, m [n][groups a block] float32 with d q + m equal
 * to gguf's dequantization (see gguf_blocks.py for why each is exact). Groups: one per block
 * of 32 (Q4_0 .. Q8_0), 8 of 32 values (Q4_K, Q5_K), 16 of 16 (Q6_K).
 *
 * verispec_pack_codes: codes q [N][K] (K a multiple of 32) -> the kernel's codes layout, N
 * padded with zero rows to a multiple of 16: a byte each, out[b][c][j][l] = q[16 b + j][32 c +
 * l]; or, codes in 0..15, two a byte, out[b][c][v][l][r] = q[16 b + 4 v + r][32 c + l] |
 * q[16 b + 4 v + r][32 c + 16 + l] << 4 (Q4_F16_DM and Q4_F32_DM).
 *
 * verispec_q4_k_super: n Q4_K super-blocks -> the factors of their d and m as the file stores
 * them (Q4_SUPER_DM and Q4_SUPER_A8): d16 and -dmin (float16 bits) per super-block, the 6-bit
 * sc and mn of its 8 groups (d = d16 sc, m = -dmin mn: verispec_block_codes' d and m).
 *
 * verispec_q6_k_super: n Q6_K super-blocks -> the factors of their d as the file stores them
 * (Q6_SUPER_D): d16 (float16 bits) per super-block, the int8 sc of its 16 groups of 16
 * (d = d16 sc: verispec_block_codes' d; m = 0).
 *
 * verispec_pack_q6: Q6_K codes q [N][K] (K a multiple of 32, q in -32..31) -> Q6_SUPER_D's codes
 * layout, N padded with rows of zero bytes to a multiple of 16: per block b of 16 rows and
 * chunk c of 32 columns, 384 bytes, of u = q + 32 (0..63, the file's own 6-bit value) of the
 * chunk's 512 codes in Q8_F32_D_HALVES's order, p = 32 j + l for row 16 b + j, column 32 c + l:
 * bytes 64 v + i (v < 4, i < 64) hold u & 15 of p = 128 v + i (low nibble) and p = 128 v + 64 + i
 * (high nibble); bytes 256 + 64 w + i (w < 2) hold u >> 4 of p = 256 w + 64 f + i at bits
 * 2 f, 2 f + 1 (f < 4). So 64 bytes of Q8_F32_D_HALVES's codes are one vector of each plane,
 * shifted and masked (native_linear.q6_planes is the torch form).
 */
#include <stdint.h>
#include <string.h>

#include "verispec.h"

/* float16 bits -> float32, exactly (subnormals normalised, infinities and NaNs kept). */
static float half_to_float(const uint8_t *p) {
  const uint16_t h = (uint16_t)(p[0] | p[1] << 8);
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | mant << 13;
  } else if (exp) {
    bits = sign | (exp + 112) << 23 | mant << 13;
  } else if (!mant) {
    bits = sign;
  } else { /* subnormal: mant 2^-24, shifted until its leading bit is the implicit one */
    exp = 113;
    while (!(mant & 0x400)) mant <<= 1, exp--;
    bits = sign | exp << 23 | (mant & 0x3FF) << 13;
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* One legacy block of 32 values (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0). */
static void legacy_block(GGMLType type, const uint8_t *b, int8_t *q, float *d, float *m) {
  *d = half_to_float(b);
  *m = 0.0f;
  switch (type) {
    case VERISPEC_GGML_Q8_0:
      memcpy(q, b + 2, 32);
      return;
    case VERISPEC_GGML_Q4_0: /* d (q - 8) = d q + (-8 d) */
    case VERISPEC_GGML_Q4_1: {
      const uint8_t *qs = b + (type == VERISPEC_GGML_Q4_0 ? 2 : 4);
      for (int l = 0; l < 16; l++) q[l] = (int8_t)(qs[l] & 0x0F), q[l + 16] = (int8_t)(qs[l] >> 4);
      *m = type == VERISPEC_GGML_Q4_0 ? -8 * *d : half_to_float(b + 2);
      return;
    }
    default: { /* Q5_0: d (q - 16); Q5_1: d q + m; q = 4 low bits | the fifth bit << 4 */
      const int one = type == VERISPEC_GGML_Q5_1;
      const uint8_t *qh = b + (one ? 4 : 2), *qs = b + (one ? 8 : 6);
      const uint32_t high = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
                            (uint32_t)qh[3] << 24;
      const int shift = one ? 0 : 16;
      for (int l = 0; l < 16; l++) {
        q[l] = (int8_t)(((qs[l] & 0x0F) | ((high >> l) & 1) << 4) - shift);
        q[l + 16] = (int8_t)(((qs[l] >> 4) | ((high >> (l + 16)) & 1) << 4) - shift);
      }
      if (one) *m = half_to_float(b + 2);
    }
  }
}

/* Group j's 6-bit scale and min of a Q4_K / Q5_K super-block's 12 bytes s (ggml's
 * get_scale_min_k4: groups 0-3 in the low 6 bits of bytes 0-3 / 4-7, groups 4-7 from bytes
 * 8-11's nibbles and the top 2 bits of bytes 0-7). */
static void scale_min(const uint8_t *s, int j, int *sc, int *mn) {
  *sc = j < 4 ? s[j] & 0x3F : (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
  *mn = j < 4 ? s[j + 4] & 0x3F : (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
}

/* One super-block of 256 values (Q4_K, Q5_K: 8 groups of 32; Q6_K: 16 groups of 16). */
static void k_block(GGMLType type, const uint8_t *b, int8_t *q, float *d, float *m) {
  if (type == VERISPEC_GGML_Q6_K) { /* d sc_j (q - 32) */
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    const float d16 = half_to_float(b + 208);
    for (int j = 0; j < 16; j++) d[j] = d16 * (float)sc[j], m[j] = 0.0f;
    for (int h = 0; h < 2; h++)
      for (int p = 0; p < 4; p++)
        for (int l = 0; l < 32; l++) {
          const int low = (ql[64 * h + 32 * (p % 2) + l] >> (4 * (p / 2))) & 0x0F;
          const int high = (qh[32 * h + l] >> (2 * p)) & 0x03;
          q[128 * h + 32 * p + l] = (int8_t)((low | high << 4) - 32);
        }
    return;
  }
  /* Q4_K, Q5_K: d16 sc_j q - dmin mn_j, 6-bit sc and mn packed in 12 bytes */
  const float d16 = half_to_float(b), dmin = half_to_float(b + 2);
  const uint8_t *s = b + 4;
  for (int j = 0; j < 8; j++) {
    int sc, mn;
    scale_min(s, j, &sc, &mn);
    d[j] = d16 * (float)sc;
    m[j] = -(dmin * (float)mn);
  }
  const int five = type == VERISPEC_GGML_Q5_K;
  const uint8_t *qh = b + 16, *qs = b + (five ? 48 : 16);
  for (int i = 0; i < 4; i++) /* pairs of groups: low nibbles, then high */
    for (int nib = 0; nib < 2; nib++)
      for (int l = 0; l < 32; l++) {
        const int g = 2 * i + nib;
        int v = (qs[32 * i + l] >> (4 * nib)) & 0x0F;
        if (five) v |= ((qh[l] >> g) & 1) << 4;
        q[32 * g + l] = (int8_t)v;
      }
}

/* Bytes, values and (d, m) groups of one block of type; 0 bytes for a type not decoded here. */
static void block_shape(GGMLType type, int64_t *bytes, int *values, int *groups) {
  *values = 32, *groups = 1;
  switch (type) {
    case VERISPEC_GGML_Q4_0: *bytes = 18; return;
    case VERISPEC_GGML_Q4_1: *bytes = 20; return;
    case VERISPEC_GGML_Q5_0: *bytes = 22; return;
    case VERISPEC_GGML_Q5_1: *bytes = 24; return;
    case VERISPEC_GGML_Q8_0: *bytes = 34; return;
    case VERISPEC_GGML_Q4_K: *bytes = 144, *values = 256, *groups = 8; return;
    case VERISPEC_GGML_Q5_K: *bytes = 176, *values = 256, *groups = 8; return;
    case VERISPEC_GGML_Q6_K: *bytes = 210, *values = 256, *groups = 16; return;
    default: *bytes = 0;
  }
}

int verispec_block_codes(GGMLType type, const uint8_t *blocks, int64_t n, int8_t *q, float *d,
                         float *m, int threads) {
  int64_t bytes;
  int values, groups;
  block_shape(type, &bytes, &values, &groups);
  if (!bytes) return -1;
  const int k = values == 256;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; i++) {
    const uint8_t *b = blocks + i * bytes;
    if (k) k_block(type, b, q + i * values, d + i * groups, m + i * groups);
    else legacy_block(type, b, q + i * values, d + i, m + i);
  }
  return 0;
}

void verispec_pack_codes(const int8_t *q, int64_t N, int64_t K, int nibbles, int8_t *out,
                         int threads) {
  const int64_t blocks = (N + 15) / 16, C = K / 32, block_bytes = nibbles ? 16 * K / 2 : 16 * K;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t b = 0; b < blocks; b++) {
    int8_t *o = out + b * block_bytes;
    for (int64_t c = 0; c < C; c++)
      for (int j = 0; j < 16; j++) {
        const int64_t row = 16 * b + j;
        const int8_t *src = row < N ? q + row * K + 32 * c : NULL;
        if (!nibbles) { /* o[c][j][l] */
          int8_t *dst = o + (c * 16 + j) * 32;
          if (src) memcpy(dst, src, 32);
          else memset(dst, 0, 32);
          continue;
        }
        /* o[c][v][l][r] with j = 4 v + r */
        int8_t *dst = o + c * 256 + (j / 4) * 64 + j % 4;
        for (int l = 0; l < 16; l++)
          dst[4 * l] = src ? (int8_t)((src[l] & 0x0F) | (src[l + 16] & 0x0F) << 4) : 0;
      }
  }
}

void verispec_q4_k_super(const uint8_t *blocks, int64_t n, uint16_t *d16, uint16_t *negmin,
                         uint8_t *sc, uint8_t *mn, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; i++) {
    const uint8_t *b = blocks + i * 144, *s = b + 4;
    d16[i] = (uint16_t)(b[0] | b[1] << 8);
    negmin[i] = (uint16_t)((b[2] | b[3] << 8) ^ 0x8000); /* -dmin, exactly */
    for (int j = 0; j < 8; j++) {
      int scale, min;
      scale_min(s, j, &scale, &min);
      sc[8 * i + j] = (uint8_t)scale, mn[8 * i + j] = (uint8_t)min;
    }
  }
}

void verispec_q6_k_super(const uint8_t *blocks, int64_t n, uint16_t *d16, int8_t *sc,
                         int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; i++) {
    const uint8_t *b = blocks + i * 210;
    d16[i] = (uint16_t)(b[208] | b[209] << 8);
    memcpy(sc + 16 * i, b + 192, 16);
  }
}

void verispec_pack_q6(const int8_t *q, int64_t N, int64_t K, uint8_t *out, int threads) {
  const int64_t blocks = (N + 15) / 16, C = K / 32;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t b = 0; b < blocks; b++)
    for (int64_t c = 0; c < C; c++) {
      uint8_t *o = out + (b * C + c) * 384;
      memset(o, 0, 384);
      for (int j = 0; j < 16 && 16 * b + j < N; j++) {
        const int8_t *src = q + (16 * b + j) * K + 32 * c;
        for (int l = 0; l < 32; l++) {
          const int p = 32 * j + l, k = p / 64, i = p % 64;
          const uint8_t u = (uint8_t)(src[l] + 32);
          o[64 * (k / 2) + i] |= (uint8_t)((u & 15) << 4 * (k % 2));
          o[256 + 64 * (k / 4) + i] |= (uint8_t)(((u >> 4) & 3) << 2 * (k % 4));
        }
      }
    }
}
