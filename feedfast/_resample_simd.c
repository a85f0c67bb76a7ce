/* pillow-simd's SSE4 and AVX2 convolutions (see _resample_simd.h), ported for feedfast's resize.
 *
 * Ported from pillow-simd (uploadcare/pillow-simd, src/libImaging/ResampleSIMDHorizontalConv.c and
 * ResampleSIMDVerticalConv.c, by Alexander Karpinsky), under the PIL Software License:
 *
 *     The Python Imaging Library (PIL) is
 *         Copyright (c) 1997-2011 by Secret Labs AB
 *         Copyright (c) 1995-2011 by Fredrik Lundh
 *     Pillow is the friendly PIL fork. It is
 *         Copyright (c) 2010-2020 by Alex Clark and contributors
 *
 *     By obtaining, using, and/or copying this software and/or its associated documentation, you agree that
 *     you have read, understood, and will comply with the following terms and conditions:
 *
 *     Permission to use, copy, modify, and distribute this software and its associated documentation for any
 *     purpose and without fee is hereby granted, provided that the above copyright notice appears in all
 *     copies, and that both that copyright notice and this permission notice appear in supporting
 *     documentation, and that the name of Secret Labs AB or the author not be used in advertising or
 *     publicity pertaining to distribution of the software without specific, written prior permission.
 *
 *     SECRET LABS AB AND THE AUTHOR DISCLAIMS ALL WARRANTIES WITH REGARD TO THIS SOFTWARE, INCLUDING ALL
 *     IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS. IN NO EVENT SHALL SECRET LABS AB OR THE AUTHOR BE
 *     LIABLE FOR ANY SPECIAL, INDIRECT OR CONSEQUENTIAL DAMAGES OR ANY DAMAGES WHATSOEVER RESULTING FROM LOSS
 *     OF USE, DATA OR PROFITS, WHETHER IN AN ACTION OF CONTRACT, NEGLIGENCE OR OTHER TORTIOUS ACTION, ARISING
 *     OUT OF OR IN CONNECTION WITH THE USE OR PERFORMANCE OF THIS SOFTWARE.
 *
 * What changed in the port: pillow-simd picks its instruction set when it is built (-mavx2 or not); here
 * each pass is compiled for AVX2 and for SSE4.1 (function target attributes) and ff_isa picks at run time.
 * Rows are byte pointers and strides rather than Imaging's row tables, and unaligned loads of coefficient
 * pairs go through memcpy. The vertical pass walks bytes, not pixels, so 1-byte images take it too
 * (pillow-simd runs them through scalar loops): 32 bytes at a time, then 8, then 4, then one by one. The
 * horizontal pass of 1-byte pixels is feedfast's own (4 rows at once, the 4 taps of a row in 1 madd pair).
 *
 * Why the pixels are the scalar loops': every product is an 8-bit pixel times an int16 coefficient, and
 * _mm_madd_epi16 adds two of them into 32 bits exactly; the sums are the same integers in another order,
 * then shifted and saturated to 0..255 as clip8 clips them (a sum's shift is within int16 or saturates
 * to the same byte). Loads never reach past the taps' pixels or a row's last byte.
 */
#include "_resample_simd.h"

#include <string.h>

#if defined(__GNUC__) && defined(__x86_64__)
#define FF_HAVE_X86 1
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2")))
#define SSE4 __attribute__((target("sse4.1")))
#endif

static int isa_cap = FF_ISA_AVX2;

int
ff_isa_cap(int level)
{
    int before = isa_cap;
    isa_cap = level < FF_ISA_C ? FF_ISA_C : level > FF_ISA_AVX2 ? FF_ISA_AVX2 : level;
    return before;
}

int
ff_isa(void)
{
#ifdef FF_HAVE_X86
    int level = __builtin_cpu_supports("avx2") ? FF_ISA_AVX2 : __builtin_cpu_supports("sse4.1") ? FF_ISA_SSE4
                                                                                                 : FF_ISA_C;
    return level < isa_cap ? level : isa_cap;
#else
    return FF_ISA_C;
#endif
}

#ifdef FF_HAVE_X86

static inline int32_t
load32(const void *p) /* two int16 coefficients, or four bytes, at any alignment */
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

SSE4 static inline __m128i
mm_cvtepu8_epi32(const void *p) /* ImagingUtils.h's: one 4-byte pixel's channels as int32 */
{
    return _mm_cvtepu8_epi32(_mm_cvtsi32_si128(load32(p)));
}

/* ---- ResampleSIMDHorizontalConv.c: ImagingResampleHorizontalConvolution8u4x ---- */

#define PIX_LO -1, 7, -1, 3, -1, 6, -1, 2, -1, 5, -1, 1, -1, 4, -1, 0
#define PIX_HI -1, 15, -1, 11, -1, 14, -1, 10, -1, 13, -1, 9, -1, 12, -1, 8

