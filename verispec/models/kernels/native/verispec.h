/* The boundary between verispec's Python code and its native library: every entry point and
 * struct of the C files (linear.c, portable.c, blocks.c, layer.c: each includes this header),
 * the weight formats a packed weight holds and the ABI version checked at load. ffi.py mirrors
 * it (WeightFormat name for name, the structs field for field, the entry points' argument
 * types); tests/models/kernels/test_ffi.py compiles a probe of it and checks the two agree. */
#ifndef VERISPEC_H
#define VERISPEC_H

#include <stdint.h>

/* Bumped whenever a format's layout, an entry point or a struct changes: a library built from
 * other sources is rebuilt, never misread. */
#define VERISPEC_ABI_VERSION 8

/* What a packed weight holds, its format (packing.py's packers lay each one out); ffi.WeightFormat
 * on the Python side, which passes it as an int (ffi.CWeightFormat: the enum is an int here).
 * Comments and docs name a format by its name here less VERISPEC_ (Q4_A8), never by number. */
typedef enum verispec_weight_format {
  VERISPEC_F32 = 0,               /* float32 values */
  VERISPEC_F16 = 1,               /* float16 values */
  VERISPEC_Q8_F32_DM = 2,         /* 8-bit codes, float32 d and m per 32 columns (Q5_1, Q5_K) */
  VERISPEC_Q8_A8 = 3,             /* 8-bit codes times 8-bit inputs, float16 d and m (a8) */
  VERISPEC_Q4_F16_DM = 4,         /* 4-bit codes, float16 d and m (Q4_0, Q4_1) */
  VERISPEC_Q8_F16_D = 5,          /* 8-bit codes, float16 d, m = 0 (Q8_0, Q5_0) */
  VERISPEC_Q4_A8 = 6,             /* 4-bit codes times 8-bit inputs, float16 d and m (a8) */
  VERISPEC_Q4_F32_DM = 7,         /* 4-bit codes, float32 d and m per 32 columns (Q4_K) */
  VERISPEC_Q8_F32_DM_HALVES = 8,  /* 8-bit codes, float32 d and m per 16 columns (Q6_K mixed) */
  VERISPEC_Q8_F32_D_HALVES = 9,   /* 8-bit codes, float32 d per 16 columns, m = 0 (Q6_K) */
  VERISPEC_Q4_F32_A8 = 10,        /* 4-bit codes times 8-bit inputs, float32 d and m (Q4_K, a8) */
  VERISPEC_Q8_F32_A8 = 11,        /* 8-bit codes times 8-bit inputs, float32 d and m (Q5_K, a8) */
  VERISPEC_Q4_SUPER_DM = 12,      /* 4-bit codes, Q4_K's d and m as stored: float16 x 6-bit */
  VERISPEC_Q4_SUPER_A8 = 13,      /* the same times 8-bit inputs (Q4_K, a8) */
  VERISPEC_Q6_SUPER_D = 14,       /* 6-bit codes (4 + 2 bit planes), Q6_K's d as stored */
  VERISPEC_Q6_SUPER_A8 = 15,      /* the same (in Q8_A8's order) times 8-bit inputs (Q6_K, a8) */
} WeightFormat;

/* The GGML types blocks.c decodes, by llama.cpp's enum ggml_type values (gguf-py's
 * GGMLQuantizationType names them on the Python side). */
typedef enum verispec_ggml_type {
  VERISPEC_GGML_Q4_0 = 2,
  VERISPEC_GGML_Q4_1 = 3,
  VERISPEC_GGML_Q5_0 = 6,
  VERISPEC_GGML_Q5_1 = 7,
  VERISPEC_GGML_Q8_0 = 8,
  VERISPEC_GGML_Q4_K = 12,
  VERISPEC_GGML_Q5_K = 13,
  VERISPEC_GGML_Q6_K = 14,
} GGMLType;

/* A product's isa argument: in bits 0-1 the instruction sets it may use (0 = portable C,
 * 1 = AVX2 + F16C + FMA, 2 = AVX-512 F and BW), in bits 2-3 the integer dot product of its
 * 8-bit products (a8 formats), one of these; a wider one than verispec_linear_dot reports for
 * that instruction set is narrowed to it. */
#define VERISPEC_DOT_SCALAR 0   /* portable.c's loop (isa 0; the tests' reference) */
#define VERISPEC_DOT_MADDUBS 1  /* AVX2: vpmaddubsw, then vpmaddwd */
#define VERISPEC_DOT_AVX_VNNI 2 /* AVX-VNNI: vpdpbusd on 256 bits */
#define VERISPEC_DOT_VNNI 3     /* AVX-512 VNNI: vpdpbusd on 512 bits */

/* ---------------------------------------------------------- linear.c (portable.c elsewhere) */

