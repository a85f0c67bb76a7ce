/* feedfast's port of Pillow's Image.resize for 8-bit images: the same pixels, bit for bit (see _resample.h).
 *
 * What is ported, from Pillow 12 (src/PIL/Image.py, src/_imaging.c, src/libImaging/) and pillow-simd
 * (uploadcare/pillow-simd, whose loops are SSE4/AVX2 but sum the same integer products as a scalar loop):
 *
 *   Image.resize        the copy when nothing changes; reducing_gap: reduce() by whole factors over the
 *                       box widened by the filter's reach (_get_safe_box), then the rest.
 *   _imaging._resize    Pillow's box checks (in float32, as it parses the box), the crop when the box is
 *                       whole pixels of the output's size, NEAREST as an affine transform (Geometry.c's
 *                       ImagingScaleAffine), every other filter through Resample.c.
 *   Resample.c          the filters, precompute_coeffs, normalize_coeffs_8bpc, the horizontal pass over
 *                       the rows the vertical one reads (need_horizontal, need_vertical), then the vertical.
 *                       Pillow rounds coefficients to 22 bits; pillow-simd to 16-bit integers at the
 *                       largest precision (up to 22 bits) its largest coefficient allows.
 *   Reduce.c            the average of each factor_x x factor_y block, partial blocks at the right and
 *                       bottom edges, through the same 32-bit multiply-and-shift (every special case of
 *                       Reduce.c, 2x2 to 5x5, computes the same integers as its general loop, but for
 *                       pillow-simd's 1x3 of 4-byte pixels: see reduce()).
 *
 * pillow-simd's flavour runs its passes on pillow-simd's SSE4 or AVX2 convolutions, ported in
 * _resample_simd.c, where the CPU has them (the same sums, so the same pixels: those of the plain C passes
 * here, which Pillow's flavour and CPUs without SSE4.1 run).
 *
 * The fourth byte of a 4-byte pixel is resampled like the others (pillow-simd does; Pillow writes 0 to
 * it for RGB); callers drop it. The build keeps the compiler from fusing float operations (setup.py:
 * -ffp-contract=off), so the coefficients' doubles are Pillow's.
 */
#include "_resample.h"
#include "_resample_simd.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* ---- Resample.c's filters ---- */

static double
box_filter(double x)
{
    if (x > -0.5 && x <= 0.5)
        return 1.0;
    return 0.0;
}

static double
bilinear_filter(double x)
{
    if (x < 0.0)
        x = -x;
    if (x < 1.0)
        return 1.0 - x;
    return 0.0;
}

static double
hamming_filter(double x)
{
    if (x < 0.0)
        x = -x;
    if (x == 0.0)
        return 1.0;
    if (x >= 1.0)
        return 0.0;
    x = x * M_PI;
    return sin(x) / x * (0.54f + 0.46f * cos(x));
}

static double
bicubic_filter(double x)
{
    const double a = -0.5;
    if (x < 0.0)
        x = -x;
    if (x < 1.0)
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0)
        return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

static double
sinc_filter(double x)
{
    if (x == 0.0)
        return 1.0;
    x = x * M_PI;
    return sin(x) / x;
}

static double
lanczos_filter(double x)
{
    if (-3.0 <= x && x < 3.0)
        return sinc_filter(x) * sinc_filter(x / 3);
    return 0.0;
}

typedef struct {
    double (*filter)(double x);
    double support;
} Filter;

static const Filter BOX = {box_filter, 0.5}, BILINEAR = {bilinear_filter, 1.0}, HAMMING = {hamming_filter, 1.0},
                    BICUBIC = {bicubic_filter, 2.0}, LANCZOS = {lanczos_filter, 3.0};

static const Filter *
filter_of(int filter)
{
    switch (filter) {
    case FF_BOX: return &BOX;
    case FF_BILINEAR: return &BILINEAR;
    case FF_HAMMING: return &HAMMING;
    case FF_BICUBIC: return &BICUBIC;
    case FF_LANCZOS: return &LANCZOS;
    default: return NULL;
    }
}

/* ---- Resample.c's coefficients ---- */

#define PRECISION_BITS (32 - 8 - 2)
#define MAX_COEFS_PRECISION (16 - 1)

