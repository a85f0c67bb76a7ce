/* feedfast._native: the threaded CPU path's hot spots in C (decoding and normalize without the GIL).
 *
 * decode_region: decode only a region of a JPEG, with libjpeg-turbo.
 *
 * Pillow decodes a JPEG whole (or down to a row, feedfast.loader.backends.cpu.pil_fast.load_rows). A random
 * resized crop reads a part of it: libjpeg-turbo's jpeg_skip_scanlines (rows above the region:
 * entropy-decoded, not transformed) and jpeg_crop_scanline (columns outside it: no inverse DCT,
 * no upsampling, no colour conversion) leave the rest out, as DALI's ROI decoding does. Rows
 * below the region are never read. Pixels inside the region equal a full decode's (libjpeg's
 * default islow IDCT and fancy upsampling, as Pillow uses), except in the region's outermost
 * ring, where the upsampler lacks its neighbours: callers ask for a margin around what they read
 * (tests/test_native.py checks both).
 *
 * decode_region(data, denom, left, top, right, bottom, gray) -> (pixels, left, top, width, height)
 *
 *   data: the JPEG file's bytes (any buffer).
 *   denom: DCT scaling 1, 2, 4 or 8 (Pillow's draft); the coordinates are in the scaled image.
 *   left, top, right, bottom: the region wanted, clamped to the image (one pixel at least); left
 *       may move left to an iMCU boundary and the width grow (jpeg_crop_scanline), so the region
 *       returned holds it.
 *   gray: decode to one channel (JCS_GRAYSCALE), else four (RGBX, X undefined).
 *   Returns the pixels (bytes: `height` rows of width * channels, then one row of slack) and the
 *       region they cover.
 *   Raises ValueError with libjpeg's message on an error or a warning (corrupt data, a
 *   premature end inside the region, an unsupported colour space): the caller decides.
 *
 * jpeg_header(data) -> (width, height, components, colour space): the frame header libjpeg reads
 *   (jpeg_read_header), in a few microseconds; ValueError with libjpeg's message when it cannot.
 *   Colour space: libjpeg's J_COLOR_SPACE (1 grey, 2 RGB, 3 YCbCr, 4 CMYK, 5 YCCK).
 *
 * normalize_into(pixels, out, mean, inv, chw): normalize's arithmetic in one pass.
 *
 *   pixels: uint8 H x W x C, any strides (a reversed view for a flip, RGBX with its fourth byte
 *       left out); out: C-contiguous float32, C x H x W (chw) or H x W x C; mean, inv: C float32
 *       each. out = ((float)pixel - mean) * inv, rounded as NumPy rounds the same two float32
 *       operations (the build keeps the compiler from fusing them), so equal bit for bit.
 *
 * Built with -ljpeg against libjpeg-turbo's headers (1.5.1 or later); setup.py marks the
 * extension optional, and feedfast runs these in Pillow and NumPy where it did not build.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

#include "_mix.h"
#include "_raws.h"
#include "_resample.h"
#include "_resample_simd.h"

#ifndef LIBJPEG_TURBO_VERSION
#error "feedfast._native needs libjpeg-turbo's jpeglib.h (jpeg_crop_scanline, jpeg_skip_scanlines)"
#endif

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
    int failed;
} ErrorManager;

static void
error_exit(j_common_ptr cinfo)
{
    ErrorManager *err = (ErrorManager *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    err->failed = 1;
    longjmp(err->jump, 1);
}

static void
emit_message(j_common_ptr cinfo, int level)
{
    ErrorManager *err = (ErrorManager *)cinfo->err;
    if (level < 0 && !err->failed) { /* a warning: corrupt data; refused, so nothing doubtful is delivered */
        (*cinfo->err->format_message)(cinfo, err->message);
        err->failed = 1;
    }
}

static JDIMENSION
clamp(unsigned long value, JDIMENSION limit)
{
    return value > limit ? limit : (JDIMENSION)value;
}

/* Where decode_rows puts the pixels: `allocate` gives the buffer once the region's size is known (NULL when it
 * cannot, the decode then stops); the region decoded comes back in the other fields. */
typedef struct {
    unsigned char *(*allocate)(void *context, size_t size);
    void *context;
    JDIMENSION left, top, width, rows;
    unsigned char *pixels;
} RegionRows;

/* decode_region's work, without the GIL: the rows of the region (clamped, widened as libjpeg-turbo's crop
 * needs) into `height` rows of width * channels bytes, then one row of slack. Returns with err->failed set and
 * libjpeg's message on an error or a warning, else with region->pixels NULL when allocate gave none. */