AVX2 static void
horizontal_4x_avx2(uint32_t *out0, uint32_t *out1, uint32_t *out2, uint32_t *out3, const uint32_t *in0,
                   const uint32_t *in1, const uint32_t *in2, const uint32_t *in3, int xsize, const int *xbounds,
                   const int16_t *kk, int kmax, int coefs_precision)
{
    const __m256i lo = _mm256_set_epi8(PIX_LO, PIX_LO), hi = _mm256_set_epi8(PIX_HI, PIX_HI);
    const __m256i zero = _mm256_setzero_si256();
    const __m256i initial = _mm256_set1_epi32(1 << (coefs_precision - 1));
    for (int xx = 0; xx < xsize; xx++) {
        const int xmin = xbounds[xx * 2 + 0], xmax = xbounds[xx * 2 + 1];
        const int16_t *k = &kk[xx * kmax];
        __m256i sss0 = initial, sss1 = initial;
        int x = 0;
        for (; x < xmax - 3; x += 4) {
            __m256i pix, source;
            const __m256i mmk0 = _mm256_set1_epi32(load32(&k[x])), mmk1 = _mm256_set1_epi32(load32(&k[x + 2]));
            source = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)&in0[x + xmin])),
                                             _mm_loadu_si128((const __m128i *)&in1[x + xmin]), 1);
            pix = _mm256_shuffle_epi8(source, lo);
            sss0 = _mm256_add_epi32(sss0, _mm256_madd_epi16(pix, mmk0));
            pix = _mm256_shuffle_epi8(source, hi);
            sss0 = _mm256_add_epi32(sss0, _mm256_madd_epi16(pix, mmk1));
            source = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)&in2[x + xmin])),
                                             _mm_loadu_si128((const __m128i *)&in3[x + xmin]), 1);
            pix = _mm256_shuffle_epi8(source, lo);
            sss1 = _mm256_add_epi32(sss1, _mm256_madd_epi16(pix, mmk0));
            pix = _mm256_shuffle_epi8(source, hi);
            sss1 = _mm256_add_epi32(sss1, _mm256_madd_epi16(pix, mmk1));
        }
        for (; x < xmax - 1; x += 2) {
            __m256i pix;
            const __m256i mmk = _mm256_set1_epi32(load32(&k[x]));
            pix = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)&in0[x + xmin])),
                                          _mm_loadl_epi64((const __m128i *)&in1[x + xmin]), 1);
            pix = _mm256_shuffle_epi8(pix, lo);
            sss0 = _mm256_add_epi32(sss0, _mm256_madd_epi16(pix, mmk));
            pix = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)&in2[x + xmin])),
                                          _mm_loadl_epi64((const __m128i *)&in3[x + xmin]), 1);
            pix = _mm256_shuffle_epi8(pix, lo);
            sss1 = _mm256_add_epi32(sss1, _mm256_madd_epi16(pix, mmk));
        }
        for (; x < xmax; x++) {
            __m256i pix;
            const __m256i mmk = _mm256_set1_epi32(k[x]);
            pix = _mm256_inserti128_si256(_mm256_castsi128_si256(mm_cvtepu8_epi32(&in0[x + xmin])),
                                          mm_cvtepu8_epi32(&in1[x + xmin]), 1);
            sss0 = _mm256_add_epi32(sss0, _mm256_madd_epi16(pix, mmk));
            pix = _mm256_inserti128_si256(_mm256_castsi128_si256(mm_cvtepu8_epi32(&in2[x + xmin])),
                                          mm_cvtepu8_epi32(&in3[x + xmin]), 1);
            sss1 = _mm256_add_epi32(sss1, _mm256_madd_epi16(pix, mmk));
        }
        sss0 = _mm256_srai_epi32(sss0, coefs_precision);
        sss1 = _mm256_srai_epi32(sss1, coefs_precision);
        sss0 = _mm256_packs_epi32(sss0, zero);
        sss1 = _mm256_packs_epi32(sss1, zero);
        sss0 = _mm256_packus_epi16(sss0, zero);
        sss1 = _mm256_packus_epi16(sss1, zero);
        out0[xx] = (uint32_t)_mm_cvtsi128_si32(_mm256_extracti128_si256(sss0, 0));
        out1[xx] = (uint32_t)_mm_cvtsi128_si32(_mm256_extracti128_si256(sss0, 1));
        out2[xx] = (uint32_t)_mm_cvtsi128_si32(_mm256_extracti128_si256(sss1, 0));
        out3[xx] = (uint32_t)_mm_cvtsi128_si32(_mm256_extracti128_si256(sss1, 1));
    }
}

SSE4 static void
horizontal_4x_sse4(uint32_t *out0, uint32_t *out1, uint32_t *out2, uint32_t *out3, const uint32_t *in0,
                   const uint32_t *in1, const uint32_t *in2, const uint32_t *in3, int xsize, const int *xbounds,
                   const int16_t *kk, int kmax, int coefs_precision)
{
    const __m128i mask_lo = _mm_set_epi8(PIX_LO), mask_hi = _mm_set_epi8(PIX_HI);
    const __m128i initial = _mm_set1_epi32(1 << (coefs_precision - 1));
    for (int xx = 0; xx < xsize; xx++) {
        const int xmin = xbounds[xx * 2 + 0], xmax = xbounds[xx * 2 + 1];
        const int16_t *k = &kk[xx * kmax];
        __m128i sss0 = initial, sss1 = initial, sss2 = initial, sss3 = initial;
        int x = 0;
        for (; x < xmax - 3; x += 4) {
            __m128i pix, source;
            const __m128i mmk_lo = _mm_set1_epi32(load32(&k[x])), mmk_hi = _mm_set1_epi32(load32(&k[x + 2]));
            source = _mm_loadu_si128((const __m128i *)&in0[x + xmin]);
            pix = _mm_shuffle_epi8(source, mask_lo);
            sss0 = _mm_add_epi32(sss0, _mm_madd_epi16(pix, mmk_lo));
            pix = _mm_shuffle_epi8(source, mask_hi);
            sss0 = _mm_add_epi32(sss0, _mm_madd_epi16(pix, mmk_hi));
            source = _mm_loadu_si128((const __m128i *)&in1[x + xmin]);
            pix = _mm_shuffle_epi8(source, mask_lo);
            sss1 = _mm_add_epi32(sss1, _mm_madd_epi16(pix, mmk_lo));
            pix = _mm_shuffle_epi8(source, mask_hi);
            sss1 = _mm_add_epi32(sss1, _mm_madd_epi16(pix, mmk_hi));
            source = _mm_loadu_si128((const __m128i *)&in2[x + xmin]);
            pix = _mm_shuffle_epi8(source, mask_lo);
            sss2 = _mm_add_epi32(sss2, _mm_madd_epi16(pix, mmk_lo));
            pix = _mm_shuffle_epi8(source, mask_hi);
            sss2 = _mm_add_epi32(sss2, _mm_madd_epi16(pix, mmk_hi));
            source = _mm_loadu_si128((const __m128i *)&in3[x + xmin]);
            pix = _mm_shuffle_epi8(source, mask_lo);
            sss3 = _mm_add_epi32(sss3, _mm_madd_epi16(pix, mmk_lo));
            pix = _mm_shuffle_epi8(source, mask_hi);
            sss3 = _mm_add_epi32(sss3, _mm_madd_epi16(pix, mmk_hi));
        }
        for (; x < xmax - 1; x += 2) {
            const __m128i mmk = _mm_set1_epi32(load32(&k[x]));
            __m128i pix = _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)&in0[x + xmin]), mask_lo);
            sss0 = _mm_add_epi32(sss0, _mm_madd_epi16(pix, mmk));
            pix = _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)&in1[x + xmin]), mask_lo);
            sss1 = _mm_add_epi32(sss1, _mm_madd_epi16(pix, mmk));
            pix = _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)&in2[x + xmin]), mask_lo);
            sss2 = _mm_add_epi32(sss2, _mm_madd_epi16(pix, mmk));
            pix = _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)&in3[x + xmin]), mask_lo);
            sss3 = _mm_add_epi32(sss3, _mm_madd_epi16(pix, mmk));
        }
        for (; x < xmax; x++) {
            const __m128i mmk = _mm_set1_epi32(k[x]);
            sss0 = _mm_add_epi32(sss0, _mm_madd_epi16(mm_cvtepu8_epi32(&in0[x + xmin]), mmk));
            sss1 = _mm_add_epi32(sss1, _mm_madd_epi16(mm_cvtepu8_epi32(&in1[x + xmin]), mmk));
            sss2 = _mm_add_epi32(sss2, _mm_madd_epi16(mm_cvtepu8_epi32(&in2[x + xmin]), mmk));
            sss3 = _mm_add_epi32(sss3, _mm_madd_epi16(mm_cvtepu8_epi32(&in3[x + xmin]), mmk));
        }
        sss0 = _mm_packs_epi32(_mm_srai_epi32(sss0, coefs_precision), _mm_setzero_si128());
        sss1 = _mm_packs_epi32(_mm_srai_epi32(sss1, coefs_precision), _mm_setzero_si128());
        sss2 = _mm_packs_epi32(_mm_srai_epi32(sss2, coefs_precision), _mm_setzero_si128());
        sss3 = _mm_packs_epi32(_mm_srai_epi32(sss3, coefs_precision), _mm_setzero_si128());
        out0[xx] = (uint32_t)_mm_cvtsi128_si32(_mm_packus_epi16(sss0, sss0));
        out1[xx] = (uint32_t)_mm_cvtsi128_si32(_mm_packus_epi16(sss1, sss1));
        out2[xx] = (uint32_t)_mm_cvtsi128_si32(_mm_packus_epi16(sss2, sss2));
        out3[xx] = (uint32_t)_mm_cvtsi128_si32(_mm_packus_epi16(sss3, sss3));
    }
}