/* For each output pixel: the first input pixel it reads, how many, and their weights (ksize a pixel). */
typedef struct {
    int ksize;
    int *bounds;  /* out_size x (first, count) */
    double *weights;
    int32_t *kk;  /* the weights as integers, at `precision` bits */
    int16_t *kk16; /* pillow-simd's: the same integers as int16, for the SIMD passes */
    int precision;
} Coefficients;

static void
coefficients_free(Coefficients *c)
{
    free(c->bounds);
    free(c->weights);
    free(c->kk);
    free(c->kk16);
    c->bounds = NULL, c->weights = NULL, c->kk = NULL, c->kk16 = NULL;
}

/* precompute_coeffs, then normalize_coeffs_8bpc (Pillow's or pillow-simd's). 0, or FF_NOMEM. */
static int
coefficients(Coefficients *c, int in_size, float in0, float in1, int out_size, const Filter *filterp, int simd)
{
    double support, scale, filterscale;
    int xx, x, ksize, xmin, xmax;

    memset(c, 0, sizeof *c);
    filterscale = scale = (double)(in1 - in0) / out_size;
    if (filterscale < 1.0)
        filterscale = 1.0;
    support = filterp->support * filterscale;
    ksize = (int)ceil(support) * 2 + 1;
    if (out_size > INT_MAX / (ksize * (int)sizeof(double)))
        return FF_NOMEM;
    c->ksize = ksize;
    c->weights = malloc((size_t)out_size * ksize * sizeof(double));
    c->kk = malloc((size_t)out_size * ksize * sizeof(int32_t));
    c->bounds = malloc((size_t)out_size * 2 * sizeof(int));
    c->kk16 = simd ? malloc((size_t)out_size * ksize * sizeof(int16_t)) : NULL;
    if (c->weights == NULL || c->kk == NULL || c->bounds == NULL || (simd && c->kk16 == NULL)) {
        coefficients_free(c);
        return FF_NOMEM;
    }
    double *kk = c->weights;
    double inv_filterscale = 1.0 / filterscale;
    for (xx = 0; xx < out_size; xx++) {
        double center = in0 + (xx + 0.5) * scale;
        double ww = 0.0;
        xmin = (int)(center - support + 0.5);
        if (xmin < 0)
            xmin = 0;
        xmax = (int)(center + support + 0.5);
        if (xmax > in_size)
            xmax = in_size;
        xmax -= xmin;
        double *k = &kk[xx * ksize];
        for (x = 0; x < xmax; x++) {
            double w = filterp->filter((x + xmin - center + 0.5) * inv_filterscale);
            k[x] = w;
            ww += w;
        }
        if (ww != 0.0) {
            for (x = 0; x < xmax; x++)
                k[x] /= ww;
        }
        for (; x < ksize; x++)
            k[x] = 0;
        c->bounds[xx * 2 + 0] = xmin;
        c->bounds[xx * 2 + 1] = xmax;
    }

    int n = out_size * ksize, precision = PRECISION_BITS;
    if (simd) { /* pillow-simd: INT16 coefficients, as many bits as the largest leaves room for */
        double maxkk = kk[0];
        for (x = 0; x < n; x++) {
            if (maxkk < kk[x])
                maxkk = kk[x];
        }
        for (precision = 0; precision < PRECISION_BITS; precision += 1) {
            int next_value = (int)(0.5 + maxkk * (1 << (precision + 1)));
            if (next_value >= (1 << MAX_COEFS_PRECISION))
                break;
        }
    }
    for (x = 0; x < n; x++) {
        int v = kk[x] < 0 ? (int)(-0.5 + kk[x] * (1 << precision)) : (int)(0.5 + kk[x] * (1 << precision));
        c->kk[x] = simd ? (int16_t)v : v;
        if (simd)
            c->kk16[x] = (int16_t)v;
    }
    c->precision = precision;
    return FF_OK;
}

static inline unsigned char
clip8(int32_t sum, int precision)
{
    int32_t v = sum >> precision;
    return v < 0 ? 0 : v > 255 ? 255 : (unsigned char)v;
}

/* The passes, compiled twice where GCC can (AVX2, and the baseline), the one for this CPU picked at load. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define HOT_LOOP __attribute__((noinline, target_clones("avx2", "default")))
#else
#define HOT_LOOP __attribute__((noinline))
#endif

typedef int32_t Lanes4 __attribute__((vector_size(16))); /* a 4-byte pixel's channels as int32 */

