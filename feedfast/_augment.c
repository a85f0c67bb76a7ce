/* feedfast._augment: the automatic-augmentation sub-ops over uint8 H x W x C pixels (C 1 or 3), without the GIL.
 *
 * Each kernel gives Pillow's pixels for the same call, bit for bit (tests/test_augment.py checks each against
 * the installed Pillow), so feedfast.ops.autoaug.apply_array can run torchvision's and timm's sub-ops on the
 * threaded path's arrays without a PIL round trip. Ported from Pillow 12.1.1 (Geometry.c, which pillow-simd
 * 12.1.1 builds unchanged; ImageOps, ImageStat) and, where pillow-simd computes another way (convert("L"), the
 * SMOOTH filter), from pillow-simd; the caller probes which rule the installed PIL runs:
 *
 * affine(src, dst, matrix, resample, fill): Image.transform(size, AFFINE, matrix, resample, fillcolor=fill)
 *   with the output the input's size. resample 0 (nearest) is ImagingTransformAffine's three engines (the
 *   scaling one where the matrix has no rotation or shear, 16.16 fixed point where its corners fit, else
 *   doubles); 2 (bilinear) is ImagingGenericTransform with affine_transform and bilinear_filter8/32RGB.
 *   Pixels the filter refuses keep the fill (Image.transform's new(mode, size, fillcolor); fill=0 then).
 *   Built with -ffp-contract=off so the doubles round as Pillow's (its build has no fused multiply-adds).
 * lut(src, dst, table): Image.point with a table of 256 bytes (every channel) or 256 * C (channel-major).
 * blend(src, dst, table, degenerate, flavour): out = table[d << 8 | v] with d the degenerate image's value
 *   (None: the luma of src as Image.convert("L") makes it, ImageEnhance.Color's degenerate); the table is
 *   Image.blend's for every (degenerate, value) pair, built by the caller with Pillow.
 * histogram(src, flavour=-1) -> list: Image.histogram() (C * 256 counts, channel-major); with flavour 0 or 1,
 *   that of convert("L").
 * gray_mean(src, flavour) -> int: int(ImageStat.Stat(image.convert("L")).mean[0] + 0.5), ImageEnhance.Contrast's.
 * autocontrast(src, dst), equalize(src, dst): ImageOps.autocontrast(image) (no cutoff, no ignore) and
 *   ImageOps.equalize(image): their per-channel tables from the histogram, in integers and doubles as
 *   ImageOps computes them in Python, clipped as Image.point clips, then applied.
 * smooth(src, dst): Image.filter(ImageFilter.SMOOTH) of RGB as pillow-simd computes it (ImageEnhance.Sharpness's
 *   degenerate); Pillow's own rounds another way, and the caller uses this only where a probe matched.
 * simd(enable=-1) -> int: whether the bilinear affine (four pixels at a time) and smooth run on AVX2 (where the
 *   CPU has it), after turning that off (0) or on (1) when asked; both give the same pixels.
 *
 * flavour: whose convert("L") of RGB (luma_row): 0 Pillow's, 1 pillow-simd's; the caller tells which it has.
 *
 * src and dst are C-contiguous uint8 arrays of three dimensions, dst of src's shape. setup.py marks the
 * extension optional: where it did not build, autoaug runs these sub-ops through Pillow and NumPy.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Pillow's Geometry.c */
#define COORD(v) ((v) < 0.0 ? -1 : ((int)(v)))
#define FLOOR(v) ((v) < 0.0 ? ((int)floor(v)) : ((int)(v)))

typedef struct {
    Py_buffer buffer;
    int height, width, channels;
} Pixels;

/* An image argument: C-contiguous uint8 H x W x C with C 1 or 3 (writable for an output). -1 with an error set. */
static int
get_pixels(PyObject *obj, Pixels *p, int writable)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &p->buffer, flags) < 0)
        return -1;
    const char *format = p->buffer.format != NULL ? p->buffer.format : "B";
    if (*format == '<' || *format == '=' || *format == '@' || *format == '|')
        format++;
    const Py_buffer *b = &p->buffer;
    if (strcmp(format, "B") != 0 || b->ndim != 3 || (b->shape[2] != 1 && b->shape[2] != 3) || b->shape[0] < 1 ||
        b->shape[1] < 1 || b->shape[0] > INT_MAX / 4 || b->shape[1] > INT_MAX / 4) {
        PyErr_SetString(PyExc_ValueError, "pixels must be C-contiguous uint8 H x W x C with C 1 or 3");
        PyBuffer_Release(&p->buffer);
        return -1;
    }
    p->height = (int)b->shape[0], p->width = (int)b->shape[1], p->channels = (int)b->shape[2];
    return 0;
}

/* src and dst (of src's shape); -1 with an error set and nothing held. */
static int
get_pair(PyObject *source, PyObject *target, Pixels *src, Pixels *dst)
{
    if (get_pixels(source, src, 0) < 0)
        return -1;
    if (get_pixels(target, dst, 1) < 0) {
        PyBuffer_Release(&src->buffer);
        return -1;
    }
    if (dst->height != src->height || dst->width != src->width || dst->channels != src->channels) {
        PyErr_SetString(PyExc_ValueError, "out must have the pixels' shape");
        PyBuffer_Release(&src->buffer);
        PyBuffer_Release(&dst->buffer);
        return -1;
    }
    return 0;
}