static void
decode_rows(const Py_buffer *data, unsigned int denom, unsigned long left, unsigned long top, unsigned long right,
            unsigned long bottom, int gray, RegionRows *region, ErrorManager *err)
{
    struct jpeg_decompress_struct cinfo;
    memset(&cinfo, 0, sizeof cinfo); /* jpeg_destroy_decompress is then safe whatever failed */
    memset(err, 0, sizeof *err);
    cinfo.err = jpeg_std_error(&err->pub);
    err->pub.error_exit = error_exit;
    err->pub.emit_message = emit_message;
    region->pixels = NULL;
    const int channels = gray ? 1 : 4;

    if (setjmp(err->jump) == 0) {
        jpeg_create_decompress(&cinfo); /* inside: it may fail (memory) through error_exit */
        jpeg_mem_src(&cinfo, (const unsigned char *)data->buf, (unsigned long)data->len);
        jpeg_read_header(&cinfo, TRUE);
        cinfo.scale_num = 1;
        cinfo.scale_denom = denom;
        cinfo.out_color_space = gray ? JCS_GRAYSCALE : JCS_EXT_RGBX;
        jpeg_start_decompress(&cinfo);
        JDIMENSION w = cinfo.output_width, h = cinfo.output_height;
        JDIMENSION x1 = clamp(right, w), y1 = clamp(bottom, h); /* at least one pixel: w, h >= 1 */
        if (x1 == 0)
            x1 = 1;
        if (y1 == 0)
            y1 = 1;
        JDIMENSION xs = clamp(left, x1 - 1), ys = clamp(top, y1 - 1);
        JDIMENSION cw = x1 - xs;
        if (xs > 0 || cw < w)
            jpeg_crop_scanline(&cinfo, &xs, &cw);
        if (ys > 0 && (jpeg_skip_scanlines(&cinfo, ys) != ys || cinfo.output_scanline != ys) && !err->failed) {
            strcpy(err->message, "too few rows skipped");
            err->failed = 1;
        }
        region->left = xs, region->width = cw, region->top = ys, region->rows = y1 - ys;
        if (!err->failed) {
            /* one row of slack: Pillow maps a window of it with a stride only if a whole last stride fits */
            region->pixels = region->allocate(region->context, (size_t)cw * channels * (y1 - ys + 1));
            if (region->pixels != NULL) {
                size_t stride = (size_t)cw * channels;
                while (cinfo.output_scanline < y1 && !err->failed) {
                    JSAMPROW row = region->pixels + stride * (cinfo.output_scanline - ys);
                    if (jpeg_read_scanlines(&cinfo, &row, 1) != 1)
                        break;
                }
                if (cinfo.output_scanline < y1 && !err->failed) {
                    strcpy(err->message, "too few rows decoded");
                    err->failed = 1;
                }
            }
        }
    }
    jpeg_destroy_decompress(&cinfo);
}

typedef struct {
    PyThreadState *saved;
    PyObject *pixels;
} BytesContext;

/* decode_region's buffer: a bytes object, made with the GIL taken back for it. */
static unsigned char *
allocate_bytes(void *context, size_t size)
{
    BytesContext *bytes = (BytesContext *)context;
    PyEval_RestoreThread(bytes->saved);
    bytes->pixels = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    bytes->saved = PyEval_SaveThread();
    return bytes->pixels != NULL ? (unsigned char *)PyBytes_AS_STRING(bytes->pixels) : NULL;
}

static PyObject *
decode_region(PyObject *self, PyObject *args)
{
    Py_buffer data;
    unsigned int denom;
    unsigned long left, top, right, bottom;
    int gray;
    if (!PyArg_ParseTuple(args, "y*Ikkkkp", &data, &denom, &left, &top, &right, &bottom, &gray))
        return NULL;
    if (denom != 1 && denom != 2 && denom != 4 && denom != 8) {
        PyBuffer_Release(&data);
        return PyErr_Format(PyExc_ValueError, "denom must be 1, 2, 4 or 8, got %u", denom);
    }
    ErrorManager err;
    BytesContext bytes = {NULL, NULL};
    RegionRows region = {allocate_bytes, &bytes, 0, 0, 0, 0, NULL};
    bytes.saved = PyEval_SaveThread();
    decode_rows(&data, denom, left, top, right, bottom, gray, &region, &err);
    PyEval_RestoreThread(bytes.saved);
    PyBuffer_Release(&data);
    if (bytes.pixels == NULL && !err.failed)
        return NULL; /* the allocation failed: MemoryError is set */
    if (err.failed) {
        Py_XDECREF(bytes.pixels);
        PyErr_SetString(PyExc_ValueError, err.message);
        return NULL;
    }
    return Py_BuildValue("(NIIII)", bytes.pixels, (unsigned int)region.left, (unsigned int)region.top,
                         (unsigned int)region.width, (unsigned int)region.rows);
}