/* ---- ResampleSIMDHorizontalConv.c: ImagingResampleHorizontalConvolution8u (one row) ---- */

/* The taps both instruction sets finish with: pairs, then the last one. */
SSE4 static inline __m128i
horizontal_1x_tail(__m128i sss, const uint32_t *in, int x, int xmin, int xmax, const int16_t *k)
{
    for (; x < xmax - 1; x += 2) {
        const __m128i mmk = _mm_set1_epi32(load32(&k[x]));
        const __m128i pix = _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)&in[x + xmin]), _mm_set_epi8(PIX_LO));
        sss = _mm_add_epi32(sss, _mm_madd_epi16(pix, mmk));
    }
    for (; x < xmax; x++)
        sss = _mm_add_epi32(sss, _mm_madd_epi16(mm_cvtepu8_epi32(&in[x + xmin]), _mm_set1_epi32(k[x])));
    return sss;
}

SSE4 static inline uint32_t
packed(__m128i sss, int coefs_precision)
{
    sss = _mm_srai_epi32(sss, coefs_precision);
    sss = _mm_packs_epi32(sss, sss);
    return (uint32_t)_mm_cvtsi128_si32(_mm_packus_epi16(sss, sss));
}

AVX2 static void
horizontal_1x_avx2(uint32_t *out, const uint32_t *in, int xsize, const int *xbounds, const int16_t *kk, int kmax,
                   int coefs_precision)
{
    for (int xx = 0; xx < xsize; xx++) {
        const int xmin = xbounds[xx * 2 + 0], xmax = xbounds[xx * 2 + 1];
        const int16_t *k = &kk[xx * kmax];
        __m128i sss;
        int x = 0;
        if (xmax < 8) {
            sss = _mm_set1_epi32(1 << (coefs_precision - 1));
        } else {
            /* Lower part will be added to higher, use only half of the error */
            __m256i sss256 = _mm256_set1_epi32(1 << (coefs_precision - 2));
            for (; x < xmax - 7; x += 8) {
                __m256i pix, mmk;
                const __m128i tmp = _mm_loadu_si128((const __m128i *)&k[x]);
                const __m256i ksource = _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), tmp, 1);
                const __m256i source = _mm256_loadu_si256((const __m256i *)&in[x + xmin]);
                pix = _mm256_shuffle_epi8(source, _mm256_set_epi8(PIX_LO, PIX_LO));
                mmk = _mm256_shuffle_epi8(ksource, _mm256_set_epi8(11, 10, 9, 8, 11, 10, 9, 8, 11, 10, 9, 8, 11, 10,
                                                                   9, 8, 3, 2, 1, 0, 3, 2, 1, 0, 3, 2, 1, 0, 3, 2, 1,
                                                                   0));
                sss256 = _mm256_add_epi32(sss256, _mm256_madd_epi16(pix, mmk));
                pix = _mm256_shuffle_epi8(source, _mm256_set_epi8(PIX_HI, PIX_HI));
                mmk = _mm256_shuffle_epi8(ksource, _mm256_set_epi8(15, 14, 13, 12, 15, 14, 13, 12, 15, 14, 13, 12, 15,
                                                                   14, 13, 12, 7, 6, 5, 4, 7, 6, 5, 4, 7, 6, 5, 4, 7,
                                                                   6, 5, 4));
                sss256 = _mm256_add_epi32(sss256, _mm256_madd_epi16(pix, mmk));
            }
            for (; x < xmax - 3; x += 4) {
                const __m128i ktmp = _mm_loadl_epi64((const __m128i *)&k[x]);
                const __m256i ksource = _mm256_insertf128_si256(_mm256_castsi128_si256(ktmp), ktmp, 1);
                const __m128i tmp = _mm_loadu_si128((const __m128i *)&in[x + xmin]);
                const __m256i source = _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), tmp, 1);
                const __m256i pix = _mm256_shuffle_epi8(source, _mm256_set_epi8(PIX_HI, PIX_LO));
                const __m256i mmk = _mm256_shuffle_epi8(ksource, _mm256_set_epi8(7, 6, 5, 4, 7, 6, 5, 4, 7, 6, 5, 4,
                                                                                 7, 6, 5, 4, 3, 2, 1, 0, 3, 2, 1, 0,
                                                                                 3, 2, 1, 0, 3, 2, 1, 0));
                sss256 = _mm256_add_epi32(sss256, _mm256_madd_epi16(pix, mmk));
            }
            sss = _mm_add_epi32(_mm256_extracti128_si256(sss256, 0), _mm256_extracti128_si256(sss256, 1));
        }
        out[xx] = packed(horizontal_1x_tail(sss, in, x, xmin, xmax, k), coefs_precision);
    }
}