/* ---- affine ---------------------------------------------------------------------------------------------- */

/* ImagingGenericTransform with affine_transform and bilinear_filter8 (c 1) or bilinear_filter32RGB (c 3): the same
 * doubles in the same order, for the output pixel whose source position is (xx, yy) = affine_transform's. Past
 * the bounds test xx - 0.5 is at least -0.5, where Pillow's FLOOR is -1: so FLOOR is a test and a truncation.
 * Inlined with a constant c. */
static inline __attribute__((always_inline)) void
bilinear_pixel(const unsigned char *in, unsigned char *o, int w, int h, const int c, double xx, double yy)
{
    if (xx < 0.0 || xx >= (double)w || yy < 0.0 || yy >= (double)h)
        return; /* the fill */
    const size_t stride = (size_t)w * c;
    xx -= 0.5;
    yy -= 0.5;
    const int ix = xx < 0.0 ? -1 : (int)xx, iy = yy < 0.0 ? -1 : (int)yy;
    const double dx = xx - ix, dy = yy - iy;
    const unsigned char *row = in + (size_t)(iy < 0 ? 0 : iy) * stride;
    const unsigned char *below = iy + 1 < h ? in + (size_t)(iy + 1) * stride : NULL;
    const int x0 = (ix < 0 ? 0 : ix) * c, x1 = (ix + 1 < w ? ix + 1 : w - 1) * c;
    for (int b = 0; b < c; b++) {
        double v1 = row[x0 + b] + (row[x1 + b] - row[x0 + b]) * dx, v2;
        if (below != NULL)
            v2 = below[x0 + b] + (below[x1 + b] - below[x0 + b]) * dx;
        else
            v2 = v1;
        v1 = v1 + (v2 - v1) * dy;
        o[b] = (unsigned char)v1;
    }
}