int verispec_abi_version(void);
/* The widest instruction sets of this CPU (a product's isa bits 0-1). */
int verispec_linear_isa(void);
int verispec_linear_dot(int isa);
/* y [T, N] = x [T, K] W^T (+ bias) for W [N, K] packed in format (scales: its scales, or
 * NULL); T rows of x, each computed alone (row invariance). */
void verispec_linear(int isa, WeightFormat format, const float *x, const void *w,
                     const float *scales, const float *bias, float *y, int64_t T, int64_t N,
                     int64_t K, int threads);
/* portable.c: the same products in plain C for every format (verispec_linear's isa 0). */
void verispec_linear_portable(WeightFormat format, const float *x, const void *w,
                              const float *scales, const float *bias, float *y, int64_t T,
                              int64_t N, int64_t K, int threads);

/* ------------------------------------------------------------------------------- blocks.c */

/* n GGUF blocks of a GGMLType -> affine codes (0, or -1 for another type); codes [N, K] ->
 * the kernel's codes layout, a byte each or (nibbles) two a byte. */
int verispec_block_codes(GGMLType type, const uint8_t *blocks, int64_t n, int8_t *q, float *d,
                         float *m, int threads);
void verispec_pack_codes(const int8_t *q, int64_t N, int64_t K, int nibbles, int8_t *out,
                         int threads);
void verispec_q4_k_super(const uint8_t *blocks, int64_t n, uint16_t *d16, uint16_t *negmin,
                         uint8_t *sc, uint8_t *mn, int threads);
void verispec_q6_k_super(const uint8_t *blocks, int64_t n, uint16_t *d16, int8_t *sc,
                         int threads);
void verispec_pack_q6(const int8_t *q, int64_t N, int64_t K, uint8_t *out, int threads);

/* -------------------------------------------- layer.c (x86-64 only; native_layer.py's calls) */

/* One product's weight as packed for verispec_linear (ffi.CLinear): its format, codes or
 * values w, scales (NULL for float formats), bias or NULL; out = N, columns = K (its
 * in_features padded: a multiple of 16, or 32 for codes). */
typedef struct {
  WeightFormat format;
  const void *w;
  const float *scales, *bias;
  int64_t out, columns;
} Linear;

/* One decoder layer's weights (ffi.CLayer); window: which of Keys.masks its attention uses. */
typedef struct {
  const float *input_norm, *post_norm, *q_norm, *k_norm; /* q_norm, k_norm: NULL but Qwen3 */
  Linear qkv, o, gate_up, down;
  int64_t window;
} Layer;

/* Which cached keys each new row of one forward sees, the same for every layer (ffi.CKeys,
 * from native_layer.KeyPlan). Sequence s owns rows cu[s] .. cu[s + 1] - 1 and has ctx[s] keys,
 * its new tokens' last; key j lives at slot tables[s * max_blocks + j / block_size] *
 * block_size + j % block_size (kv_start + j when tables is NULL: one sequence in consecutive
 * slots). Row i of sequence s sees key j when mask[(s * max_q + i) * max_ctx + j] is set,
 * mask = masks[w] for a layer of window w; with no mask (NULL), when j is at most the row's
 * own key (causal in cache order). */
typedef struct {
  const int64_t *tables;
  int64_t block_size, max_blocks, kv_start;
  const int64_t *cu, *ctx;
  int64_t num_seqs;
  const uint8_t *const *masks;
  int64_t num_masks, max_q, max_ctx;
} Keys;

/* A forward of every layer in one call, and `steps` greedy forwards of one token per sequence
 * in one call (layer.c says what each argument holds). */
void verispec_decoder_stack(int isa, const Layer *layers, int64_t num_layers, float *const *kc,
                            float *const *vc, float *x, const float *first_input,
                            const float *final_norm, float *out, float *const *captured,
                            const int64_t *positions, const float *inv_freq,
                            const int64_t *slots, const Keys *keys, int64_t rows,
                            int64_t hidden, int64_t heads, int64_t kv_heads, int64_t dim,
                            int64_t inter, float eps, int threads, const Linear *head,
                            const int64_t *picks, int64_t num_picks, float *logits);
void verispec_greedy_steps(int isa, const Layer *layers, int64_t num_layers, float *const *kc,
                           float *const *vc, const float *embed, const Linear *head,
                           int64_t limit, const int64_t *ids, const float *final_norm,
                           float *const *captured, const int64_t *first,
                           const int64_t *positions, const float *inv_freq,
                           const int64_t *slots, Keys *keys, int64_t *ctx, int64_t steps,
                           int64_t seqs, int64_t hidden, int64_t heads, int64_t kv_heads,
                           int64_t dim, int64_t inter, float eps, int threads, int64_t *out);

#endif