SSE4 static void
horizontal_1x_sse4(uint32_t *out, const uint32_t *in, int xsize, const int *xbounds, const int16_t *kk, int kmax,
                   int coefs_precision)
{
    for (int xx = 0; xx < xsize; xx++) {
        const int xmin = xbounds[xx * 2 + 0], xmax = xbounds[xx * 2 + 1];
        const int16_t *k = &kk[xx * kmax];
        __m128i sss = _mm_set1_epi32(1 << (coefs_precision - 1));
        int x = 0;
        for (; x < xmax - 7; x += 8) {
            __m128i pix, mmk, source;
            const __m128i ksource = _mm_loadu_si128((const __m128i *)&k[x]);
            source = _mm_loadu_si128((const __m128i *)&in[x + xmin]);
            pix = _mm_shuffle_epi8(source, _mm_set_epi8(-1, 11, -1, 3, -1, 10, -1, 2, -1, 9, -1, 1, -1, 8, -1, 0));
            mmk = _mm_shuffle_epi8(ksource, _mm_set_epi8(5, 4, 1, 0, 5, 4, 1, 0, 5, 4, 1, 0, 5, 4, 1, 0));
            sss = _mm_add_epi32(sss, _mm_madd_epi16(pix, mmk));
            pix = _mm_shuffle_epi8(source, _mm_set_epi8(-1, 15, -1, 7, -1, 14, -1, 6, -1, 13, -1, 5, -1, 12, -1, 4));
            mmk = _mm_shuffle_epi8(ksource, _mm_set_epi8(7, 6, 3, 2, 7, 6, 3, 2, 7, 6, 3, 2, 7, 6, 3, 2));
            sss = _mm_add_epi32(sss, _mm_madd_epi16(pix, mmk));
            source = _mm_loadu_si128((const __m128i *)&in[x + 4 + xmin]);
            pix = _mm_shuffle_epi8(source, _mm_set_epi8(-1, 11, -1, 3, -1, 10, -1, 2, -1, 9, -1, 1, -1, 8, -1, 0));
            mmk = _mm_shuffle_epi8(ksource, _mm_set_epi8(13, 12, 9, 8, 13, 12, 9, 8, 13, 12, 9, 8, 13, 12, 9, 8));
            sss = _mm_add_epi32(sss, _mm_madd_epi16(pix, mmk));
            pix = _mm_shuffle_epi8(source, _mm_set_epi8(-1, 15, -1, 7, -1, 14, -1, 6, -1, 13, -1, 5, -1, 12, -1, 4));
            mmk = _mm_shuffle_epi8(ksource, _mm_set_epi8(15, 14, 11, 10, 15, 14, 11, 10, 15, 14, 11, 10, 15, 14, 11,
                                                         10));
            sss = _mm_add_epi32(sss, _mm_madd_epi16(pix, mmk));
        }
        for (; x < xmax - 3; x += 4) {
            __m128i pix, mmk;
            const __m128i source = _mm_loadu_si128((const __m128i *)&in[x + xmin]);
            const __m128i ksource = _mm_loadl_epi64((const __m128i *)&k[x]);
            pix = _mm_shuffle_epi8(source, _mm_set_epi8(-1, 11, -1, 3, -1, 10, -1, 2, -1, 9, -1, 1, -1, 8, -1, 0));
            mmk = _mm_shuffle_epi8(ksource, _mm_set_epi8(5, 4, 1, 0, 5, 4, 1, 0, 5, 4, 1, 0, 5, 4, 1, 0));
            sss = _mm_add_epi32(sss, _mm_madd_epi16(pix, mmk));
            pix = _mm_shuffle_epi8(source, _mm_set_epi8(-1, 15, -1, 7, -1, 14, -1, 6, -1, 13, -1, 5, -1, 12, -1, 4));
            mmk = _mm_shuffle_epi8(ksource, _mm_set_epi8(7, 6, 3, 2, 7, 6, 3, 2, 7, 6, 3, 2, 7, 6, 3, 2));
            sss = _mm_add_epi32(sss, _mm_madd_epi16(pix, mmk));
        }
        out[xx] = packed(horizontal_1x_tail(sss, in, x, xmin, xmax, k), coefs_precision);
    }
}

void
ff_horizontal_4byte(int isa, const FFImage *in, int offset, unsigned char *out, ptrdiff_t out_stride, int out_w,
                    int out_h, const int *bounds, const int16_t *kk, int ksize, int precision)
{
#define ROW_IN(y) ((const uint32_t *)(in->data + (ptrdiff_t)((y) + offset) * in->stride))
#define ROW_OUT(y) ((uint32_t *)(out + (ptrdiff_t)(y) * out_stride))
    int yy = 0;
    for (; yy < out_h - 3; yy += 4) {
        (isa == FF_ISA_AVX2 ? horizontal_4x_avx2 : horizontal_4x_sse4)(
            ROW_OUT(yy), ROW_OUT(yy + 1), ROW_OUT(yy + 2), ROW_OUT(yy + 3), ROW_IN(yy), ROW_IN(yy + 1),
            ROW_IN(yy + 2), ROW_IN(yy + 3), out_w, bounds, kk, ksize, precision);
    }
    for (; yy < out_h; yy++)
        (isa == FF_ISA_AVX2 ? horizontal_1x_avx2 : horizontal_1x_sse4)(ROW_OUT(yy), ROW_IN(yy), out_w, bounds, kk,
                                                                          ksize, precision);
#undef ROW_IN
#undef ROW_OUT
}

/* ---- feedfast's horizontal pass of 1-byte pixels: 4 rows at once, the rows in the lanes ---- */

/* Bytes (row r, taps t, t + 1) as int16 pairs, from 4 bytes a row: taps 0, 1 (LO) or 2, 3 (HI). */
#define ROWS_LO -1, 13, -1, 12, -1, 9, -1, 8, -1, 5, -1, 4, -1, 1, -1, 0
#define ROWS_HI -1, 15, -1, 14, -1, 11, -1, 10, -1, 7, -1, 6, -1, 3, -1, 2

/* Output pixel xx of 4 rows: sums of 4 taps at once, then 2 (as 4, the other two bytes' weights 0), then 1. */
#define HORIZONTAL_1BYTE_BODY                                                                                       \
    const __m128i lo = _mm_set_epi8(ROWS_LO), hi = _mm_set_epi8(ROWS_HI);                                          \
    const __m128i initial = _mm_set1_epi32(1 << (precision - 1));                                                  \
    for (int xx = 0; xx < out_w; xx++) {                                                                           \
        const int xmin = bounds[xx * 2 + 0], xmax = bounds[xx * 2 + 1];                                            \
        const int16_t *k = &kk[xx * ksize];                                                                        \
        __m128i sss = initial;                                                                                     \
        int x = 0;                                                                                                 \
        for (; x < xmax - 3; x += 4) {                                                                             \
            const __m128i source = _mm_setr_epi32(load32(r0 + xmin + x), load32(r1 + xmin + x),                   \
                                                  load32(r2 + xmin + x), load32(r3 + xmin + x));                   \
            sss = _mm_add_epi32(sss, _mm_madd_epi16(_mm_shuffle_epi8(source, lo), _mm_set1_epi32(load32(&k[x])))); \
            sss = _mm_add_epi32(sss,                                                                               \
                                _mm_madd_epi16(_mm_shuffle_epi8(source, hi), _mm_set1_epi32(load32(&k[x + 2])))); \
        }                                                                                                          \
        for (; x < xmax - 1; x += 2) {                                                                             \
            const __m128i source = _mm_setr_epi32(r0[xmin + x] | r0[xmin + x + 1] << 8,                            \
                                                  r1[xmin + x] | r1[xmin + x + 1] << 8,                            \
                                                  r2[xmin + x] | r2[xmin + x + 1] << 8,                            \
                                                  r3[xmin + x] | r3[xmin + x + 1] << 8);                           \
            sss = _mm_add_epi32(sss, _mm_madd_epi16(_mm_shuffle_epi8(source, lo), _mm_set1_epi32(load32(&k[x])))); \
        }                                                                                                          \
        for (; x < xmax; x++) {                                                                                    \
            const __m128i source = _mm_setr_epi32(r0[xmin + x], r1[xmin + x], r2[xmin + x], r3[xmin + x]);        \
            sss = _mm_add_epi32(sss, _mm_madd_epi16(source, _mm_set1_epi32(k[x])));                                \
        }                                                                                                          \
        sss = _mm_srai_epi32(sss, precision);                                                                      \
        sss = _mm_packs_epi32(sss, sss);                                                                           \
        const uint32_t four = (uint32_t)_mm_cvtsi128_si32(_mm_packus_epi16(sss, sss));                            \
        o0[xx] = (unsigned char)four, o1[xx] = (unsigned char)(four >> 8);                                         \
        o2[xx] = (unsigned char)(four >> 16), o3[xx] = (unsigned char)(four >> 24);                                \
    }