/* Rows y0..y1 from column x0 on. a0 * xin is the same product for every row (ax), a1 * yin for every column. */
static inline __attribute__((always_inline)) void
bilinear_scalar(const unsigned char *in, unsigned char *out, int w, int h, const int c, const double a[6],
                const double *ax, const double *ay, int x0, int y0, int y1)
{
    for (int y = y0; y < y1; y++) {
        const double yin = y + 0.5, bx = a[1] * yin, by = a[4] * yin;
        unsigned char *o = out + ((size_t)y * w + x0) * c;
        for (int x = x0; x < w; x++, o += c)
            bilinear_pixel(in, o, w, h, c, ax[x] + bx + a[2], ay[x] + by + a[5]);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1

/* bilinear_scalar four pixels at a time in AVX2 doubles: the same operations, each rounded as the scalar one
 * (no fused multiply-adds), so the same pixels. Each pixel's four neighbours come from one 32-bit gather each
 * (all three channels at once); `in` is padded so that four bytes are readable from any pixel. Lanes outside the
 * image keep the fill; their indices are clamped only to keep the gathers inside. The tail of a row is scalar. */
__attribute__((target("avx2"))) static void
bilinear_avx2(const unsigned char *in, unsigned char *out, int w, int h, const int c, const double a[6],
              const double *ax, const double *ay)
{
    const __m256d xsize = _mm256_set1_pd((double)w), ysize = _mm256_set1_pd((double)h), zero = _mm256_setzero_pd();
    const __m256d half = _mm256_set1_pd(0.5), a2 = _mm256_set1_pd(a[2]), a5 = _mm256_set1_pd(a[5]);
    const __m128i izero = _mm_setzero_si128(), ione = _mm_set1_epi32(1), wmax = _mm_set1_epi32(w - 1);
    const __m128i hmax = _mm_set1_epi32(h - 1), cvec = _mm_set1_epi32(c), svec = _mm_set1_epi32(w * c);
    const __m128i byte = _mm_set1_epi32(0xff);
    const int groups = w / 4 * 4;
    for (int y = 0; y < h; y++) {
        const double yin = y + 0.5;
        const __m256d bx = _mm256_set1_pd(a[1] * yin), by = _mm256_set1_pd(a[4] * yin);
        unsigned char *o = out + (size_t)y * w * c;
        for (int x = 0; x < groups; x += 4) {
            __m256d xx = _mm256_add_pd(_mm256_add_pd(_mm256_loadu_pd(ax + x), bx), a2);
            __m256d yy = _mm256_add_pd(_mm256_add_pd(_mm256_loadu_pd(ay + x), by), a5);
            __m256d inside = _mm256_and_pd(_mm256_and_pd(_mm256_cmp_pd(xx, zero, _CMP_GE_OQ),
                                                         _mm256_cmp_pd(xx, xsize, _CMP_LT_OQ)),
                                           _mm256_and_pd(_mm256_cmp_pd(yy, zero, _CMP_GE_OQ),
                                                         _mm256_cmp_pd(yy, ysize, _CMP_LT_OQ)));
            const int lanes = _mm256_movemask_pd(inside);
            if (!lanes)
                continue;
            xx = _mm256_sub_pd(xx, half);
            yy = _mm256_sub_pd(yy, half);
            const __m256d fx = _mm256_floor_pd(xx), fy = _mm256_floor_pd(yy);
            const __m256d dx = _mm256_sub_pd(xx, fx), dy = _mm256_sub_pd(yy, fy);
            const __m128i ix = _mm256_cvttpd_epi32(fx), iy = _mm256_cvttpd_epi32(fy);
            const __m128i x0 = _mm_min_epi32(_mm_max_epi32(ix, izero), wmax);
            const __m128i x1 = _mm_min_epi32(_mm_max_epi32(_mm_add_epi32(ix, ione), izero), wmax);
            const __m128i r0 = _mm_mullo_epi32(_mm_min_epi32(_mm_max_epi32(iy, izero), hmax), svec);
            const __m128i r1 = _mm_mullo_epi32(_mm_min_epi32(_mm_max_epi32(_mm_add_epi32(iy, ione), izero), hmax),
                                               svec);
            const __m128i c0 = _mm_mullo_epi32(x0, cvec), c1 = _mm_mullo_epi32(x1, cvec);
            const int *base = (const int *)in;
            const __m128i g00 = _mm_i32gather_epi32(base, _mm_add_epi32(r0, c0), 1);
            const __m128i g01 = _mm_i32gather_epi32(base, _mm_add_epi32(r0, c1), 1);
            const __m128i g10 = _mm_i32gather_epi32(base, _mm_add_epi32(r1, c0), 1);
            const __m128i g11 = _mm_i32gather_epi32(base, _mm_add_epi32(r1, c1), 1);
            __m128i packed = izero;
            for (int b = 0; b < c; b++) {
                const __m128i p00 = _mm_and_si128(_mm_srli_epi32(g00, 8 * b), byte);
                const __m128i p01 = _mm_and_si128(_mm_srli_epi32(g01, 8 * b), byte);
                const __m128i p10 = _mm_and_si128(_mm_srli_epi32(g10, 8 * b), byte);
                const __m128i p11 = _mm_and_si128(_mm_srli_epi32(g11, 8 * b), byte);
                __m256d v1 = _mm256_add_pd(_mm256_cvtepi32_pd(p00),
                                           _mm256_mul_pd(_mm256_cvtepi32_pd(_mm_sub_epi32(p01, p00)), dx));
                __m256d v2 = _mm256_add_pd(_mm256_cvtepi32_pd(p10),
                                           _mm256_mul_pd(_mm256_cvtepi32_pd(_mm_sub_epi32(p11, p10)), dx));
                v1 = _mm256_add_pd(v1, _mm256_mul_pd(_mm256_sub_pd(v2, v1), dy));
                packed = _mm_or_si128(packed, _mm_slli_epi32(_mm256_cvttpd_epi32(v1), 8 * b));
            }
            int values[4];
            _mm_storeu_si128((__m128i *)values, packed);
            for (int k = 0; k < 4; k++) {
                if (lanes >> k & 1) {
                    unsigned char *dst = o + (size_t)(x + k) * c;
                    dst[0] = (unsigned char)values[k];
                    if (c == 3) {
                        dst[1] = (unsigned char)(values[k] >> 8);
                        dst[2] = (unsigned char)(values[k] >> 16);
                    }
                }
            }
        }
        if (groups < w)
            bilinear_scalar(in, out, w, h, c, a, ax, ay, groups, y, y + 1);
    }
}
#endif

static int use_avx2 = -1; /* -1: not decided yet (the CPU's), 0 or 1 */

static int
avx2_on(void)
{
#ifdef HAVE_AVX2_PATH
    if (use_avx2 < 0)
        use_avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    return use_avx2;
#else
    return 0;
#endif
}

/* The bilinear engine: `padded` is NULL, or a copy of `in` with four bytes after it (the AVX2 path's gathers). */
static void
affine_bilinear(const unsigned char *in, const unsigned char *padded, unsigned char *out, int w, int h, int c,
                const double a[6], double *ax, double *ay)
{
    for (int x = 0; x < w; x++) {
        double xin = x + 0.5;
        ax[x] = a[0] * xin;
        ay[x] = a[3] * xin;
    }
#ifdef HAVE_AVX2_PATH
    if (padded != NULL) {
        if (c == 3)
            bilinear_avx2(padded, out, w, h, 3, a, ax, ay);
        else
            bilinear_avx2(padded, out, w, h, 1, a, ax, ay);
        return;
    }
#endif
    if (c == 3)
        bilinear_scalar(in, out, w, h, 3, a, ax, ay, 0, 0, h);
    else
        bilinear_scalar(in, out, w, h, 1, a, ax, ay, 0, 0, h);
}

static inline void
copy_pixel(unsigned char *o, const unsigned char *i, int c)
{
    o[0] = i[0];
    if (c == 3) {
        o[1] = i[1];
        o[2] = i[2];
    }
}

/* ImagingScaleAffine: no rotation or shear (a1 == a3 == 0), nearest. xintab is calloc'd as there. */
static void
affine_scale(const unsigned char *in, unsigned char *out, int w, int h, int c, const double a[6], int *xintab)
{
    double xo = a[2] + a[0] * 0.5, yo = a[5] + a[4] * 0.5;
    int xmin = w, xmax = 0;
    for (int x = 0; x < w; x++) {
        int xin = COORD(xo);
        if (xin >= 0 && xin < w) {
            xmax = x + 1;
            if (x < xmin)
                xmin = x;
            xintab[x] = xin;
        }
        xo += a[0];
    }
    const size_t stride = (size_t)w * c;
    for (int y = 0; y < h; y++) {
        int yi = COORD(yo);
        if (yi >= 0 && yi < h) {
            const unsigned char *row = in + (size_t)yi * stride;
            unsigned char *o = out + (size_t)y * stride;
            for (int x = xmin; x < xmax; x++)
                copy_pixel(o + (size_t)x * c, row + (size_t)xintab[x] * c, c);
        }
        yo += a[4];
    }
}

static inline int
check_fixed(const double a[6], int x, int y)
{
    return fabs(x * a[0] + y * a[1] + a[2]) < 32768.0 && fabs(x * a[3] + y * a[4] + a[5]) < 32768.0;
}

/* affine_fixed: nearest in 16.16 fixed point. */
static void
affine_fixed(const unsigned char *in, unsigned char *out, int w, int h, int c, const double a[6])
{
#define FIX(v) FLOOR((v) * 65536.0 + 0.5)
    const int a0 = FIX(a[0]), a1 = FIX(a[1]), a3 = FIX(a[3]), a4 = FIX(a[4]);
    int a2 = FIX(a[2] + a[0] * 0.5 + a[1] * 0.5), a5 = FIX(a[5] + a[3] * 0.5 + a[4] * 0.5);
#undef FIX
    const size_t stride = (size_t)w * c;
    for (int y = 0; y < h; y++) {
        int xx = a2, yy = a5;
        unsigned char *o = out + (size_t)y * stride;
        for (int x = 0; x < w; x++, o += c) {
            int xin = xx >> 16;
            if (xin >= 0 && xin < w) {
                int yin = yy >> 16;
                if (yin >= 0 && yin < h)
                    copy_pixel(o, in + (size_t)yin * stride + (size_t)xin * c, c);
            }
            xx += a0;
            yy += a3;
        }
        a2 += a1;
        a5 += a4;
    }
}

/* ImagingTransformAffine's last engine: nearest in doubles, where the corners leave fixed point's range. */
static void
affine_float(const unsigned char *in, unsigned char *out, int w, int h, int c, const double a[6])
{
    double xo = a[2] + a[1] * 0.5 + a[0] * 0.5, yo = a[5] + a[4] * 0.5 + a[3] * 0.5;
    const size_t stride = (size_t)w * c;
    for (int y = 0; y < h; y++) {
        double xx = xo, yy = yo;
        unsigned char *o = out + (size_t)y * stride;
        for (int x = 0; x < w; x++, o += c) {
            int xin = COORD(xx);
            if (xin >= 0 && xin < w) {
                int yin = COORD(yy);
                if (yin >= 0 && yin < h)
                    copy_pixel(o, in + (size_t)yin * stride + (size_t)xin * c, c);
            }
            xx += a[0];
            yy += a[3];
        }
        xo += a[1];
        yo += a[4];
    }
}

static PyObject *
affine(PyObject *self, PyObject *args)
{
    PyObject *source, *target;
    double a[6];
    int resample;
    Py_buffer fill;
    if (!PyArg_ParseTuple(args, "OO(dddddd)iy*", &source, &target, &a[0], &a[1], &a[2], &a[3], &a[4], &a[5],
                          &resample, &fill))
        return NULL;
    Pixels src, dst;
    if (get_pair(source, target, &src, &dst) < 0) {
        PyBuffer_Release(&fill);
        return NULL;
    }
    const int w = src.width, h = src.height, c = src.channels;
    const char *problem = NULL;
    if (resample != 0 && resample != 2)
        problem = "resample must be 0 (nearest) or 2 (bilinear)";
    else if (fill.len != c)
        problem = "fill must hold one byte per channel";
    else if (src.buffer.buf == dst.buffer.buf)
        problem = "out must not be the pixels";
    void *scratch = NULL;
    unsigned char *padded = NULL;
    const size_t bytes = (size_t)w * h * c;
    if (problem == NULL) {
        scratch = resample == 2 ? malloc(2 * (size_t)w * sizeof(double)) : calloc((size_t)w, sizeof(int));
        if (scratch != NULL && resample == 2 && avx2_on() && bytes + 4 < INT_MAX && (padded = malloc(bytes + 4)))
            memcpy(padded, src.buffer.buf, bytes); /* no copy (malloc failed): the scalar path */
        if (scratch == NULL) {
            PyBuffer_Release(&src.buffer);
            PyBuffer_Release(&dst.buffer);
            PyBuffer_Release(&fill);
            return PyErr_NoMemory();
        }
    }
    if (problem != NULL) {
        PyErr_SetString(PyExc_ValueError, problem);
    } else {
        const unsigned char *in = (const unsigned char *)src.buffer.buf, *f = (const unsigned char *)fill.buf;
        unsigned char *out = (unsigned char *)dst.buffer.buf;
        Py_BEGIN_ALLOW_THREADS
        const size_t pixels = (size_t)w * h;
        if (c == 1) {
            memset(out, f[0], pixels);
        } else {
            for (size_t i = 0; i < pixels; i++)
                copy_pixel(out + 3 * i, f, 3);
        }
        if (resample == 2)
            affine_bilinear(in, padded, out, w, h, c, a, (double *)scratch, (double *)scratch + w);
        else if (a[1] == 0 && a[3] == 0)
            affine_scale(in, out, w, h, c, a, (int *)scratch);
        else if (check_fixed(a, 0, 0) && check_fixed(a, w, h) && check_fixed(a, 0, h) && check_fixed(a, w, 0))
            affine_fixed(in, out, w, h, c, a);
        else
            affine_float(in, out, w, h, c, a);
        Py_END_ALLOW_THREADS
    }
    free(scratch);
    free(padded);
    PyBuffer_Release(&src.buffer);
    PyBuffer_Release(&dst.buffer);
    PyBuffer_Release(&fill);
    if (problem != NULL)
        return NULL;
    Py_RETURN_NONE;
}

/* ---- tables ------------------------------------------------------------------------------------------------ */

/* out = table[channel * 256 + v] (tables: 1, every channel the first; or c). */
static void
apply_tables(const unsigned char *in, unsigned char *out, size_t pixels, int c, const unsigned char *table,
             int tables)
{
    if (tables == 1 || c == 1) {
        const size_t n = pixels * c;
        for (size_t i = 0; i < n; i++)
            out[i] = table[in[i]];
        return;
    }
    const unsigned char *t0 = table, *t1 = table + 256, *t2 = table + 512;
    for (size_t i = 0; i < pixels; i++, in += 3, out += 3) {
        out[0] = t0[in[0]];
        out[1] = t1[in[1]];
        out[2] = t2[in[2]];
    }
}

static PyObject *
lut(PyObject *self, PyObject *args)
{
    PyObject *source, *target;
    Py_buffer table;
    if (!PyArg_ParseTuple(args, "OOy*", &source, &target, &table))
        return NULL;
    Pixels src, dst;
    if (get_pair(source, target, &src, &dst) < 0) {
        PyBuffer_Release(&table);
        return NULL;
    }
    int ok = table.len == 256 || table.len == 256 * src.channels;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "table must hold 256 bytes, or 256 per channel");
    } else {
        Py_BEGIN_ALLOW_THREADS
        apply_tables((const unsigned char *)src.buffer.buf, (unsigned char *)dst.buffer.buf,
                     (size_t)src.width * src.height, src.channels, (const unsigned char *)table.buf,
                     (int)(table.len / 256));
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src.buffer);
    PyBuffer_Release(&dst.buffer);
    PyBuffer_Release(&table);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* Image.convert("L") of an RGB row. Pillow's rgb2l: (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16 (L24).
 * pillow-simd's (flavour 1) takes four pixels at a time in SSE with 15-bit weights, (r * 9798 + g * 19235 +
 * b * 3735 + 0x4000) >> 15, and L24 for the last width % 4 of a row: the luma of a pixel depends on its column. */