/* One row of three interleaved channels (``pixel`` bytes apart) into three float planes. Inlined with a
 * constant ``pixel``, the loop vectorizes; the arithmetic is NumPy's: (float)v - mean, then * inv. */
static inline __attribute__((always_inline)) void
planes3(const unsigned char *row, const int pixel, Py_ssize_t w, float *o0, float *o1, float *o2, const float *m,
        const float *k)
{
    const float m0 = m[0], m1 = m[1], m2 = m[2], k0 = k[0], k1 = k[1], k2 = k[2];
    for (Py_ssize_t x = 0; x < w; x++) {
        const unsigned char *p = row + x * pixel;
        o0[x] = ((float)p[0] - m0) * k0;
        o1[x] = ((float)p[1] - m1) * k1;
        o2[x] = ((float)p[2] - m2) * k2;
    }
}

#define FLIP_MAX 2048 /* widest row the flip path buffers; wider ones take the generic loop */

/* Copy a row of floats reversed (the second half of a horizontal flip). */
static inline void
reversed_copy(float *restrict out, const float *restrict row, Py_ssize_t w)
{
    for (Py_ssize_t x = 0; x < w; x++)
        out[x] = row[w - 1 - x];
}

static PyObject *
normalize_into(PyObject *self, PyObject *args)
{
    PyObject *source;
    Py_buffer src, dst, mean, inv;
    int chw;
    if (!PyArg_ParseTuple(args, "Ow*y*y*p", &source, &dst, &mean, &inv, &chw))
        return NULL;
    if (PyObject_GetBuffer(source, &src, PyBUF_STRIDED_RO) < 0) /* any strides: flips, RGBX */
        goto fail_dst;
    const char *problem = NULL;
    if (src.ndim != 3 || src.itemsize != 1)
        problem = "pixels must be uint8 H x W x C";
    else if (dst.len != (Py_ssize_t)(src.shape[0] * src.shape[1] * src.shape[2] * sizeof(float)))
        problem = "out must be float32 with the pixels' element count";
    else if (mean.len != (Py_ssize_t)(src.shape[2] * sizeof(float)) || inv.len != mean.len)
        problem = "mean and inv must be float32, one per channel";
    if (problem != NULL) {
        PyErr_SetString(PyExc_ValueError, problem);
        PyBuffer_Release(&src);
        goto fail_dst;
    }
    const Py_ssize_t h = src.shape[0], w = src.shape[1], c = src.shape[2];
    const Py_ssize_t sy = src.strides[0], sx = src.strides[1], sc = src.strides[2];
    const unsigned char *in = (const unsigned char *)src.buf;
    float *out = (float *)dst.buf;
    const float *m = (const float *)mean.buf, *k = (const float *)inv.buf;
    Py_BEGIN_ALLOW_THREADS
    if (chw && c == 3 && sc == 1 && (sx == 4 || sx == 3)) { /* the usual case: RGBX or RGB rows, read once */
        for (Py_ssize_t y = 0; y < h; y++) {
            float *o = out + y * w;
            if (sx == 4)
                planes3(in + y * sy, 4, w, o, o + h * w, o + 2 * h * w, m, k);
            else
                planes3(in + y * sy, 3, w, o, o + h * w, o + 2 * h * w, m, k);
        }
    } else if (chw && c == 3 && sc == 1 && (sx == -4 || sx == -3) && w <= FLIP_MAX) { /* a horizontal flip */
        float buffer[3][FLIP_MAX]; /* the row read forwards in memory (vectorized), then copied reversed */
        for (Py_ssize_t y = 0; y < h; y++) {
            float *o = out + y * w;
            const unsigned char *low = in + y * sy + (w - 1) * sx;
            if (sx == -4)
                planes3(low, 4, w, buffer[0], buffer[1], buffer[2], m, k);
            else
                planes3(low, 3, w, buffer[0], buffer[1], buffer[2], m, k);
            reversed_copy(o, buffer[0], w);
            reversed_copy(o + h * w, buffer[1], w);
            reversed_copy(o + 2 * h * w, buffer[2], w);
        }
    } else {
        for (Py_ssize_t y = 0; y < h; y++) {
            for (Py_ssize_t x = 0; x < w; x++) {
                const unsigned char *p = in + y * sy + x * sx;
                for (Py_ssize_t ch = 0; ch < c; ch++) {
                    float v = (float)p[ch * sc] - m[ch];
                    out[chw ? (ch * h + y) * w + x : (y * w + x) * c + ch] = v * k[ch];
                }
            }
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&mean);
    PyBuffer_Release(&inv);
    Py_RETURN_NONE;
fail_dst:
    PyBuffer_Release(&dst);
    PyBuffer_Release(&mean);
    PyBuffer_Release(&inv);
    return NULL;
}

static PyObject *
jpeg_header(PyObject *self, PyObject *args)
{
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data))
        return NULL;
    struct jpeg_decompress_struct cinfo;
    ErrorManager err;
    memset(&cinfo, 0, sizeof cinfo);
    memset(&err, 0, sizeof err);
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = error_exit;
    err.pub.emit_message = emit_message;
    PyObject *result = NULL;
    if (setjmp(err.jump) == 0) {
        jpeg_create_decompress(&cinfo);
        jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
        jpeg_read_header(&cinfo, TRUE);
        if (!err.failed)
            result = Py_BuildValue("(IIii)", (unsigned int)cinfo.image_width, (unsigned int)cinfo.image_height,
                                   cinfo.num_components, (int)cinfo.jpeg_color_space);
    }
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&data);
    if (result == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, err.message[0] ? err.message : "not a JPEG header");
    return result;
}