AVX2 static void
horizontal_1byte_avx2(const unsigned char *r0, const unsigned char *r1, const unsigned char *r2,
                      const unsigned char *r3, unsigned char *o0, unsigned char *o1, unsigned char *o2,
                      unsigned char *o3, int out_w, const int *bounds, const int16_t *kk, int ksize, int precision)
{
    HORIZONTAL_1BYTE_BODY
}

SSE4 static void
horizontal_1byte_sse4(const unsigned char *r0, const unsigned char *r1, const unsigned char *r2,
                      const unsigned char *r3, unsigned char *o0, unsigned char *o1, unsigned char *o2,
                      unsigned char *o3, int out_w, const int *bounds, const int16_t *kk, int ksize, int precision)
{
    HORIZONTAL_1BYTE_BODY
}

void
ff_horizontal_1byte(int isa, const FFImage *in, int offset, unsigned char *out, ptrdiff_t out_stride, int out_w,
                    int out_h, const int *bounds, const int16_t *kk, int ksize, int precision)
{
    for (int yy = 0; yy < out_h; yy += 4) { /* the last rows of a count not a multiple of 4: one row 4 times */
        const unsigned char *r[4];
        unsigned char *o[4];
        for (int i = 0; i < 4; i++) {
            const int y = yy + i < out_h ? yy + i : out_h - 1;
            r[i] = in->data + (ptrdiff_t)(y + offset) * in->stride;
            o[i] = out + (ptrdiff_t)y * out_stride;
        }
        (isa == FF_ISA_AVX2 ? horizontal_1byte_avx2 : horizontal_1byte_sse4)(r[0], r[1], r[2], r[3], o[0], o[1],
                                                                              o[2], o[3], out_w, bounds, kk, ksize,
                                                                              precision);
    }
}

/* ---- ResampleSIMDVerticalConv.c: ImagingResampleVerticalConvolution8u, over bytes ---- */

/* Bytes i .. of one output row: 8 at a time, then 4 (pillow-simd's 2 pixels, then 1), then one by one. */
SSE4 static inline void
vertical_tail(unsigned char *out, const unsigned char *first, ptrdiff_t stride, int i, int n, int ymax,
              const int16_t *k, int coefs_precision)
{
    const __m128i initial = _mm_set1_epi32(1 << (coefs_precision - 1));
    for (; i < n - 7; i += 8) {
        __m128i sss0 = initial, sss1 = initial; /* left pixel, right pixel */
        int y = 0;
        for (; y < ymax - 1; y += 2) {
            const __m128i mmk = _mm_set1_epi32(load32(&k[y]));
            const __m128i source1 = _mm_loadl_epi64((const __m128i *)(first + y * stride + i));
            const __m128i source2 = _mm_loadl_epi64((const __m128i *)(first + (y + 1) * stride + i));
            const __m128i source = _mm_unpacklo_epi8(source1, source2);
            sss0 = _mm_add_epi32(sss0, _mm_madd_epi16(_mm_unpacklo_epi8(source, _mm_setzero_si128()), mmk));
            sss1 = _mm_add_epi32(sss1, _mm_madd_epi16(_mm_unpackhi_epi8(source, _mm_setzero_si128()), mmk));
        }
        for (; y < ymax; y++) {
            const __m128i mmk = _mm_set1_epi32(k[y]);
            const __m128i source = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(first + y * stride + i)),
                                                     _mm_setzero_si128());
            sss0 = _mm_add_epi32(sss0, _mm_madd_epi16(_mm_unpacklo_epi8(source, _mm_setzero_si128()), mmk));
            sss1 = _mm_add_epi32(sss1, _mm_madd_epi16(_mm_unpackhi_epi8(source, _mm_setzero_si128()), mmk));
        }
        sss0 = _mm_srai_epi32(sss0, coefs_precision);
        sss1 = _mm_srai_epi32(sss1, coefs_precision);
        sss0 = _mm_packs_epi32(sss0, sss1);
        _mm_storel_epi64((__m128i *)(out + i), _mm_packus_epi16(sss0, sss0));
    }
    for (; i < n - 3; i += 4) {
        __m128i sss = initial;
        int y = 0;
        for (; y < ymax - 1; y += 2) {
            const __m128i mmk = _mm_set1_epi32(load32(&k[y]));
            const __m128i source1 = _mm_cvtsi32_si128(load32(first + y * stride + i));
            const __m128i source2 = _mm_cvtsi32_si128(load32(first + (y + 1) * stride + i));
            const __m128i source = _mm_unpacklo_epi8(source1, source2);
            sss = _mm_add_epi32(sss, _mm_madd_epi16(_mm_unpacklo_epi8(source, _mm_setzero_si128()), mmk));
        }
        for (; y < ymax; y++)
            sss = _mm_add_epi32(sss, _mm_madd_epi16(mm_cvtepu8_epi32(first + y * stride + i), _mm_set1_epi32(k[y])));
        const uint32_t four = packed(sss, coefs_precision);
        memcpy(out + i, &four, sizeof four);
    }
    for (; i < n; i++) {
        int32_t ss = 1 << (coefs_precision - 1);
        for (int y = 0; y < ymax; y++)
            ss += first[y * stride + i] * k[y];
        ss >>= coefs_precision;
        out[i] = ss < 0 ? 0 : ss > 255 ? 255 : (unsigned char)ss;
    }
}