static void
luma_row(const unsigned char *in, int w, int flavour, unsigned char *out)
{
    const int groups = flavour == 1 ? w / 4 * 4 : 0;
    int x = 0;
    for (; x < groups; x++, in += 3)
        out[x] = (unsigned char)(((unsigned int)in[0] * 9798 + (unsigned int)in[1] * 19235 +
                                  (unsigned int)in[2] * 3735 + 0x4000) >> 15);
    for (; x < w; x++, in += 3)
        out[x] = (unsigned char)(((unsigned int)in[0] * 19595 + (unsigned int)in[1] * 38470 +
                                  (unsigned int)in[2] * 7471 + 0x8000) >> 16);
}

static PyObject *
blend(PyObject *self, PyObject *args)
{
    PyObject *source, *target, *degenerate = Py_None;
    Py_buffer table;
    int flavour = 0;
    if (!PyArg_ParseTuple(args, "OOy*|Oi", &source, &target, &table, &degenerate, &flavour))
        return NULL;
    Pixels src, dst, deg;
    if (get_pair(source, target, &src, &dst) < 0) {
        PyBuffer_Release(&table);
        return NULL;
    }
    const char *problem = table.len != 65536 ? "table must hold 65536 bytes: entry d * 256 + v" : NULL;
    int held = 0;
    if (problem == NULL && degenerate != Py_None) {
        if (get_pixels(degenerate, &deg, 0) < 0) {
            PyBuffer_Release(&src.buffer);
            PyBuffer_Release(&dst.buffer);
            PyBuffer_Release(&table);
            return NULL;
        }
        held = 1;
        if (deg.height != src.height || deg.width != src.width ||
            (deg.channels != 1 && deg.channels != src.channels))
            problem = "degenerate must be H x W x 1 or of the pixels' shape";
    }
    unsigned char *lumas = NULL;
    if (problem == NULL && !held && src.channels == 3 && (lumas = malloc((size_t)src.width)) == NULL) {
        PyErr_NoMemory();
        problem = "";
    }
    if (problem != NULL) {
        if (*problem)
            PyErr_SetString(PyExc_ValueError, problem);
    } else {
        const unsigned char *in = (const unsigned char *)src.buffer.buf, *t = (const unsigned char *)table.buf;
        const unsigned char *d = held ? (const unsigned char *)deg.buffer.buf : NULL;
        unsigned char *out = (unsigned char *)dst.buffer.buf;
        const int w = src.width, h = src.height, c = src.channels, dc = held ? deg.channels : 1;
        const size_t pixels = (size_t)w * h;
        Py_BEGIN_ALLOW_THREADS
        if (c == 1) {
            for (size_t i = 0; i < pixels; i++)
                out[i] = t[(unsigned int)(d != NULL ? d[i] : in[i]) << 8 | in[i]];
        } else if (dc == 3) {
            for (size_t i = 0; i < 3 * pixels; i++)
                out[i] = t[(unsigned int)d[i] << 8 | in[i]];
        } else {
            for (int y = 0; y < h; y++) {
                const unsigned char *row_deg = d != NULL ? d + (size_t)y * w : lumas;
                if (d == NULL)
                    luma_row(in, w, flavour, lumas);
                for (int x = 0; x < w; x++, in += 3, out += 3) {
                    const unsigned char *pair = t + ((unsigned int)row_deg[x] << 8);
                    out[0] = pair[in[0]];
                    out[1] = pair[in[1]];
                    out[2] = pair[in[2]];
                }
            }
        }
        Py_END_ALLOW_THREADS
    }
    free(lumas);
    if (held)
        PyBuffer_Release(&deg.buffer);
    PyBuffer_Release(&src.buffer);
    PyBuffer_Release(&dst.buffer);
    PyBuffer_Release(&table);
    if (problem != NULL)
        return NULL;
    Py_RETURN_NONE;
}