/* ImagingResampleHorizontal_8bpc: out_h rows of `out`, from the input's rows from `offset` on. */
HOT_LOOP static void
resample_horizontal(const FFImage *in, int offset, unsigned char *restrict out, ptrdiff_t out_stride, int out_w,
                    int out_h, const Coefficients *c)
{
    const int ksize = c->ksize, precision = c->precision;
    const int32_t half = (int32_t)1 << (precision - 1);
    const int *restrict bounds = c->bounds;
    const int32_t *restrict kk = c->kk;
    for (int yy = 0; yy < out_h; yy++) {
        const unsigned char *restrict row = in->data + (ptrdiff_t)(yy + offset) * in->stride;
        unsigned char *restrict o = out + (ptrdiff_t)yy * out_stride;
        if (in->pixel == 1) {
            for (int xx = 0; xx < out_w; xx++) {
                const int xmin = bounds[xx * 2], xmax = bounds[xx * 2 + 1];
                const int32_t *k = &kk[xx * ksize];
                int32_t ss = half;
                for (int x = 0; x < xmax; x++)
                    ss += row[x + xmin] * k[x];
                o[xx] = clip8(ss, precision);
            }
            continue;
        }
        for (int xx = 0; xx < out_w; xx++) {
            const int xmin = bounds[xx * 2], xmax = bounds[xx * 2 + 1];
            const int32_t *k = &kk[xx * ksize];
            Lanes4 ss = {half, half, half, half};
            const unsigned char *p = row + (ptrdiff_t)xmin * 4;
            for (int x = 0; x < xmax; x++, p += 4) {
                Lanes4 v = {p[0], p[1], p[2], p[3]};
                ss += v * k[x];
            }
#ifdef __SSE2__ /* pillow-simd's clip: shift, then saturate to int16 and to uint8 (the same as clip8) */
            __m128i v = _mm_srai_epi32((__m128i)ss, precision);
            v = _mm_packs_epi32(v, v);
            uint32_t packed = (uint32_t)_mm_cvtsi128_si32(_mm_packus_epi16(v, v));
            memcpy(o + xx * 4, &packed, 4);
#else
            o[xx * 4 + 0] = clip8(ss[0], precision);
            o[xx * 4 + 1] = clip8(ss[1], precision);
            o[xx * 4 + 2] = clip8(ss[2], precision);
            o[xx * 4 + 3] = clip8(ss[3], precision);
#endif
        }
    }
}

#define BLOCK 32 /* bytes of a row the vertical pass sums at once, in registers over the taps */

/* BLOCK sums shifted and clipped to bytes (clip8); with SSE2, as pillow-simd packs them (saturating). */
static inline void
pack_clipped(unsigned char *restrict out, const int32_t *restrict sums, int precision)
{
#ifdef __SSE2__
    for (int j = 0; j < BLOCK; j += 16) {
        __m128i a = _mm_srai_epi32(_mm_loadu_si128((const __m128i *)(sums + j)), precision);
        __m128i b = _mm_srai_epi32(_mm_loadu_si128((const __m128i *)(sums + j + 4)), precision);
        __m128i c = _mm_srai_epi32(_mm_loadu_si128((const __m128i *)(sums + j + 8)), precision);
        __m128i d = _mm_srai_epi32(_mm_loadu_si128((const __m128i *)(sums + j + 12)), precision);
        _mm_storeu_si128((__m128i *)(out + j), _mm_packus_epi16(_mm_packs_epi32(a, b), _mm_packs_epi32(c, d)));
    }
#else
    for (int j = 0; j < BLOCK; j++)
        out[j] = clip8(sums[j], precision);
#endif
}

/* ImagingResampleVertical_8bpc: out_h rows of `out`, each a weighted sum of the input's rows, BLOCK bytes of
 * a row at a time. */