AVX2 static void
vertical_avx2(unsigned char *out, const unsigned char *first, ptrdiff_t stride, int n, int ymax, const int16_t *k,
              int coefs_precision)
{
    const __m256i initial_256 = _mm256_set1_epi32(1 << (coefs_precision - 1));
    const __m256i zero = _mm256_setzero_si256();
    int i = 0;
    for (; i < n - 31; i += 32) {
        __m256i sss0 = initial_256, sss1 = initial_256, sss2 = initial_256, sss3 = initial_256;
        int y = 0;
        for (; y < ymax - 1; y += 2) {
            __m256i source, pix;
            const __m256i mmk = _mm256_set1_epi32(load32(&k[y])); /* two coefficients at once */
            const __m256i source1 = _mm256_loadu_si256((const __m256i *)(first + y * stride + i));       /* top */
            const __m256i source2 = _mm256_loadu_si256((const __m256i *)(first + (y + 1) * stride + i)); /* bottom */
            source = _mm256_unpacklo_epi8(source1, source2);
            pix = _mm256_unpacklo_epi8(source, zero);
            sss0 = _mm256_add_epi32(sss0, _mm256_madd_epi16(pix, mmk));
            pix = _mm256_unpackhi_epi8(source, zero);
            sss1 = _mm256_add_epi32(sss1, _mm256_madd_epi16(pix, mmk));
            source = _mm256_unpackhi_epi8(source1, source2);
            pix = _mm256_unpacklo_epi8(source, zero);
            sss2 = _mm256_add_epi32(sss2, _mm256_madd_epi16(pix, mmk));
            pix = _mm256_unpackhi_epi8(source, zero);
            sss3 = _mm256_add_epi32(sss3, _mm256_madd_epi16(pix, mmk));
        }
        for (; y < ymax; y++) {
            __m256i source, pix;
            const __m256i mmk = _mm256_set1_epi32(k[y]);
            const __m256i source1 = _mm256_loadu_si256((const __m256i *)(first + y * stride + i));
            source = _mm256_unpacklo_epi8(source1, zero);
            pix = _mm256_unpacklo_epi8(source, zero);
            sss0 = _mm256_add_epi32(sss0, _mm256_madd_epi16(pix, mmk));
            pix = _mm256_unpackhi_epi8(source, zero);
            sss1 = _mm256_add_epi32(sss1, _mm256_madd_epi16(pix, mmk));
            source = _mm256_unpackhi_epi8(source1, zero);
            pix = _mm256_unpacklo_epi8(source, zero);
            sss2 = _mm256_add_epi32(sss2, _mm256_madd_epi16(pix, mmk));
            pix = _mm256_unpackhi_epi8(source, zero);
            sss3 = _mm256_add_epi32(sss3, _mm256_madd_epi16(pix, mmk));
        }
        sss0 = _mm256_srai_epi32(sss0, coefs_precision);
        sss1 = _mm256_srai_epi32(sss1, coefs_precision);
        sss2 = _mm256_srai_epi32(sss2, coefs_precision);
        sss3 = _mm256_srai_epi32(sss3, coefs_precision);
        sss0 = _mm256_packs_epi32(sss0, sss1);
        sss2 = _mm256_packs_epi32(sss2, sss3);
        _mm256_storeu_si256((__m256i *)(out + i), _mm256_packus_epi16(sss0, sss2));
    }
    vertical_tail(out, first, stride, i, n, ymax, k, coefs_precision);
}

SSE4 static void
vertical_sse4(unsigned char *out, const unsigned char *first, ptrdiff_t stride, int n, int ymax, const int16_t *k,
              int coefs_precision)
{
    const __m128i initial = _mm_set1_epi32(1 << (coefs_precision - 1));
    const __m128i zero = _mm_setzero_si128();
    int i = 0;
    for (; i < n - 31; i += 32) {
        __m128i sss0 = initial, sss1 = initial, sss2 = initial, sss3 = initial;
        __m128i sss4 = initial, sss5 = initial, sss6 = initial, sss7 = initial;
        int y = 0;
        for (; y < ymax - 1; y += 2) {
            __m128i source, source1, source2;
            const __m128i mmk = _mm_set1_epi32(load32(&k[y])); /* two coefficients at once */
            source1 = _mm_loadu_si128((const __m128i *)(first + y * stride + i));       /* top line */
            source2 = _mm_loadu_si128((const __m128i *)(first + (y + 1) * stride + i)); /* bottom line */
            source = _mm_unpacklo_epi8(source1, source2);
            sss0 = _mm_add_epi32(sss0, _mm_madd_epi16(_mm_unpacklo_epi8(source, zero), mmk));
            sss1 = _mm_add_epi32(sss1, _mm_madd_epi16(_mm_unpackhi_epi8(source, zero), mmk));
            source = _mm_unpackhi_epi8(source1, source2);
            sss2 = _mm_add_epi32(sss2, _mm_madd_epi16(_mm_unpacklo_epi8(source, zero), mmk));
            sss3 = _mm_add_epi32(sss3, _mm_madd_epi16(_mm_unpackhi_epi8(source, zero), mmk));
            source1 = _mm_loadu_si128((const __m128i *)(first + y * stride + i + 16));
            source2 = _mm_loadu_si128((const __m128i *)(first + (y + 1) * stride + i + 16));
            source = _mm_unpacklo_epi8(source1, source2);
            sss4 = _mm_add_epi32(sss4, _mm_madd_epi16(_mm_unpacklo_epi8(source, zero), mmk));
            sss5 = _mm_add_epi32(sss5, _mm_madd_epi16(_mm_unpackhi_epi8(source, zero), mmk));
            source = _mm_unpackhi_epi8(source1, source2);
            sss6 = _mm_add_epi32(sss6, _mm_madd_epi16(_mm_unpacklo_epi8(source, zero), mmk));
            sss7 = _mm_add_epi32(sss7, _mm_madd_epi16(_mm_unpackhi_epi8(source, zero), mmk));
        }
        for (; y < ymax; y++) {
            __m128i source, source1;
            const __m128i mmk = _mm_set1_epi32(k[y]);
            source1 = _mm_loadu_si128((const __m128i *)(first + y * stride + i));
            source = _mm_unpacklo_epi8(source1, zero);
            sss0 = _mm_add_epi32(sss0, _mm_madd_epi16(_mm_unpacklo_epi8(source, zero), mmk));
            sss1 = _mm_add_epi32(sss1, _mm_madd_epi16(_mm_unpackhi_epi8(source, zero), mmk));
            source = _mm_unpackhi_epi8(source1, zero);
            sss2 = _mm_add_epi32(sss2, _mm_madd_epi16(_mm_unpacklo_epi8(source, zero), mmk));
            sss3 = _mm_add_epi32(sss3, _mm_madd_epi16(_mm_unpackhi_epi8(source, zero), mmk));
            source1 = _mm_loadu_si128((const __m128i *)(first + y * stride + i + 16));
            source = _mm_unpacklo_epi8(source1, zero);
            sss4 = _mm_add_epi32(sss4, _mm_madd_epi16(_mm_unpacklo_epi8(source, zero), mmk));
            sss5 = _mm_add_epi32(sss5, _mm_madd_epi16(_mm_unpackhi_epi8(source, zero), mmk));
            source = _mm_unpackhi_epi8(source1, zero);
            sss6 = _mm_add_epi32(sss6, _mm_madd_epi16(_mm_unpacklo_epi8(source, zero), mmk));
            sss7 = _mm_add_epi32(sss7, _mm_madd_epi16(_mm_unpackhi_epi8(source, zero), mmk));
        }
        sss0 = _mm_packs_epi32(_mm_srai_epi32(sss0, coefs_precision), _mm_srai_epi32(sss1, coefs_precision));
        sss2 = _mm_packs_epi32(_mm_srai_epi32(sss2, coefs_precision), _mm_srai_epi32(sss3, coefs_precision));
        _mm_storeu_si128((__m128i *)(out + i), _mm_packus_epi16(sss0, sss2));
        sss4 = _mm_packs_epi32(_mm_srai_epi32(sss4, coefs_precision), _mm_srai_epi32(sss5, coefs_precision));
        sss6 = _mm_packs_epi32(_mm_srai_epi32(sss6, coefs_precision), _mm_srai_epi32(sss7, coefs_precision));
        _mm_storeu_si128((__m128i *)(out + i + 16), _mm_packus_epi16(sss4, sss6));
    }
    vertical_tail(out, first, stride, i, n, ymax, k, coefs_precision);
}