/* ImageFilter.SMOOTH ((1 1 1, 1 5 1, 1 1 1) / 13) of an RGB image as pillow-simd runs it: ImagingFilter's
 * weights in 13-bit fixed point (each float weight * 8192, + 0.5, truncated: 630 and 3151), its integer 3x3
 * path (ImagingFilter3x3i_4u8: (4096 + the weighted sum) >> 13, saturated), the first and last row and column
 * copied, an image under 3 x 3 copied whole. Pillow's own filter rounds floats: the caller probes which it has. */
static inline __attribute__((always_inline)) void
smooth_rows(const unsigned char *in, unsigned char *out, int w, int h, int *column)
{
    const size_t stride = (size_t)w * 3;
    if (w < 3 || h < 3) {
        memcpy(out, in, stride * h);
        return;
    }
    int weights[2];
    const float kernel[2] = {1.0f / 13.0f, 5.0f / 13.0f};
    for (int i = 0; i < 2; i++) {
        float tmp = kernel[i] * (1 << 13);
        tmp += (tmp >= 0) ? 0.5 : -0.5;
        weights[i] = (int16_t)tmp;
    }
    const int edge = weights[0], centre = weights[1];
    memcpy(out, in, stride);
    memcpy(out + stride * (h - 1), in + stride * (h - 1), stride);
    for (int y = 1; y < h - 1; y++) {
        const unsigned char *up = in + stride * (y - 1), *row = in + stride * y, *down = in + stride * (y + 1);
        unsigned char *o = out + stride * y;
        for (size_t i = 0; i < stride; i++) /* the three rows' sum of each channel value: the ring is the */
            column[i] = up[i] + row[i] + down[i]; /* 3 x 3 sum less the centre, in integers as the weighted sum */
        memcpy(o, row, 3);
        memcpy(o + stride - 3, row + stride - 3, 3);
        for (size_t i = 3; i < stride - 3; i++) {
            const int ring = column[i - 3] + column[i] + column[i + 3] - row[i];
            const int v = (4096 + edge * ring + centre * row[i]) >> 13;
            o[i] = (unsigned char)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
}

#ifdef HAVE_AVX2_PATH
__attribute__((target("avx2"))) static void
smooth_avx2(const unsigned char *in, unsigned char *out, int w, int h, int *column)
{
    smooth_rows(in, out, w, h, column); /* the same integers, in 32-byte vectors where GCC finds them */
}
#endif

static void
smooth_rgb(const unsigned char *in, unsigned char *out, int w, int h, int *column)
{
#ifdef HAVE_AVX2_PATH
    if (avx2_on()) {
        smooth_avx2(in, out, w, h, column);
        return;
    }
#endif
    smooth_rows(in, out, w, h, column);
}

static PyObject *
smooth(PyObject *self, PyObject *args)
{
    PyObject *source, *target;
    if (!PyArg_ParseTuple(args, "OO", &source, &target))
        return NULL;
    Pixels src, dst;
    if (get_pair(source, target, &src, &dst) < 0)
        return NULL;
    const int ok = src.channels == 3 && src.buffer.buf != dst.buffer.buf;
    int *column = ok ? malloc((size_t)src.width * 3 * sizeof(int)) : NULL;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "smooth takes three channels, into another array");
    } else if (column == NULL) {
        PyErr_NoMemory();
    } else {
        Py_BEGIN_ALLOW_THREADS
        smooth_rgb((const unsigned char *)src.buffer.buf, (unsigned char *)dst.buffer.buf, src.width, src.height,
                   column);
        Py_END_ALLOW_THREADS
    }
    free(column);
    PyBuffer_Release(&src.buffer);
    PyBuffer_Release(&dst.buffer);
    if (column == NULL)
        return NULL;
    Py_RETURN_NONE;
}

