/* feedfast._native: the threaded CPU path's hot spots in C (decoding and normalize without the GIL).
 *
 * decode_region: decode only a region of a JPEG, with libjpeg-turbo.
 *
 * Pillow decodes a JPEG whole (or down to a row, feedfast.loader.pil_fast.load_rows). A random
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
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

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
    struct jpeg_decompress_struct cinfo;
    ErrorManager err;
    memset(&cinfo, 0, sizeof cinfo); /* jpeg_destroy_decompress is then safe whatever failed */
    memset(&err, 0, sizeof err);
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = error_exit;
    err.pub.emit_message = emit_message;

    /* volatile: read after a longjmp */
    PyObject *volatile pixels = NULL;
    PyThreadState *volatile saved = PyEval_SaveThread();
    volatile JDIMENSION x0 = 0, width = 0, y0 = 0, rows = 0;
    const int channels = gray ? 1 : 4;

    if (setjmp(err.jump) == 0) {
        jpeg_create_decompress(&cinfo); /* inside: it may fail (memory) through error_exit */
        jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
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
        if (ys > 0 && (jpeg_skip_scanlines(&cinfo, ys) != ys || cinfo.output_scanline != ys) && !err.failed) {
            strcpy(err.message, "too few rows skipped");
            err.failed = 1;
        }
        x0 = xs, width = cw, y0 = ys, rows = y1 - ys;
        if (!err.failed) {
            PyEval_RestoreThread(saved);
            saved = NULL;
            /* one row of slack: Pillow maps a window of it with a stride only if a whole last stride fits */
            pixels = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)width * channels * (rows + 1));
            if (pixels != NULL) {
                saved = PyEval_SaveThread();
                unsigned char *out = (unsigned char *)PyBytes_AS_STRING(pixels);
                size_t stride = (size_t)width * channels;
                while (cinfo.output_scanline < y1 && !err.failed) {
                    JSAMPROW row = out + stride * (cinfo.output_scanline - ys);
                    if (jpeg_read_scanlines(&cinfo, &row, 1) != 1)
                        break;
                }
                if (cinfo.output_scanline < y1 && !err.failed) {
                    strcpy(err.message, "too few rows decoded");
                    err.failed = 1;
                }
            }
        }
    }
    jpeg_destroy_decompress(&cinfo);
    if (saved != NULL)
        PyEval_RestoreThread(saved);
    PyBuffer_Release(&data);
    if (pixels == NULL && !err.failed)
        return NULL; /* the allocation failed: MemoryError is set */
    if (err.failed) {
        Py_XDECREF(pixels);
        PyErr_SetString(PyExc_ValueError, err.message);
        return NULL;
    }
    return Py_BuildValue("(NIIII)", pixels, (unsigned int)x0, (unsigned int)y0, (unsigned int)width,
                         (unsigned int)rows);
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

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, denom, left, top, right, bottom, gray) -> (pixels, left, top, width, height)\n\n"
     "Decode only a region of a JPEG (libjpeg-turbo's skip and crop of scanlines), without the GIL."},
    {"jpeg_header", jpeg_header, METH_VARARGS,
     "jpeg_header(data) -> (width, height, components, colour space)\n\nThe JPEG's frame header, read by libjpeg."},
    {"normalize_into", normalize_into, METH_VARARGS,
     "normalize_into(pixels, out, mean, inv, chw) -> None\n\n"
     "out = (pixels - mean) * inv in float32, HWC uint8 in, CHW (chw) or HWC float32 out, without the GIL."},
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