void
ff_vertical(int isa, const FFImage *in, unsigned char *out, ptrdiff_t out_stride, int out_h, const int *bounds,
            const int16_t *kk, int ksize, int precision)
{
    const int n = in->width * in->pixel;
    for (int yy = 0; yy < out_h; yy++) {
        const unsigned char *first = in->data + (ptrdiff_t)bounds[yy * 2] * in->stride;
        (isa == FF_ISA_AVX2 ? vertical_avx2 : vertical_sse4)(out + (ptrdiff_t)yy * out_stride, first, in->stride, n,
                                                             bounds[yy * 2 + 1], &kk[yy * ksize], precision);
    }
}

/* ---- Reduce.c's blocks, a row of blocks at a time: column sums, then the blocks' sums of them ---- */

AVX2 static void
column_sums_avx2(const unsigned char *first, ptrdiff_t stride, int rows, int n, uint16_t *sums)
{
    int i = 0;
    for (; i + 64 <= n; i += 64) { /* 4 loads a row in flight */
        __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
        for (int r = 0; r < rows; r++) {
            const __m128i *row = (const __m128i *)(first + r * stride + i);
            acc0 = _mm256_add_epi16(acc0, _mm256_cvtepu8_epi16(_mm_loadu_si128(row)));
            acc1 = _mm256_add_epi16(acc1, _mm256_cvtepu8_epi16(_mm_loadu_si128(row + 1)));
            acc2 = _mm256_add_epi16(acc2, _mm256_cvtepu8_epi16(_mm_loadu_si128(row + 2)));
            acc3 = _mm256_add_epi16(acc3, _mm256_cvtepu8_epi16(_mm_loadu_si128(row + 3)));
        }
        _mm256_storeu_si256((__m256i *)(sums + i), acc0);
        _mm256_storeu_si256((__m256i *)(sums + i + 16), acc1);
        _mm256_storeu_si256((__m256i *)(sums + i + 32), acc2);
        _mm256_storeu_si256((__m256i *)(sums + i + 48), acc3);
    }
    for (; i + 16 <= n; i += 16) {
        __m256i acc = _mm256_setzero_si256();
        for (int r = 0; r < rows; r++)
            acc = _mm256_add_epi16(acc, _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(first + r * stride + i))));
        _mm256_storeu_si256((__m256i *)(sums + i), acc);
    }
    for (; i < n; i++) {
        uint16_t sum = 0;
        for (int r = 0; r < rows; r++)
            sum += first[r * stride + i];
        sums[i] = sum;
    }
}

SSE4 static void
column_sums_sse4(const unsigned char *first, ptrdiff_t stride, int rows, int n, uint16_t *sums)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i acc = _mm_setzero_si128();
        for (int r = 0; r < rows; r++)
            acc = _mm_add_epi16(acc, _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(first + r * stride + i))));
        _mm_storeu_si128((__m128i *)(sums + i), acc);
    }
    for (; i < n; i++) {
        uint16_t sum = 0;
        for (int r = 0; r < rows; r++)
            sum += first[r * stride + i];
        sums[i] = sum;
    }
}

/* The blocks' sums of 4-byte pixels, two blocks at a time (their 16-bit sums in one register) while a block
 * sums to 16 bits (count * 255 < 65536), else one at a time in 32 bits. */
SSE4 static int
full_blocks_4byte(const uint16_t *sums, int blocks, int factor_x, int count, uint32_t amend, uint32_t multiplier,
                  unsigned char *o)
{
    const __m128i mm_amend = _mm_set1_epi32((int)amend), mm_multiplier = _mm_set1_epi32((int)multiplier);
    int x = 0;
    if (count <= FF_REDUCE_ROWS && factor_x == 2) { /* pixels (0, 1) + (2, 3) of 4 columns */
        for (; x + 2 <= blocks; x += 2) {
            const __m128i a = _mm_loadu_si128((const __m128i *)(sums + x * 8));
            const __m128i b = _mm_loadu_si128((const __m128i *)(sums + x * 8 + 8));
            const __m128i ss = _mm_add_epi16(_mm_unpacklo_epi64(a, b), _mm_unpackhi_epi64(a, b));
            __m128i ss0 = _mm_add_epi32(_mm_cvtepu16_epi32(ss), mm_amend);
            __m128i ss1 = _mm_add_epi32(_mm_cvtepu16_epi32(_mm_srli_si128(ss, 8)), mm_amend);
            ss0 = _mm_srli_epi32(_mm_mullo_epi32(ss0, mm_multiplier), 24);
            ss1 = _mm_srli_epi32(_mm_mullo_epi32(ss1, mm_multiplier), 24);
            ss0 = _mm_packs_epi32(ss0, ss1);
            _mm_storel_epi64((__m128i *)(o + x * 4), _mm_packus_epi16(ss0, ss0));
        }
    }
    if (count <= FF_REDUCE_ROWS) {
        for (; x + 2 <= blocks; x += 2) {
            const uint16_t *p0 = sums + (ptrdiff_t)x * factor_x * 4, *p1 = p0 + factor_x * 4;
            __m128i ss = _mm_setzero_si128();
            for (int xx = 0; xx < factor_x; xx++) {
                int64_t a, b;
                memcpy(&a, p0 + xx * 4, sizeof a);
                memcpy(&b, p1 + xx * 4, sizeof b);
                ss = _mm_add_epi16(ss, _mm_set_epi64x(b, a));
            }
            __m128i ss0 = _mm_add_epi32(_mm_cvtepu16_epi32(ss), mm_amend);
            __m128i ss1 = _mm_add_epi32(_mm_cvtepu16_epi32(_mm_srli_si128(ss, 8)), mm_amend);
            ss0 = _mm_srli_epi32(_mm_mullo_epi32(ss0, mm_multiplier), 24);
            ss1 = _mm_srli_epi32(_mm_mullo_epi32(ss1, mm_multiplier), 24);
            ss0 = _mm_packs_epi32(ss0, ss1);
            _mm_storel_epi64((__m128i *)(o + x * 4), _mm_packus_epi16(ss0, ss0));
        }
    }
    for (; x < blocks; x++) {
        __m128i ss = mm_amend;
        for (int xx = 0; xx < factor_x; xx++)
            ss = _mm_add_epi32(ss, _mm_cvtepu16_epi32(
                                       _mm_loadl_epi64((const __m128i *)(sums + ((ptrdiff_t)x * factor_x + xx) * 4))));
        ss = _mm_srli_epi32(_mm_mullo_epi32(ss, mm_multiplier), 24);
        ss = _mm_packs_epi32(ss, ss);
        const int32_t four = _mm_cvtsi128_si32(_mm_packus_epi16(ss, ss));
        memcpy(o + x * 4, &four, sizeof four);
    }
    return x;
}