/* ---- histograms --------------------------------------------------------------------------------------------- */

/* counts[channel * 256 + v]; with flavour 0 or 1 and three channels, the 256 of the luma (lumas: a row's room). */
static void
count_values(const unsigned char *in, int w, int h, int c, int flavour, unsigned char *lumas, int64_t *counts)
{
    const size_t pixels = (size_t)w * h;
    memset(counts, 0, (size_t)(flavour >= 0 ? 1 : c) * 256 * sizeof(int64_t));
    if (c == 1) {
        for (size_t i = 0; i < pixels; i++)
            counts[in[i]]++;
    } else if (flavour >= 0) {
        for (int y = 0; y < h; y++, in += (size_t)w * 3) {
            luma_row(in, w, flavour, lumas);
            for (int x = 0; x < w; x++)
                counts[lumas[x]]++;
        }
    } else {
        for (size_t i = 0; i < pixels; i++, in += 3) {
            counts[in[0]]++;
            counts[256 + in[1]]++;
            counts[512 + in[2]]++;
        }
    }
}

/* count_values over an argument, the GIL released; -1 with an error set. */
static int
count_pixels(PyObject *source, int flavour, int64_t *counts, int *channels, size_t *pixels)
{
    Pixels src;
    if (get_pixels(source, &src, 0) < 0)
        return -1;
    unsigned char *lumas = malloc((size_t)src.width);
    if (lumas == NULL) {
        PyBuffer_Release(&src.buffer);
        PyErr_NoMemory();
        return -1;
    }
    Py_BEGIN_ALLOW_THREADS
    count_values((const unsigned char *)src.buffer.buf, src.width, src.height, src.channels, flavour, lumas, counts);
    Py_END_ALLOW_THREADS
    free(lumas);
    *channels = flavour >= 0 ? 1 : src.channels;
    *pixels = (size_t)src.width * src.height;
    PyBuffer_Release(&src.buffer);
    return 0;
}