HOT_LOOP static void
resample_vertical(const FFImage *in, unsigned char *restrict out, ptrdiff_t out_stride, int out_h,
                  const Coefficients *c)
{
    const int ksize = c->ksize, precision = c->precision;
    const int32_t half = (int32_t)1 << (precision - 1);
    const int n = in->width * in->pixel;
    const ptrdiff_t stride = in->stride;
    for (int yy = 0; yy < out_h; yy++) {
        const int ymin = c->bounds[yy * 2], ymax = c->bounds[yy * 2 + 1];
        const int32_t *restrict k = &c->kk[yy * ksize];
        const unsigned char *restrict first = in->data + (ptrdiff_t)ymin * stride;
        unsigned char *restrict o = out + (ptrdiff_t)yy * out_stride;
        int i = 0;
        for (; i + BLOCK <= n; i += BLOCK) {
            int32_t sums[BLOCK];
            for (int j = 0; j < BLOCK; j++)
                sums[j] = half;
            for (int y = 0; y < ymax; y++) {
                const unsigned char *restrict row = first + y * stride + i;
                const int32_t weight = k[y];
                for (int j = 0; j < BLOCK; j++)
                    sums[j] += row[j] * weight;
            }
            pack_clipped(o + i, sums, precision);
        }
        for (; i < n; i++) {
            int32_t ss = half;
            for (int y = 0; y < ymax; y++)
                ss += first[y * stride + i] * k[y];
            o[i] = clip8(ss, precision);
        }
    }
}

static unsigned char *
new_image(FFImage *image, int width, int height, int pixel)
{
    unsigned char *data = malloc((size_t)width * height * pixel + 1);
    image->data = data, image->stride = (ptrdiff_t)width * pixel;
    image->width = width, image->height = height, image->pixel = pixel;
    return data;
}

/* One pass into result->owned[slot]: horizontal (to xsize wide, `rows` rows from `offset`) or vertical; on
 * the SIMD convolutions where the coefficients are pillow-simd's and `isa` has them, else in plain C. */
static int
pass(FFImage *current, int horizontal, int xsize, int rows, int offset, const Coefficients *c, int isa,
     FFResized *result, int slot)
{
    FFImage out;
    const int width = horizontal ? xsize : current->width;
    result->owned[slot] = new_image(&out, width, rows, current->pixel);
    if (result->owned[slot] == NULL)
        return FF_NOMEM;
    unsigned char *pixels = result->owned[slot];
    if (c->kk16 != NULL && isa != FF_ISA_C) {
        if (horizontal)
            (current->pixel == 4 ? ff_horizontal_4byte : ff_horizontal_1byte)(
                isa, current, offset, pixels, out.stride, xsize, rows, c->bounds, c->kk16, c->ksize, c->precision);
        else
            ff_vertical(isa, current, pixels, out.stride, rows, c->bounds, c->kk16, c->ksize, c->precision);
    } else if (horizontal) {
        resample_horizontal(current, offset, pixels, out.stride, xsize, rows, c);
    } else {
        resample_vertical(current, pixels, out.stride, rows, c);
    }
    *current = out;
    return FF_OK;
}

/* ImagingResampleInner for 8-bit images: the horizontal pass over the rows the vertical one reads, then the
 * vertical; the image itself where neither is needed. */
static int
resample(const FFImage *in, int xsize, int ysize, const Filter *filterp, const float box[4], int flavour,
         FFResized *result)
{
    Coefficients horiz, vert;
    const int simd = flavour == FF_PILLOW_SIMD;
    int need_horizontal = xsize != in->width || box[0] || box[2] != xsize;
    int need_vertical = ysize != in->height || box[1] || box[3] != ysize;
    if (coefficients(&horiz, in->width, box[0], box[2], xsize, filterp, simd) != FF_OK)
        return FF_NOMEM;
    if (coefficients(&vert, in->height, box[1], box[3], ysize, filterp, simd) != FF_OK) {
        coefficients_free(&horiz);
        return FF_NOMEM;
    }
    int status = FF_OK;
    const int isa = ff_isa();
    FFImage current = *in;
    if (need_horizontal) { /* over the rows the vertical pass reads */
        int ybox_first = vert.bounds[0];
        int ybox_last = vert.bounds[ysize * 2 - 2] + vert.bounds[ysize * 2 - 1];
        for (int i = 0; i < ysize; i++)
            vert.bounds[i * 2] -= ybox_first;
        status = pass(&current, 1, xsize, ybox_last - ybox_first, ybox_first, &horiz, isa, result, 1);
    }
    if (status == FF_OK && need_vertical)
        status = pass(&current, 0, xsize, ysize, 0, &vert, isa, result, 2);
    coefficients_free(&horiz);
    coefficients_free(&vert);
    result->image = current;
    return status;
}