SSE4 static void
block_sums_sse4(const uint16_t *sums, int n, int pixel, int factor_x, int rows, int twice_amend, unsigned char *o)
{
    const int width = n / pixel, out_w = (width + factor_x - 1) / factor_x, blocks = width / factor_x;
    const uint32_t full_multiplier = ff_division_uint32(rows * factor_x, 8);
    const uint32_t full_amend = (uint32_t)(rows * factor_x) / 2 * (twice_amend ? 2 : 1);
    int x = 0;
    if (pixel == 4) {
        x = full_blocks_4byte(sums, blocks, factor_x, rows * factor_x, full_amend, full_multiplier, o);
    } else {
        for (; x < blocks; x++) {
            const uint16_t *p = sums + (ptrdiff_t)x * factor_x;
            uint32_t ss = full_amend;
            for (int xx = 0; xx < factor_x; xx++)
                ss += p[xx];
            o[x] = (unsigned char)((ss * full_multiplier) >> 24);
        }
    }
    for (; x < out_w; x++) { /* the last block, where it is narrower */
        const int x0 = x * factor_x, cols = x0 + factor_x <= width ? factor_x : width - x0;
        const uint32_t multiplier = cols == factor_x ? full_multiplier : ff_division_uint32(rows * cols, 8);
        const uint32_t amend = (uint32_t)(rows * cols) / 2 * (twice_amend ? 2 : 1);
        for (int ch = 0; ch < pixel; ch++) {
            uint32_t ss = amend;
            for (int xx = 0; xx < cols; xx++)
                ss += sums[(x0 + xx) * pixel + ch];
            o[x * pixel + ch] = (unsigned char)((ss * multiplier) >> 24);
        }
    }
}

void
ff_reduce_row(int isa, const unsigned char *first, ptrdiff_t stride, int rows, int n, int pixel, int factor_x,
              int twice_amend, void *sums, unsigned char *o)
{
    (isa == FF_ISA_AVX2 ? column_sums_avx2 : column_sums_sse4)(first, stride, rows, n, sums);
    block_sums_sse4(sums, n, pixel, factor_x, rows, twice_amend, o);
}

#else /* no x86: ff_isa is FF_ISA_C, and _resample.c never calls these */

void
ff_horizontal_4byte(int isa, const FFImage *in, int offset, unsigned char *out, ptrdiff_t out_stride, int out_w,
                    int out_h, const int *bounds, const int16_t *kk, int ksize, int precision)
{
}

void
ff_horizontal_1byte(int isa, const FFImage *in, int offset, unsigned char *out, ptrdiff_t out_stride, int out_w,
                    int out_h, const int *bounds, const int16_t *kk, int ksize, int precision)
{
}

void
ff_vertical(int isa, const FFImage *in, unsigned char *out, ptrdiff_t out_stride, int out_h, const int *bounds,
            const int16_t *kk, int ksize, int precision)
{
}

void
ff_reduce_row(int isa, const unsigned char *first, ptrdiff_t stride, int rows, int n, int pixel, int factor_x,
              int twice_amend, void *sums, unsigned char *o)
{
}

#endif

/* ---- rows on their way out: 4-byte pixels as 3-byte ones, normalized planes ---- */

#ifdef FF_HAVE_X86

/* 4 pixels as 12 bytes, in order (RGB_KEEP) or mirrored (RGB_MIRROR) */
#define RGB_KEEP -1, -1, -1, -1, 14, 13, 12, 10, 9, 8, 6, 5, 4, 2, 1, 0
#define RGB_MIRROR -1, -1, -1, -1, 2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12

SSE4 static int
rgb_row_sse4(const unsigned char *in, unsigned char *out, int width, int hflip)
{
    const __m128i mask = hflip ? _mm_set_epi8(RGB_MIRROR) : _mm_set_epi8(RGB_KEEP);
    int x = 0;
    for (; x + 4 <= width; x += 4) {
        const unsigned char *p = in + (ptrdiff_t)(hflip ? width - 4 - x : x) * 4;
        const __m128i v = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)p), mask);
        const int32_t last = _mm_cvtsi128_si32(_mm_srli_si128(v, 8));
        _mm_storel_epi64((__m128i *)(out + (ptrdiff_t)x * 3), v);
        memcpy(out + (ptrdiff_t)x * 3 + 8, &last, sizeof last);
    }
    return x;
}

AVX2 static int
normalized_row_avx2(const unsigned char *in, int pixel, int width, int hflip, const float *mean, const float *inv,
                    float *const *planes)
{
    const int channels = pixel == 4 ? 3 : 1;
    const __m256i reverse = _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0), low = _mm256_set1_epi32(0xff);
    __m256 m[3], k[3];
    for (int c = 0; c < channels; c++)
        m[c] = _mm256_set1_ps(mean[c]), k[c] = _mm256_set1_ps(inv[c]);
    int x = 0;
    for (; x + 8 <= width; x += 8) {
        const unsigned char *p = in + (ptrdiff_t)(hflip ? width - 8 - x : x) * pixel;
        __m256i v = pixel == 4 ? _mm256_loadu_si256((const __m256i *)p)
                               : _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
        if (hflip)
            v = _mm256_permutevar8x32_epi32(v, reverse);
        for (int c = 0; c < channels; c++) {
            const __m256 f = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 8 * c), low));
            _mm256_storeu_ps(planes[c] + x, _mm256_mul_ps(_mm256_sub_ps(f, m[c]), k[c]));
        }
    }
    return x;
}

#endif

void
ff_rgb_row(const unsigned char *in, unsigned char *out, int width, int hflip)
{
    int x = 0;
#ifdef FF_HAVE_X86
    if (ff_isa() != FF_ISA_C)
        x = rgb_row_sse4(in, out, width, hflip);
#endif
    for (; x < width; x++) {
        const unsigned char *p = in + (ptrdiff_t)(hflip ? width - 1 - x : x) * 4;
        out[x * 3 + 0] = p[0], out[x * 3 + 1] = p[1], out[x * 3 + 2] = p[2];
    }
}

void
ff_normalized_row(const unsigned char *in, int pixel, int width, int hflip, const float *mean, const float *inv,
                  float *const *planes)
{
    int x = 0;
#ifdef FF_HAVE_X86
    if (ff_isa() == FF_ISA_AVX2)
        x = normalized_row_avx2(in, pixel, width, hflip, mean, inv, planes);
#endif
    for (int c = 0; c < (pixel == 4 ? 3 : 1); c++) {
        const float m = mean[c], k = inv[c];
        float *values = planes[c];
        for (int i = x; i < width; i++)
            values[i] = ((float)in[(ptrdiff_t)(hflip ? width - 1 - i : i) * pixel + c] - m) * k;
    }
}