static PyObject *
histogram(PyObject *self, PyObject *args)
{
    PyObject *source;
    int flavour = -1;
    if (!PyArg_ParseTuple(args, "O|i", &source, &flavour))
        return NULL;
    int64_t counts[3 * 256];
    int channels;
    size_t pixels;
    if (count_pixels(source, flavour, counts, &channels, &pixels) < 0)
        return NULL;
    PyObject *out = PyList_New(channels * 256);
    for (int i = 0; out != NULL && i < channels * 256; i++) {
        PyObject *v = PyLong_FromLongLong(counts[i]);
        if (v == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

static PyObject *
gray_mean(PyObject *self, PyObject *args)
{
    PyObject *source;
    int flavour = 0;
    if (!PyArg_ParseTuple(args, "O|i", &source, &flavour))
        return NULL;
    int64_t counts[3 * 256];
    int channels;
    size_t pixels;
    if (count_pixels(source, flavour < 0 ? 0 : flavour, counts, &channels, &pixels) < 0)
        return NULL;
    /* ImageStat: a float sum of j * h[j] (exact: integers below 2**53), over the count, + 0.5, truncated */
    int64_t sum = 0;
    for (int j = 0; j < 256; j++)
        sum += j * counts[j];
    return PyLong_FromLong((long)((double)sum / (double)pixels + 0.5));
}

/* ImageOps.autocontrast's table of one channel's histogram (cutoff 0, no ignore). */
static void
autocontrast_table(const int64_t *h, unsigned char *table)
{
    int lo, hi;
    for (lo = 0; lo < 255 && !h[lo]; lo++)
        ;
    for (hi = 255; hi > 0 && !h[hi]; hi--)
        ;
    if (hi <= lo) {
        for (int i = 0; i < 256; i++)
            table[i] = (unsigned char)i;
        return;
    }
    const double scale = 255.0 / (hi - lo), offset = -lo * scale;
    for (int i = 0; i < 256; i++) {
        double v = i * scale + offset; /* int() truncates toward zero, as the cast */
        int ix = v < 0.0 ? 0 : v > 255.0 ? 255 : (int)v;
        table[i] = (unsigned char)ix;
    }
}

/* ImageOps.equalize's table of one channel's histogram. */
static void
equalize_table(const int64_t *h, unsigned char *table)
{
    int64_t total = 0, last = 0;
    int nonzero = 0;
    for (int i = 0; i < 256; i++) {
        if (h[i]) {
            total += h[i];
            last = h[i];
            nonzero++;
        }
    }
    const int64_t step = nonzero > 1 ? (total - last) / 255 : 0;
    if (!step) {
        for (int i = 0; i < 256; i++)
            table[i] = (unsigned char)i;
        return;
    }
    int64_t n = step / 2;
    for (int i = 0; i < 256; i++) {
        const int64_t v = n / step; /* above 255 where the top bin is full: Image.point clips (CLIP8) */
        table[i] = (unsigned char)(v > 255 ? 255 : v);
        n += h[i];
    }
}

static PyObject *
tabled(PyObject *args, void (*make)(const int64_t *, unsigned char *))
{
    PyObject *source, *target;
    if (!PyArg_ParseTuple(args, "OO", &source, &target))
        return NULL;
    Pixels src, dst;
    if (get_pair(source, target, &src, &dst) < 0)
        return NULL;
    const int c = src.channels;
    const size_t pixels = (size_t)src.width * src.height;
    Py_BEGIN_ALLOW_THREADS
    int64_t counts[3 * 256];
    unsigned char table[3 * 256];
    count_values((const unsigned char *)src.buffer.buf, src.width, src.height, c, -1, NULL, counts);
    for (int b = 0; b < c; b++)
        make(counts + 256 * b, table + 256 * b);
    apply_tables((const unsigned char *)src.buffer.buf, (unsigned char *)dst.buffer.buf, pixels, c, table, c);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src.buffer);
    PyBuffer_Release(&dst.buffer);
    Py_RETURN_NONE;
}

static PyObject *
autocontrast(PyObject *self, PyObject *args)
{
    return tabled(args, autocontrast_table);
}

static PyObject *
equalize(PyObject *self, PyObject *args)
{
    return tabled(args, equalize_table);
}

static PyObject *
simd(PyObject *self, PyObject *args)
{
    int enable = -1;
    if (!PyArg_ParseTuple(args, "|i", &enable))
        return NULL;
    if (enable == 0)
        use_avx2 = 0;
    else if (enable > 0)
        use_avx2 = -1; /* the CPU's again */
    return PyLong_FromLong(avx2_on());
}

static PyMethodDef methods[] = {
    {"affine", affine, METH_VARARGS,
     "affine(pixels, out, matrix, resample, fill) -> None\n\n"
     "Image.transform(size, AFFINE, matrix, resample, fillcolor=fill) into out (the pixels' shape): resample 0 "
     "(nearest) or 2 (bilinear), fill one byte per channel."},
    {"lut", lut, METH_VARARGS,
     "lut(pixels, out, table) -> None\n\nImage.point: out = table[v], 256 bytes for every channel or 256 per "
     "channel (channel-major)."},
    {"blend", blend, METH_VARARGS,
     "blend(pixels, out, table, degenerate=None, flavour=0) -> None\n\nout = table[d * 256 + v], d from degenerate "
     "(H x W x 1 or the pixels' shape), or None: the luma of the pixels as Image.convert('L') makes it (flavour 0 "
     "Pillow's, 1 pillow-simd's)."},
    {"histogram", histogram, METH_VARARGS,
     "histogram(pixels, flavour=-1) -> list\n\nImage.histogram(): 256 counts per channel; with flavour 0 or 1, "
     "those of convert('L')."},
    {"gray_mean", gray_mean, METH_VARARGS,
     "gray_mean(pixels, flavour=0) -> int\n\nint(ImageStat.Stat(image.convert('L')).mean[0] + 0.5)."},
    {"autocontrast", autocontrast, METH_VARARGS,
     "autocontrast(pixels, out) -> None\n\nImageOps.autocontrast(image) into out."},
    {"equalize", equalize, METH_VARARGS, "equalize(pixels, out) -> None\n\nImageOps.equalize(image) into out."},
    {"smooth", smooth, METH_VARARGS,
     "smooth(pixels, out) -> None\n\nImage.filter(ImageFilter.SMOOTH) of RGB pixels as pillow-simd computes it "
     "(13-bit integer weights)."},
    {"simd", simd, METH_VARARGS,
     "simd(enable=-1) -> int\n\nWhether the bilinear affine and smooth run on AVX2 (1) or plain C (0), after "
     "turning that off (0) or back on where the CPU has it (1) when asked (process-wide: for tests and benchmarks, "
     "both give the same pixels)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_augment",
    "The automatic-augmentation sub-ops over uint8 arrays, Pillow's pixels, without the GIL.", -1, methods,
};

PyMODINIT_FUNC
PyInit__augment(void)
{
    return PyModule_Create(&module);
}