/* ---- Geometry.c: NEAREST as ImagingScaleAffine ---- */

#define COORD(v) ((v) < 0.0 ? -1 : ((int)(v)))

static int
nearest(const FFImage *in, int xsize, int ysize, const float box[4], FFResized *result)
{
    double a0 = (double)(box[2] - box[0]) / xsize, a4 = (double)(box[3] - box[1]) / ysize;
    double a2 = box[0], a5 = box[1];
    FFImage out;
    int *xintab = calloc((size_t)xsize, sizeof(int));
    result->owned[1] = new_image(&out, xsize, ysize, in->pixel);
    if (xintab == NULL || result->owned[1] == NULL) {
        free(xintab);
        return FF_NOMEM;
    }
    double xo = a2 + a0 * 0.5, yo = a5 + a4 * 0.5;
    int xmin = xsize, xmax = 0;
    for (int x = 0; x < xsize; x++) {
        int xin = COORD(xo);
        if (xin >= 0 && xin < in->width) {
            xmax = x + 1;
            if (x < xmin)
                xmin = x;
            xintab[x] = xin;
        }
        xo += a0;
    }
    const int pixel = in->pixel;
    for (int y = 0; y < ysize; y++) {
        int yi = COORD(yo);
        unsigned char *o = result->owned[1] + (ptrdiff_t)y * out.stride;
        memset(o, 0, (size_t)out.stride);
        if (yi >= 0 && yi < in->height) {
            const unsigned char *row = in->data + (ptrdiff_t)yi * in->stride;
            if (pixel == 1) {
                for (int x = xmin; x < xmax; x++)
                    o[x] = row[xintab[x]];
            } else {
                for (int x = xmin; x < xmax; x++)
                    memcpy(o + (ptrdiff_t)x * 4, row + (ptrdiff_t)xintab[x] * 4, 4);
            }
        }
        yo += a4;
    }
    free(xintab);
    result->image = out;
    return FF_OK;
}

/* ---- Reduce.c ---- */

uint32_t
ff_division_uint32(int divider, int result_bits)
{
    uint32_t max_dividend = (1 << result_bits) * divider;
    float max_int = (1 << 30) * 4.0;
    return (uint32_t)(max_int / max_dividend);
}

typedef uint32_t Sums4 __attribute__((vector_size(16))); /* a 4-byte pixel's block sums */

/* One row of ImagingReduce's blocks, as ff_reduce_row (_resample_simd.h) makes it, in plain C. */
HOT_LOOP static void
reduce_row(const unsigned char *first, ptrdiff_t stride, int rows, int n, int pixel, int factor_x, int twice_amend,
           uint32_t *restrict sums, unsigned char *restrict o)
{
    for (int i = 0; i < n; i++)
        sums[i] = first[i];
    for (int r = 1; r < rows; r++) {
        const unsigned char *restrict row = first + r * stride;
        for (int i = 0; i < n; i++)
            sums[i] += row[i];
    }
    const int width = n / pixel, out_w = (width + factor_x - 1) / factor_x;
    const uint32_t full_multiplier = ff_division_uint32(factor_x * rows, 8);
    for (int x = 0; x < out_w; x++) {
        const int x0 = x * factor_x, cols = x0 + factor_x <= width ? factor_x : width - x0;
        const uint32_t multiplier = cols == factor_x ? full_multiplier : ff_division_uint32(rows * cols, 8);
        const uint32_t amend = (uint32_t)(rows * cols) / 2 * (twice_amend ? 2 : 1);
        if (pixel == 4) {
            Sums4 ss = {amend, amend, amend, amend}, column;
            for (int xx = 0; xx < cols; xx++) {
                memcpy(&column, sums + (ptrdiff_t)(x0 + xx) * 4, sizeof column);
                ss += column;
            }
            ss = (ss * multiplier) >> 24;
            o[x * 4 + 0] = (unsigned char)ss[0], o[x * 4 + 1] = (unsigned char)ss[1];
            o[x * 4 + 2] = (unsigned char)ss[2], o[x * 4 + 3] = (unsigned char)ss[3];
        } else {
            uint32_t ss = amend;
            for (int xx = 0; xx < cols; xx++)
                ss += sums[x0 + xx];
            o[x] = (unsigned char)((ss * multiplier) >> 24);
        }
    }
}

