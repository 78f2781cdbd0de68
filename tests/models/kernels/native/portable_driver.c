/* Runs products of the library as built for another machine (portable.c and blocks.c, which
 * stand in for linear.c there), for tests/models/kernels/test_portable.py under emulation: for
 * each pair of arguments IN OUT, one product read from IN, its y written to OUT.
 * IN: int64 format, T, N, K, threads, bias (0 or 1), bytes of w, bytes of scales (0: none);
 * then x [T][K] float32, w, scales, bias [N] float32 where present. OUT: y [T][N] float32.
 * Exit status 2 where the library is not that stand-in (ABI version, isa), 3 on bad files. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "verispec.h"

static void *read_bytes(FILE *f, int64_t n) {
  void *p = malloc(n > 0 ? (size_t)n : 1);
  if (!p || fread(p, 1, (size_t)n, f) != (size_t)n) exit(3);
  return p;
}

int main(int argc, char **argv) {
  if (verispec_abi_version() != VERISPEC_ABI_VERSION || verispec_linear_isa() != 0 ||
      verispec_linear_dot(1) != VERISPEC_DOT_SCALAR)
    return 2;
  for (int a = 1; a + 1 < argc; a += 2) {
    FILE *in = fopen(argv[a], "rb");
    if (!in) return 3;
    int64_t h[8];
    if (fread(h, sizeof h[0], 8, in) != 8) return 3;
    const int64_t T = h[1], N = h[2], K = h[3];
    float *x = read_bytes(in, 4 * T * K);
    void *w = read_bytes(in, h[6]);
    float *scales = h[7] ? read_bytes(in, h[7]) : NULL;
    float *bias = h[5] ? read_bytes(in, 4 * N) : NULL;
    fclose(in);
    float *y = malloc(sizeof(float) * (size_t)(T * N));
    verispec_linear(0, (WeightFormat)h[0], x, w, scales, bias, y, T, N, K, (int)h[4]);
    FILE *out = fopen(argv[a + 1], "wb");
    if (!out || fwrite(y, sizeof(float), (size_t)(T * N), out) != (size_t)(T * N)) return 3;
    fclose(out);
    free(x), free(w), free(scales), free(bias), free(y);
  }
  return 0;
}