/* ---- resample_into and sample_into: Pillow's resize (feedfast/_resample.c), flips and normalize, in one call ---- */

enum { OUT_UINT8, OUT_FLOAT32, OUT_FLOAT16 };

/* Where a resized image goes: a C-contiguous array, uint8 H x W x C, or normalized float32 or float16,
 * C x H x W (chw) or H x W x C; C is 1 for 1-byte pixels, 3 for 4-byte ones (the fourth byte dropped). */
typedef struct {
    Py_buffer buffer;
    int kind, chw, width, height, channels;
    float mean[3], inv[3];
} Output;

/* float32 -> float16 bits, rounded to nearest even as NumPy's astype and torch's .to(float16) round
 * (F. Giesen's float_to_half_fast3_rtne; NaN becomes a quiet NaN of the same sign). */
static inline uint16_t
half_bits(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    const uint32_t sign = bits & 0x80000000u;
    bits ^= sign;
    uint16_t half;
    if (bits >= (127u + 16u) << 23) { /* 65536 and above: infinity (or NaN) */
        half = bits > 255u << 23 ? 0x7e00 : 0x7c00;
    } else if (bits < 113u << 23) { /* below 2 ** -14: a subnormal half, the float addition rounds */
        const uint32_t magic_bits = ((127u - 15u) + (23u - 10u) + 1u) << 23;
        float magic, shifted;
        memcpy(&magic, &magic_bits, sizeof magic);
        memcpy(&shifted, &bits, sizeof shifted);
        shifted += magic;
        memcpy(&bits, &shifted, sizeof bits);
        half = (uint16_t)(bits - magic_bits);
    } else {
        const uint32_t odd = (bits >> 13) & 1u;
        bits += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
        half = (uint16_t)(bits >> 13);
    }
    return half | (uint16_t)(sign >> 16);
}