/* ImagingReduce over the box (x, y, w, h) of `in`: each output pixel the average of a factor_x x factor_y
 * block, the blocks of the last column and row cut by the box's edge. The blocks' sums are the same integers
 * as Reduce.c's loops (and special cases) add, taken a row of blocks at a time: column sums, then their
 * sums. pillow-simd's 1x3 reduction of 4-byte pixels adds its rounding term twice (ImagingReduce1x3's SSE4
 * path; not the edge blocks): so does its flavour here. */
static int
reduce(const FFImage *in, const int box[4], int factor_x, int factor_y, int flavour, FFResized *result)
{
    FFImage out;
    const int out_w = (box[2] + factor_x - 1) / factor_x, out_h = (box[3] + factor_y - 1) / factor_y;
    const int pixel = in->pixel, n = box[2] * pixel;
    result->owned[0] = new_image(&out, out_w, out_h, pixel);
    const int isa = factor_y <= FF_REDUCE_ROWS ? ff_isa() : FF_ISA_C;
    void *sums = malloc((size_t)n * (isa == FF_ISA_C ? sizeof(uint32_t) : sizeof(uint16_t)));
    if (result->owned[0] == NULL || sums == NULL) {
        free(sums);
        return FF_NOMEM;
    }
    const int quirk_1x3 = flavour == FF_PILLOW_SIMD && pixel == 4 && factor_x == 1 && factor_y == 3;
    for (int y = 0; y < out_h; y++) {
        const int y0 = box[1] + y * factor_y;
        const int rows = y0 + factor_y <= box[1] + box[3] ? factor_y : box[1] + box[3] - y0;
        const unsigned char *first = in->data + (ptrdiff_t)y0 * in->stride + (ptrdiff_t)box[0] * pixel;
        const int twice_amend = quirk_1x3 && rows == factor_y;
        unsigned char *o = result->owned[0] + (ptrdiff_t)y * out.stride;
        if (isa == FF_ISA_C)
            reduce_row(first, in->stride, rows, n, pixel, factor_x, twice_amend, sums, o);
        else
            ff_reduce_row(isa, first, in->stride, rows, n, pixel, factor_x, twice_amend, sums, o);
    }
    free(sums);
    result->image = out;
    return FF_OK;
}

/* ---- Image.resize and _imaging._resize ---- */

static int
invalid(const char **message, const char *why)
{
    *message = why;
    return FF_INVALID;
}

/* _imaging.c's _resize on `in`, with the box as it parses it (float32). */
static int
imaging_resize(const FFImage *in, int xsize, int ysize, int filter, const double box64[4], int flavour,
               FFResized *result, const char **message)
{
    float box[4] = {(float)box64[0], (float)box64[1], (float)box64[2], (float)box64[3]};
    if (box[0] < 0 || box[1] < 0)
        return invalid(message, "box offset can't be negative");
    if (box[2] > in->width || box[3] > in->height)
        return invalid(message, "box can't exceed original image size");
    if (box[2] - box[0] < 0 || box[3] - box[1] < 0)
        return invalid(message, "box can't be empty");
    if (box[0] - (int)box[0] == 0 && box[2] - box[0] == xsize && box[1] - (int)box[1] == 0 &&
        box[3] - box[1] == ysize) { /* ImagingCrop: a window of the image */
        result->image = *in;
        result->image.data = in->data + (ptrdiff_t)(int)box[1] * in->stride + (ptrdiff_t)(int)box[0] * in->pixel;
        result->image.width = xsize, result->image.height = ysize;
        return FF_OK;
    }
    if (filter == FF_NEAREST)
        return nearest(in, xsize, ysize, box, result);
    return resample(in, xsize, ysize, filter_of(filter), box, flavour, result);
}

