/* pillow-simd's SSE4 and AVX2 convolutions for feedfast's resize (feedfast/_resample_simd.c).
 *
 * The pillow-simd flavour's two passes over 8-bit images (16-bit coefficients, _resample.h), on the best
 * instruction set this CPU has: the same integer sums as the plain C passes of _resample.c, so the same
 * pixels, however many taps, rows or bytes a row holds. Plain C, no Python; may run without the GIL.
 */
#ifndef FEEDFAST_RESAMPLE_SIMD_H
#define FEEDFAST_RESAMPLE_SIMD_H

#include <stddef.h>
#include <stdint.h>

#include "_resample.h"

/* Which convolutions run: a CPU (or a build) without SSE4.1 has the plain C ones of _resample.c only. */
enum { FF_ISA_C = 0, FF_ISA_SSE4 = 1, FF_ISA_AVX2 = 2 };

/* The instruction set the passes use: the best this CPU has, at most the cap (ff_isa_cap). */
int ff_isa(void);

/* Caps the instruction set at `level` (for tests and benchmarks: every level gives the same pixels) and
 * returns the cap before; a level above what the CPU has changes nothing. */
int ff_isa_cap(int level);

/* The horizontal pass of 4-byte pixels (ImagingResampleHorizontal_8bpc): out_h rows of out_w pixels into
 * `out`, from the rows of `in` from `offset` on; `bounds` and `kk` (ksize coefficients an output pixel, at
 * `precision` bits) as _resample.c computes them. `isa` is FF_ISA_SSE4 or FF_ISA_AVX2. */
void ff_horizontal_4byte(int isa, const FFImage *in, int offset, unsigned char *out, ptrdiff_t out_stride, int out_w,
                         int out_h, const int *bounds, const int16_t *kk, int ksize, int precision);

/* The horizontal pass of 1-byte pixels, with the same arguments. */
void ff_horizontal_1byte(int isa, const FFImage *in, int offset, unsigned char *out, ptrdiff_t out_stride, int out_w,
                         int out_h, const int *bounds, const int16_t *kk, int ksize, int precision);

/* The vertical pass (ImagingResampleVertical_8bpc), for 1- and 4-byte pixels alike: out_h rows of `out`,
 * each the weighted sum of rows bounds[2y] .. bounds[2y] + bounds[2y + 1] - 1 of `in`, byte by byte. */
void ff_vertical(int isa, const FFImage *in, unsigned char *out, ptrdiff_t out_stride, int out_h, const int *bounds,
                 const int16_t *kk, int ksize, int precision);

/* Reduce.c's division_UINT32 (in _resample.c): the multiplier of a block of `divider` pixels. */
uint32_t ff_division_uint32(int divider, int result_bits);

/* One row of ImagingReduce's blocks of 4- or 1-byte pixels (`pixel`), `factor_x` pixels wide, `rows` high
 * (FF_REDUCE_ROWS at most), the last one narrower where n / pixel is not a multiple of factor_x: n bytes of
 * each row from `first` on, `stride` bytes apart, into `o`. Each block is (sum + amend) * multiplier >> 24
 * in 32 bits, Reduce.c's, amend doubled where `twice_amend`. `sums` holds n uint16 (column sums). */
enum { FF_REDUCE_ROWS = 257 }; /* 257 * 255 < 65536 */
void ff_reduce_row(int isa, const unsigned char *first, ptrdiff_t stride, int rows, int n, int pixel, int factor_x,
                   int twice_amend, void *sums, unsigned char *o);

/* Rows on their way out (feedfast/_native.c's emit), on the best instruction set within the cap, the same
 * values in plain C. ff_rgb_row: a row of `width` 4-byte pixels as 3-byte ones (the fourth byte dropped),
 * mirrored where `hflip`. ff_normalized_row: planes[c][x] = ((float)in[x' * pixel + c] - mean[c]) * inv[c]
 * for each of the `channels` channels (1 for 1-byte pixels, 3 for 4-byte ones), x' = width - 1 - x where
 * `hflip`, else x: float32 arithmetic as NumPy's, bit for bit (no fused multiply-add). */
void ff_rgb_row(const unsigned char *in, unsigned char *out, int width, int hflip);
void ff_normalized_row(const unsigned char *in, int pixel, int width, int hflip, const float *mean, const float *inv,
                       float *const *planes);

#endif