/* The out, mean and inv arguments of resample_into and sample_into, checked against a `pixel`-byte image. */
static int
parse_output(PyObject *out, PyObject *mean, PyObject *inv, int chw, int pixel, Output *o)
{
    memset(o, 0, sizeof *o);
    if (PyObject_GetBuffer(out, &o->buffer, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    const char *format = o->buffer.format != NULL ? o->buffer.format : "B";
    if (*format == '<' || *format == '=' || *format == '@' || *format == '|')
        format++;
    const char *problem = NULL;
    o->kind = strcmp(format, "B") == 0 ? OUT_UINT8 : strcmp(format, "f") == 0 ? OUT_FLOAT32
            : strcmp(format, "e") == 0 ? OUT_FLOAT16 : -1;
    o->chw = chw;
    int channels = pixel == 4 ? 3 : 1;
    if (o->kind < 0)
        problem = "out must be uint8, float32 or float16";
    else if (o->buffer.ndim != 3)
        problem = "out must have three dimensions: H x W x C, or C x H x W with chw";
    else if ((o->kind == OUT_UINT8) != (mean == Py_None && inv == Py_None))
        problem = "mean and inv go with a float out (normalized), None with a uint8 out";
    else if (o->kind == OUT_UINT8 && chw)
        problem = "a uint8 out is H x W x C (chw is for normalized outs)";
    if (problem == NULL) {
        const Py_ssize_t *shape = o->buffer.shape;
        Py_ssize_t c = chw ? shape[0] : shape[2], h = chw ? shape[1] : shape[0], w = chw ? shape[2] : shape[1];
        if (c != channels)
            problem = pixel == 4 ? "out must have 3 channels for 4-byte pixels" : "out must have 1 channel for "
                                                                                  "1-byte pixels";
        else if (h < 1 || w < 1 || h > INT_MAX || w > INT_MAX)
            problem = "out must be one pixel at least";
        o->channels = channels, o->height = (int)h, o->width = (int)w;
    }
    if (problem == NULL && o->kind != OUT_UINT8) {
        Py_buffer values[2];
        PyObject *given[2] = {mean, inv};
        for (int i = 0; i < 2 && problem == NULL; i++) {
            if (PyObject_GetBuffer(given[i], &values[i], PyBUF_C_CONTIGUOUS) < 0) {
                PyBuffer_Release(&o->buffer);
                if (i == 1)
                    PyBuffer_Release(&values[0]);
                return -1;
            }
            if (values[i].len != (Py_ssize_t)(channels * sizeof(float)))
                problem = "mean and inv must be float32, one per channel";
            else
                memcpy(i == 0 ? o->mean : o->inv, values[i].buf, channels * sizeof(float));
            PyBuffer_Release(&values[i]);
        }
    }
    if (problem != NULL) {
        PyErr_SetString(PyExc_ValueError, problem);
        PyBuffer_Release(&o->buffer);
        return -1;
    }
    return 0;
}

/* `image` (o->width x o->height) into the output, flipped as asked, normalized for a float out: out =
 * ((float)pixel - mean) * inv, normalize_into's arithmetic (ff_normalized_row, on SIMD where the CPU has it,
 * as ff_rgb_row). `row` holds width * channels floats. */
static void
emit(const FFImage *image, const Output *o, int hflip, int vflip, float *row)
{
    const int w = o->width, h = o->height, c = o->channels, pixel = image->pixel;
    unsigned char *base = (unsigned char *)o->buffer.buf;
    for (int y = 0; y < h; y++) {
        const unsigned char *in = image->data + (ptrdiff_t)(vflip ? h - 1 - y : y) * image->stride;
        if (o->kind == OUT_UINT8) {
            unsigned char *dst = base + (size_t)y * w * c;
            if (pixel == 1 && !hflip) {
                memcpy(dst, in, (size_t)w);
            } else if (pixel == 1) {
                for (int x = 0; x < w; x++)
                    dst[x] = in[w - 1 - x];
            } else {
                ff_rgb_row(in, dst, w, hflip);
            }
            continue;
        }
        float *planes[3];
        const int direct = o->chw && o->kind == OUT_FLOAT32; /* the planes are rows of the out */
        for (int ch = 0; ch < c; ch++)
            planes[ch] = direct ? (float *)base + ((size_t)ch * h + y) * w : row + (size_t)ch * w;
        ff_normalized_row(in, pixel, w, hflip, o->mean, o->inv, planes);
        for (int ch = 0; ch < c && !direct; ch++) { /* float16 planes, or float32 or float16 H x W x C */
            const float *values = planes[ch];
            if (o->chw) {
                uint16_t *dst = (uint16_t *)base + ((size_t)ch * h + y) * w;
                for (int x = 0; x < w; x++)
                    dst[x] = half_bits(values[x]);
            } else if (o->kind == OUT_FLOAT32) {
                float *dst = (float *)base + (size_t)y * w * c + ch;
                for (int x = 0; x < w; x++)
                    dst[(ptrdiff_t)x * c] = values[x];
            } else {
                uint16_t *dst = (uint16_t *)base + (size_t)y * w * c + ch;
                for (int x = 0; x < w; x++)
                    dst[(ptrdiff_t)x * c] = half_bits(values[x]);
            }
        }
    }
}

/* ff_resize, then emit; the GIL is not held. Returns FF_OK, FF_NOMEM, or FF_INVALID with *message. */
static int
resize_and_emit(const FFImage *src, int filter, const double box[4], double reducing_gap, int flavour, int hflip,
                int vflip, const Output *o, const char **message)
{
    FFResized resized;
    int status = ff_resize(src, o->width, o->height, filter, box, reducing_gap, flavour, &resized, message);
    if (status != FF_OK)
        return status;
    float *row = o->kind == OUT_UINT8 ? NULL : malloc((size_t)o->width * o->channels * sizeof(float));
    if (o->kind != OUT_UINT8 && row == NULL)
        status = FF_NOMEM;
    else
        emit(&resized.image, o, hflip, vflip, row);
    free(row);
    ff_resized_free(&resized);
    return status;
}

static PyObject *
resize_error(int status, const char *message)
{
    if (status == FF_NOMEM)
        return PyErr_NoMemory();
    PyErr_SetString(PyExc_ValueError, message);
    return NULL;
}

static PyObject *
resample_into(PyObject *self, PyObject *args)
{
    Py_buffer src;
    int width, height, pixel, filter, hflip, vflip, chw, flavour;
    Py_ssize_t stride;
    double box[4], reducing_gap;
    PyObject *out, *mean, *inv;
    if (!PyArg_ParseTuple(args, "y*iiin(dddd)idppOOOpi", &src, &width, &height, &pixel, &stride, &box[0], &box[1],
                          &box[2], &box[3], &filter, &reducing_gap, &hflip, &vflip, &out, &mean, &inv, &chw, &flavour))
        return NULL;
    const char *problem = NULL;
    if (pixel != 1 && pixel != 4)
        problem = "pixel must be 1 (L) or 4 (RGB, RGBX) bytes";
    else if (width < 1 || height < 1)
        problem = "the image must be one pixel at least";
    else if (stride < (Py_ssize_t)width * pixel || (height - 1) > (src.len - (Py_ssize_t)width * pixel) / stride ||
             src.len < (Py_ssize_t)width * pixel)
        problem = "pixels must hold height rows of stride bytes (the last one width * pixel)";
    Output o;
    if (problem != NULL) {
        PyErr_SetString(PyExc_ValueError, problem);
        PyBuffer_Release(&src);
        return NULL;
    }
    if (parse_output(out, mean, inv, chw, pixel, &o) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    FFImage image = {(const unsigned char *)src.buf, stride, width, height, pixel};
    const char *message = NULL;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = resize_and_emit(&image, filter, box, reducing_gap, flavour, hflip, vflip, &o, &message);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&o.buffer);
    PyBuffer_Release(&src);
    if (status != FF_OK)
        return resize_error(status, message);
    Py_RETURN_NONE;
}

static unsigned char *
allocate_memory(void *context, size_t size)
{
    return (unsigned char *)malloc(size);
}

/* The `window` (left, top, right, bottom; cut to what `region` holds) of a decoded region, its `box` (in the
 * same coordinates) made relative to the window and clamped to it, resized and emitted into `o`; the GIL is not
 * held. Returns FF_OK, FF_NOMEM, or FF_INVALID with *message. */
static int
resize_window(const RegionRows *region, const long window[4], const double box[4], int gray, int filter, double gap,
              int flavour, int hflip, int vflip, const Output *o, const char **message)
{
    const int pixel = gray ? 1 : 4;
    long x0 = window[0] > (long)region->left ? window[0] : (long)region->left;
    long y0 = window[1] > (long)region->top ? window[1] : (long)region->top;
    long x1 = window[2] < (long)(region->left + region->width) ? window[2] : (long)(region->left + region->width);
    long y1 = window[3] < (long)(region->top + region->rows) ? window[3] : (long)(region->top + region->rows);
    if (x1 <= x0 || y1 <= y0) {
        *message = "the window holds no pixel of the region decoded";
        return FF_INVALID;
    }
    const ptrdiff_t stride = (ptrdiff_t)region->width * pixel;
    FFImage image = {region->pixels + (y0 - (long)region->top) * stride + (x0 - (long)region->left) * pixel, stride,
                     (int)(x1 - x0), (int)(y1 - y0), pixel};
    double relative[4] = {box[0] - x0, box[1] - y0, box[2] - x0, box[3] - y0};
    relative[0] = relative[0] > 0.0 ? relative[0] : 0.0;
    relative[1] = relative[1] > 0.0 ? relative[1] : 0.0;
    relative[2] = relative[2] < (double)image.width ? relative[2] : (double)image.width;
    relative[3] = relative[3] < (double)image.height ? relative[3] : (double)image.height;
    return resize_and_emit(&image, filter, relative, gap, flavour, hflip, vflip, o, message);
}

static PyObject *
sample_into(PyObject *self, PyObject *args)
{
    Py_buffer data;
    unsigned int denom;
    unsigned long left, top, right, bottom;
    long window[4];
    int gray, filter, hflip, vflip, chw, flavour;
    double box[4], reducing_gap;
    PyObject *out, *mean, *inv;
    if (!PyArg_ParseTuple(args, "y*Ip(kkkk)(llll)(dddd)idppOOOpi", &data, &denom, &gray, &left, &top, &right,
                          &bottom, &window[0], &window[1], &window[2], &window[3], &box[0], &box[1], &box[2],
                          &box[3], &filter, &reducing_gap, &hflip, &vflip, &out, &mean, &inv, &chw, &flavour))
        return NULL;
    Output o;
    if (denom != 1 && denom != 2 && denom != 4 && denom != 8) {
        PyBuffer_Release(&data);
        return PyErr_Format(PyExc_ValueError, "denom must be 1, 2, 4 or 8, got %u", denom);
    }
    if (parse_output(out, mean, inv, chw, gray ? 1 : 4, &o) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    ErrorManager err;
    RegionRows region = {allocate_memory, NULL, 0, 0, 0, 0, NULL};
    const char *message = NULL;
    int status = FF_OK;
    Py_BEGIN_ALLOW_THREADS
    decode_rows(&data, denom, left, top, right, bottom, gray, &region, &err);
    if (!err.failed && region.pixels == NULL) {
        status = FF_NOMEM;
    } else if (!err.failed) { /* the window, within the region decoded; the box relative to it, within it */
        status = resize_window(&region, window, box, gray, filter, reducing_gap, flavour, hflip, vflip, &o, &message);
    }
    free(region.pixels);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&o.buffer);
    PyBuffer_Release(&data);
    if (err.failed) {
        PyErr_SetString(PyExc_ValueError, err.message);
        return NULL;
    }
    if (status != FF_OK)
        return resize_error(status, message);
    Py_RETURN_NONE;
}

/* ---- sample_batch: sample_into over a chunk of planned samples (feedfast/_plan.c), one GIL release ---- */

/* Columns of a plan row (feedfast/_plan.c, feedfast.loader.backends.cpu.batchplan). */
enum { P_COLS = 24, P_STATUS = 0, P_FACTOR = 3, P_REGION = 4, P_BOX = 8, P_CLIP = 14, P_RESAMPLE = 18, P_HFLIP = 19,
       P_VFLIP = 20 };

/* One planned sample into its slot `o`: the window and region thread_sample._pixels reads for the plan's view,
 * then sample_into's work. 1 when written. */
static int
planned_sample(const unsigned char *raw, Py_ssize_t len, const double *row, int gray, long margin, double gap,
               int flavour, const Output *o)
{
    const double f = row[P_FACTOR];
    const long left = (long)row[P_REGION], top = (long)row[P_REGION + 1];
    const long right = (long)row[P_REGION + 2], bottom = (long)row[P_REGION + 3];
    long wl = (long)floor(row[P_CLIP] / f), wt = (long)floor(row[P_CLIP + 1] / f);
    long wr = (long)ceil(row[P_CLIP + 2] / f), wb = (long)ceil(row[P_CLIP + 3] / f);
    long window[4] = {wl > left ? wl : left, wt > top ? wt : top, wr < right ? wr : right, wb < bottom ? wb : bottom};
    /* not resampled (a crop only: the factor is 1, the box the clip): Pillow's crop, as a nearest resize of the
     * clip to its own size, which copies it */
    const int crop = row[P_RESAMPLE] < 0.0;
    double box[4];
    for (int i = 0; i < 4; i++)
        box[i] = crop ? row[P_CLIP + i] : row[P_BOX + i] / f;
    Py_buffer data;
    memset(&data, 0, sizeof data);
    data.buf = (void *)raw, data.len = len;
    ErrorManager err;
    RegionRows region = {allocate_memory, NULL, 0, 0, 0, 0, NULL};
    const char *message = NULL;
    int status = FF_OK;
    decode_rows(&data, (unsigned int)f, (unsigned long)(left > margin ? left - margin : 0),
                (unsigned long)(top > margin ? top - margin : 0), (unsigned long)(right + margin),
                (unsigned long)(bottom + margin), gray, &region, &err);
    if (!err.failed && region.pixels == NULL) {
        status = FF_NOMEM;
    } else if (!err.failed) {
        status = resize_window(&region, window, box, gray, crop ? FF_NEAREST : (int)row[P_RESAMPLE], f > 1.0 ? gap : 0.0,
                               flavour, row[P_HFLIP] != 0.0, row[P_VFLIP] != 0.0, o, &message);
    }
    free(region.pixels);
    return !err.failed && status == FF_OK;
}

static PyObject *
sample_batch(PyObject *self, PyObject *args)
{
    PyObject *raws, *template, *batch, *mean, *inv;
    Py_buffer plans, done;
    int gray, chw, flavour;
    long margin;
    double gap;
    if (!PyArg_ParseTuple(args, "O!y*w*OOOOpplid", &PyList_Type, &raws, &plans, &done, &template, &batch, &mean, &inv,
                          &gray, &chw, &margin, &flavour, &gap))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(raws);
    PyObject *result = NULL;
    Output o;
    Py_buffer out;
    Raws raw = {0, NULL, NULL, NULL};
    int have_o = 0, have_out = 0;
    if (plans.len != n * P_COLS * (Py_ssize_t)sizeof(double) || done.len != n) {
        PyErr_SetString(PyExc_ValueError, "sample_batch: plans or done do not match raws");
        goto finish;
    }
    if (parse_output(template, mean, inv, chw, gray ? 1 : 4, &o) < 0)
        goto finish;
    have_o = 1;
    if (PyObject_GetBuffer(batch, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        goto finish;
    have_out = 1;
    if (out.len != n * o.buffer.len) {
        PyErr_SetString(PyExc_ValueError, "sample_batch: the batch holds a slot per raw, each the template's size");
        goto finish;
    }
    if (raws_open(raws, "sample_batch", &raw) < 0)
        goto finish;
    Py_BEGIN_ALLOW_THREADS /* the list keeps the bytes alive, raw holds the other buffers */
    for (Py_ssize_t i = 0; i < n; i++) {
        const double *row = (const double *)plans.buf + i * P_COLS;
        char *flag = (char *)done.buf + i;
        *flag = 0;
        if (raw.data[i] == NULL || row[P_STATUS] != 0.0)
            continue;
        Output slot = o;
        slot.buffer.buf = (char *)out.buf + i * o.buffer.len;
        *flag = (char)planned_sample(raw.data[i], raw.lens[i], row, gray, margin, gap, flavour, &slot);
    }
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
finish:
    raws_close(&raw);
    if (have_out)
        PyBuffer_Release(&out);
    if (have_o)
        PyBuffer_Release(&o.buffer);
    PyBuffer_Release(&plans);
    PyBuffer_Release(&done);
    return result;
}

static PyObject *
resample_isa(PyObject *self, PyObject *args)
{
    int cap = -1;
    if (!PyArg_ParseTuple(args, "|i", &cap))
        return NULL;
    if (cap >= 0)
        ff_isa_cap(cap);
    return PyLong_FromLong(ff_isa());
}

static PyMethodDef methods[] = {
    {"sample_batch", sample_batch, METH_VARARGS,
     "sample_batch(raws, plans, done, template, batch, mean, inv, gray, chw, margin, flavour, reducing_gap)\n\n"
     "sample_into over a chunk of planned samples (feedfast.loader.backends.cpu.batchplan), one GIL release: `raws` holds each "
     "sample's JPEG as bytes, any contiguous buffer (a memoryview or NumPy slice of a fetched window) or None; each sample "
     "whose plan row is OK is written into its slot of `batch` (shaped as `template`, one slot "
     "per raw) and its `done` byte set to 1; 0 where it was not (the caller makes it another way)."},
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, denom, left, top, right, bottom, gray) -> (pixels, left, top, width, height)\n\n"
     "Decode only a region of a JPEG (libjpeg-turbo's skip and crop of scanlines), without the GIL."},
    {"jpeg_header", jpeg_header, METH_VARARGS,
     "jpeg_header(data) -> (width, height, components, colour space)\n\nThe JPEG's frame header, read by libjpeg."},
    {"normalize_into", normalize_into, METH_VARARGS,
     "normalize_into(pixels, out, mean, inv, chw) -> None\n\n"
     "out = (pixels - mean) * inv in float32, HWC uint8 in, CHW (chw) or HWC float32 out, without the GIL."},
    {"resample_into", resample_into, METH_VARARGS,
     "resample_into(pixels, width, height, pixel, stride, box, filter, reducing_gap, hflip, vflip, out, mean, inv,"
     " chw, flavour) -> None\n\n"
     "Pillow's Image.resize of an 8-bit image into out (uint8, or normalized float32 or float16), flipped, without "
     "the GIL."},
    {"resample_isa", resample_isa, METH_VARARGS,
     "resample_isa(cap=-1) -> int\n\n"
     "The instruction set resizes and emits run on: 2 AVX2, 1 SSE4.1, 0 plain C (pillow-simd's flavour; Pillow's "
     "runs plain C), after capping it at `cap` where one is given (process-wide: for tests and benchmarks, every "
     "level gives the same pixels)."},
    {"mix_into", mix_into, METH_VARARGS,
     "mix_into(images, keep, take, action, boxes, partner, chw) -> None\n\n"
     "A batch's mixup and cutmix in place, in this thread, without the GIL (feedfast/_mix.c)."},
    {"sample_into", sample_into, METH_VARARGS,
     "sample_into(data, denom, gray, region, window, box, filter, reducing_gap, hflip, vflip, out, mean, inv, chw,"
     " flavour) -> None\n\n"
     "decode_region, then resample_into of a window of it, in one call without the GIL."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native",
    "The threaded CPU path's hot loops: JPEG headers and region decoding, normalize.", -1, methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    PyObject *m = PyModule_Create(&module);
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
    if (m != NULL && PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION_NUMBER", LIBJPEG_TURBO_VERSION_NUMBER) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#endif
    return m;
}