static int
resize(const FFImage *src, int out_w, int out_h, int filter, const double box[4], double reducing_gap, int flavour,
       FFResized *result, const char **message)
{
    if (filter != FF_NEAREST && filter_of(filter) == NULL)
        return invalid(message, "unknown resampling filter: use 0 (NEAREST), 1 (LANCZOS), 2 (BILINEAR), "
                                "3 (BICUBIC), 4 (BOX) or 5 (HAMMING)");
    if (reducing_gap != 0.0 && !(reducing_gap >= 1.0))
        return invalid(message, "reducing_gap must be 1.0 or greater");
    if (src->pixel != 1 && src->pixel != 4)
        return invalid(message, "pixels must be 1 or 4 bytes");
    if (src->width < 1 || src->height < 1)
        return invalid(message, "the image must be one pixel at least");
    if (out_w < 1 || out_h < 1)
        return invalid(message, "height and width must be > 0");
    for (int i = 0; i < 4; i++) {
        if (!isfinite(box[i]))
            return invalid(message, "box coordinates must be finite");
    }
    if (out_w == src->width && out_h == src->height && box[0] == 0 && box[1] == 0 && box[2] == src->width &&
        box[3] == src->height) { /* Image.resize: a copy */
        result->image = *src;
        return FF_OK;
    }
    if (reducing_gap == 0.0 || filter == FF_NEAREST)
        return imaging_resize(src, out_w, out_h, filter, box, flavour, result, message);

    /* Image.resize's reducing_gap, then _imaging.c's _reduce and its checks */
    double qx = (box[2] - box[0]) / out_w / reducing_gap, qy = (box[3] - box[1]) / out_h / reducing_gap;
    if (qx > INT_MAX || qy > INT_MAX)
        return invalid(message, "box can't exceed original image size");
    int factor_x = qx >= 1.0 ? (int)qx : 1, factor_y = qy >= 1.0 ? (int)qy : 1; /* int(q) or 1 */
    if (factor_x == 1 && factor_y == 1)
        return imaging_resize(src, out_w, out_h, filter, box, flavour, result, message);
    float checked[4] = {(float)box[0], (float)box[1], (float)box[2], (float)box[3]};
    if (checked[0] < 0 || checked[1] < 0 || checked[2] > src->width || checked[3] > src->height ||
        checked[2] - checked[0] < 0 || checked[3] - checked[1] < 0)
        return invalid(message, "box must lie within the image, x0 <= x1 and y0 <= y1");
    double reach = filter_of(filter)->support - 0.5; /* _get_safe_box */
    double support_x = reach * ((box[2] - box[0]) / out_w), support_y = reach * ((box[3] - box[1]) / out_h);
    long safe[4] = {(long)(box[0] - support_x), (long)(box[1] - support_y), (long)ceil(box[2] + support_x),
                    (long)ceil(box[3] + support_y)};
    safe[0] = safe[0] < 0 ? 0 : safe[0];
    safe[1] = safe[1] < 0 ? 0 : safe[1];
    safe[2] = safe[2] > src->width ? src->width : safe[2];
    safe[3] = safe[3] > src->height ? src->height : safe[3];
    if (safe[2] <= safe[0] || safe[3] <= safe[1])
        return invalid(message, "box can't be empty");
    int reduce_box[4] = {(int)safe[0], (int)safe[1], (int)(safe[2] - safe[0]), (int)(safe[3] - safe[1])};
    int status = reduce(src, reduce_box, factor_x, factor_y, flavour, result);
    if (status != FF_OK)
        return status;
    double rest[4] = {(box[0] - safe[0]) / factor_x, (box[1] - safe[1]) / factor_y, (box[2] - safe[0]) / factor_x,
                      (box[3] - safe[1]) / factor_y};
    FFImage reduced = result->image;
    return imaging_resize(&reduced, out_w, out_h, filter, rest, flavour, result, message);
}

int
ff_resize(const FFImage *src, int out_w, int out_h, int filter, const double box[4], double reducing_gap, int flavour,
          FFResized *result, const char **message)
{
    memset(result, 0, sizeof *result);
    *message = NULL;
    if (flavour != FF_PILLOW_12 && flavour != FF_PILLOW_SIMD)
        return invalid(message, "flavour must be 0 (Pillow up to 12) or 1 (pillow-simd)");
    int status = resize(src, out_w, out_h, filter, box, reducing_gap, flavour, result, message);
    if (status != FF_OK)
        ff_resized_free(result);
    return status;
}

void
ff_resized_free(FFResized *result)
{
    for (int i = 0; i < 3; i++) {
        free(result->owned[i]);
        result->owned[i] = NULL;
    }
}
