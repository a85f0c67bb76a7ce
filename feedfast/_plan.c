/* feedfast._plan: a batch's image geometry for the threaded CPU path, in C, without the GIL.
 *
 * The threaded path (feedfast.loader.backends.cpu.thread_sample) walks a sample's image chain in Python: it
 * reads the JPEG's frame header, draws the random crop and the flips, and composes the chain
 * into one view (a box of the source resampled to a size), then picks the DCT scaling and the
 * region to decode. That is tens of microseconds of Python per sample. plan_batch does the same
 * for a whole batch in one call, with the same arithmetic (IEEE doubles, libm's exp and sqrt,
 * round half to even, the counter-based draws of feedfast.order.draws), so it gives the same
 * numbers: tests/test_plan_native.py checks it against the Python walk, sample for sample.
 *
 * plan_batch(..., out, geometry=False): with `geometry`, the view alone for any JPEG whose header libjpeg reads (no
 *   colour-mode or pixel-limit status): the crop boxes and flips DALI is fed (feedfast.loader.backends.dali.draws).
 *
 * plan_packed(data, starts, sizes, samples, key, program, out)
 *   plan_batch(..., geometry=True) over members end to end in `data` (member i: data[starts[i] : starts[i] +
 *   sizes[i]], none where sizes[i] <= 0), as DALI's feed reads a step: no Python object per member.
 *
 * read_batch(fds, offsets, sizes) -> list of bytes
 *   fds: int32, offsets and sizes: int64, one each per sample: pread of each, the GIL released.
 *   A read that fails or comes short gives None in its place (the caller reads it again in
 *   Python, which raises the error that names the shard).
 *
 * read_packed(fds, offsets, sizes, out) -> int
 *   One member per entry (int32 fds, int64 offsets and sizes; a size <= 0 reads nothing): pread of each into
 *   `out`, end to end in the order given, the GIL released: a step's members of one component in one call, in
 *   one reused buffer (DALI's feed). -1 when every read was whole, else the first member whose read failed.
 *
 * parse_labels(data, starts, lengths, offset, out) -> int
 *   The labels at data[starts[i] : starts[i] + lengths[i]] as the `label` op reads them (ASCII whitespace,
 *   a sign, decimal digits; the value less `offset`, within int64) into the int64 `out`, the GIL released.
 *   -1 when all parse, else the first that does not (Python raises its error, as the op does).
 *
 * gather(fd, offsets, width, out) -> bool
 *   pread of `width` bytes at each of the int64 `offsets` of `fd`, into consecutive `width`-byte
 *   slots of the writable buffer `out`, the GIL released; False when a read fails or comes short.
 *
 * plan_batch(raws, samples, key, program, max_pixels, out)
 *   raws: a list of the samples' JPEG bytes: bytes or any contiguous buffer (a memoryview or NumPy slice of a
 *   fetched window, feedfast/_raws.h), None: no such sample data, status NOT_JPEG.
 *   samples: int64 canonical sample numbers (the draws are keyed by them); key: the draws key.
 *   program: float64, OP_SLOTS values per op (see the OP_ codes): the image chain after decode.
 *   max_pixels: Pillow's Image.MAX_IMAGE_PIXELS (0: no limit).
 *   out: float64 [n, PLAN_COLS], written row per sample (the COL_ indices below).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <jpeglib.h>

#include "_raws.h"

enum { OP_SLOTS = 12 };
enum { OP_DECODE = 1, OP_RRC = 2, OP_RESIZE_SHORT = 3, OP_RESIZE_HW = 4, OP_CENTER_CROP = 5, OP_FLIP = 6 };
/* OP_DECODE: gray, the DCT scalings allowed (a bit mask: 8 -> 8, 4 -> 4, 2 -> 2). OP_RRC: out_h, out_w, scale_lo, scale_hi, log_ratio_lo, log_ratio_hi, ratio_lo, ratio_hi,
 * filter. OP_RESIZE_SHORT: size, filter. OP_RESIZE_HW: h, w, filter. OP_CENTER_CROP: h, w. OP_FLIP: p_h, p_v. */

enum { PLAN_COLS = 24 };
enum {
    COL_STATUS = 0, COL_WIDTH, COL_HEIGHT, COL_FACTOR, COL_REGION, /* 4 .. 7 */
    COL_BOX = 8,    /* 8 .. 11 */
    COL_SIZE = 12,  /* 12, 13 */
    COL_CLIP = 14,  /* 14 .. 17 */
    COL_RESAMPLE = 18, COL_HFLIP, COL_VFLIP
};
enum { ST_OK = 0, ST_NOT_REGION = 1, ST_FALLBACK = 2, ST_BOMB = 3, ST_LARGE = 4 };
/* ST_NOT_REGION: not a JPEG the region decoder takes (another format, CMYK, a header libjpeg cannot
 * read, a mode other than the decode's colour). ST_FALLBACK: the chain needs the PIL program (a
 * center_crop larger than the image). ST_BOMB / ST_LARGE: over twice Pillow's pixel limit (an error) /
 * over it (a warning): Python says so as Pillow does. Every status but ST_OK goes the Python way. */

#define REFILTER_REACH 3.0

/* ---- the draws (feedfast.order.draws.uniforms) ------------------------------------------------------ */

static inline uint64_t
mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

typedef struct {
    uint64_t base; /* mix64(sample ^ key) */
    uint64_t next;
} Draws;

static inline double
draw(Draws *d)
{
    uint64_t j = d->next++;
    uint64_t x = mix64(d->base + (j + 1) * 0x9E3779B97F4A7C15ULL);
    return (double)(x >> 11) * (1.0 / 9007199254740992.0);
}

static inline double
uniform(Draws *d, double a, double b)
{
    return a + (b - a) * draw(d);
}

static inline long
randint(Draws *d, long a, long b)
{
    long span = b - a;
    long k = (long)(draw(d) * (double)(span + 1));
    return a + (k < span ? k : span);
}

static inline long
round_even(double x)
{
    return (long)nearbyint(x); /* the default rounding mode: half to even, as Python's round */
}

/* ---- the view (feedfast.loader.backends.cpu.thread_sample.View) ---------------------------------------------------- */

typedef struct {
    double box[4];
    long size[2]; /* w, h */
    long clip[4];
    int resample; /* -1: not resampled */
    int hflip, vflip;
} View;

static void
view_crop(View *v, long left, long top, long width, long height)
{
    double x0 = v->box[0], y0 = v->box[1], x1 = v->box[2], y1 = v->box[3];
    double sx = (x1 - x0) / (double)v->size[0], sy = (y1 - y0) / (double)v->size[1];
    double box[4] = {x0 + (double)left * sx, y0 + (double)top * sy, x0 + (double)(left + width) * sx,
                     y0 + (double)(top + height) * sy};
    memcpy(v->box, box, sizeof box);
    v->size[0] = width, v->size[1] = height;
    if (v->resample < 0)
        for (int i = 0; i < 4; i++)
            v->clip[i] = round_even(box[i]);
}

/* feedfast.ops.pil_ops.random_resized_crop_params: (top, left, h, w) */
static void
rrc_params(long width, long height, const double *p, Draws *d, long out[4])
{
    double scale_lo = p[3], scale_hi = p[4], log_lo = p[5], log_hi = p[6], ratio_lo = p[7], ratio_hi = p[8];
    double area = (double)(width * height);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * uniform(d, scale_lo, scale_hi);
        double aspect = exp(uniform(d, log_lo, log_hi));
        long w = round_even(sqrt(target * aspect));
        long h = round_even(sqrt(target / aspect));
        if (0 < w && w <= width && 0 < h && h <= height) {
            long top = randint(d, 0, height - h);
            long left = randint(d, 0, width - w);
            out[0] = top, out[1] = left, out[2] = h, out[3] = w;
            return;
        }
    }
    double in_ratio = (double)width / (double)height;
    long w = width, h = height;
    if (in_ratio < ratio_lo) {
        h = round_even((double)width / ratio_lo);
        h = h > 1 ? h : 1;
    } else if (in_ratio > ratio_hi) {
        w = round_even((double)height * ratio_hi);
        w = w > 1 ? w : 1;
    }
    out[0] = (height - h) / 2, out[1] = (width - w) / 2, out[2] = h, out[3] = w;
}

/* One op of the chain on the view; 0, or ST_FALLBACK. */
static int
apply(const double *p, View *v, Draws *d)
{
    long width = v->size[0], height = v->size[1];
    switch ((int)p[0]) {
    case OP_RRC: {
        long c[4];
        rrc_params(width, height, p, d, c);
        view_crop(v, c[1], c[0], c[3], c[2]);
        v->size[0] = (long)p[2], v->size[1] = (long)p[1];
        v->resample = (int)p[9];
        return 0;
    }
    case OP_RESIZE_SHORT: {
        long size = (long)p[1], shorter = width < height ? width : height, longer = width < height ? height : width;
        long other = (long)((double)(size * longer) / (double)shorter);
        long w = width <= height ? size : other, h = width <= height ? other : size;
        if (w == width && h == height)
            return 0;
        v->size[0] = w, v->size[1] = h, v->resample = (int)p[2];
        return 0;
    }
    case OP_RESIZE_HW: {
        long h = (long)p[1], w = (long)p[2];
        if (w == width && h == height)
            return 0;
        v->size[0] = w, v->size[1] = h, v->resample = (int)p[3];
        return 0;
    }
    case OP_CENTER_CROP: {
        long th = (long)p[1], tw = (long)p[2];
        if (th > height || tw > width)
            return ST_FALLBACK;
        view_crop(v, round_even((double)(width - tw) / 2.0), round_even((double)(height - th) / 2.0), tw, th);
        return 0;
    }
    case OP_FLIP: {
        int h = draw(d) < p[1];
        int vv = draw(d) < p[2];
        v->hflip ^= h, v->vflip ^= vv;
        return 0;
    }
    default:
        return 0;
    }
}

static long
draft_factor(const View *v, long allowed)
{
    if (v->resample < 0)
        return 1;
    static const long factors[3] = {8, 4, 2};
    for (int i = 0; i < 3; i++) {
        double s = (double)factors[i];
        if (!(allowed & factors[i]))
            continue;
        if ((v->box[2] - v->box[0]) / s >= (double)v->size[0] && (v->box[3] - v->box[1]) / s >= (double)v->size[1])
            return factors[i];
    }
    return 1;
}

/* feedfast.loader.backends.cpu.thread_sample.region_needed for one view */
static void
region_needed(const View *v, double scale, long width, long height, long out[4])
{
    double left = (double)width, top = (double)height, right = 0.0, bottom = 0.0;
    double c0 = floor((double)v->clip[0] / scale), c1 = floor((double)v->clip[1] / scale);
    double c2 = ceil((double)v->clip[2] / scale), c3 = ceil((double)v->clip[3] / scale);
    if (v->resample >= 0) {
        double x0 = v->box[0] / scale, y0 = v->box[1] / scale, x1 = v->box[2] / scale, y1 = v->box[3] / scale;
        double rx = (x1 - x0) / (double)v->size[0], ry = (y1 - y0) / (double)v->size[1];
        double ex = ceil(x1 + REFILTER_REACH * (rx > 1.0 ? rx : 1.0) + 1.0);
        double ey = ceil(y1 + REFILTER_REACH * (ry > 1.0 ? ry : 1.0) + 1.0);
        c2 = c2 < ex ? c2 : ex;
        c3 = c3 < ey ? c3 : ey;
    }
    left = left < c0 ? left : c0, top = top < c1 ? top : c1;
    right = right > c2 ? right : c2, bottom = bottom > c3 ? bottom : c3;
    long l = (long)left, t = (long)top, r = (long)right + 1, b = (long)bottom + 1;
    out[0] = l > 0 ? l : 0, out[1] = t > 0 ? t : 0;
    out[2] = r < width ? r : width, out[3] = b < height ? b : height;
}

/* ---- the frame header (feedfast.loader.backends.cpu.pil_fast.jpeg_header) ---------------------------------------- */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
} Quiet;

static void
quiet_exit(j_common_ptr cinfo)
{
    longjmp(((Quiet *)cinfo->err)->jump, 1);
}

static void
quiet_message(j_common_ptr cinfo, int level)
{
    (void)cinfo, (void)level;
}

/* width, height and Pillow's mode (1: L, 3: RGB, 0: other); 0 on success */
static int
header(const unsigned char *data, size_t len, long *width, long *height, int *mode)
{
    if (len < 3 || data[0] != 0xFF || data[1] != 0xD8 || data[2] != 0xFF)
        return -1;
    struct jpeg_decompress_struct cinfo;
    Quiet err;
    memset(&cinfo, 0, sizeof cinfo);
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = quiet_exit;
    err.pub.emit_message = quiet_message;
    int ok = -1;
    if (setjmp(err.jump) == 0) {
        jpeg_create_decompress(&cinfo);
        jpeg_mem_src(&cinfo, data, (unsigned long)len);
        jpeg_read_header(&cinfo, TRUE);
        *width = (long)cinfo.image_width, *height = (long)cinfo.image_height;
        int c = cinfo.num_components, s = (int)cinfo.jpeg_color_space;
        *mode = (c == 1 && s == 1) ? 1 : (c == 3 && (s == 2 || s == 3)) ? 3 : 0;
        ok = 0;
    }
    jpeg_destroy_decompress(&cinfo);
    return ok;
}

/* ---- one sample ---------------------------------------------------------------------------------------- */

/* One sample's row. `geometry`: the view alone, as DALI's fed draws take it (feedfast.loader.backends.dali.draws):
 * any JPEG whose frame header libjpeg reads, whatever its colour mode or size (DALI decodes it to the decode's
 * colour, and has no pixel limit). */
static void
plan_one(const unsigned char *data, size_t len, uint64_t sample, uint64_t key, const double *program, Py_ssize_t ops,
         long long max_pixels, int geometry, double *row)
{
    memset(row, 0, sizeof(double) * PLAN_COLS);
    long width, height;
    int mode;
    if (data == NULL || header(data, len, &width, &height, &mode) != 0 || width < 1 || height < 1) {
        row[COL_STATUS] = ST_NOT_REGION;
        return;
    }
    row[COL_WIDTH] = (double)width, row[COL_HEIGHT] = (double)height;
    if (!geometry && max_pixels > 0 && (long long)width * height > max_pixels) {
        row[COL_STATUS] = (long long)width * height > 2 * max_pixels ? ST_BOMB : ST_LARGE;
        return;
    }
    int gray = ops > 0 && program[1] != 0.0;
    if (!geometry && mode != (gray ? 1 : 3)) {
        row[COL_STATUS] = ST_NOT_REGION;
        return;
    }
    View v = {{0.0, 0.0, (double)width, (double)height}, {width, height}, {0, 0, width, height}, -1, 0, 0};
    Draws d = {mix64(sample ^ key), 0};
    for (Py_ssize_t i = 1; i < ops; i++) {
        if (apply(program + i * OP_SLOTS, &v, &d) != 0) {
            row[COL_STATUS] = ST_FALLBACK;
            return;
        }
    }
    long factor = draft_factor(&v, ops > 0 ? (long)program[2] : 0);
    long region[4];
    region_needed(&v, (double)factor, (width + factor - 1) / factor, (height + factor - 1) / factor, region);
    row[COL_FACTOR] = (double)factor;
    for (int i = 0; i < 4; i++) {
        row[COL_REGION + i] = (double)region[i];
        row[COL_BOX + i] = v.box[i];
        row[COL_CLIP + i] = (double)v.clip[i];
    }
    row[COL_SIZE] = (double)v.size[0], row[COL_SIZE + 1] = (double)v.size[1];
    row[COL_RESAMPLE] = (double)v.resample, row[COL_HFLIP] = v.hflip, row[COL_VFLIP] = v.vflip;
}

static PyObject *
plan_batch(PyObject *self, PyObject *args)
{
    PyObject *raws;
    Py_buffer samples, program, out;
    unsigned long long key;
    long long max_pixels;
    int geometry = 0;
    if (!PyArg_ParseTuple(args, "O!y*Ky*Lw*|p", &PyList_Type, &raws, &samples, &key, &program, &max_pixels, &out,
                          &geometry))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(raws);
    PyObject *result = NULL;
    Raws raw = {0, NULL, NULL, NULL};
    if (samples.len != n * (Py_ssize_t)sizeof(int64_t) || out.len != n * PLAN_COLS * (Py_ssize_t)sizeof(double) ||
        program.len % (OP_SLOTS * sizeof(double)) != 0) {
        PyErr_SetString(PyExc_ValueError, "plan_batch: samples, program or out has the wrong size");
        goto done;
    }
    if (raws_open(raws, "plan_batch", &raw) < 0)
        goto done;
    Py_ssize_t ops = program.len / (Py_ssize_t)(OP_SLOTS * sizeof(double));
    Py_BEGIN_ALLOW_THREADS /* the list holds the bytes alive, raw the other buffers; nothing else touches Python objects */
    for (Py_ssize_t i = 0; i < n; i++)
        plan_one(raw.data[i], (size_t)raw.lens[i], (uint64_t)((const int64_t *)samples.buf)[i], (uint64_t)key,
                 (const double *)program.buf, ops, max_pixels, geometry, (double *)out.buf + i * PLAN_COLS);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    raws_close(&raw);
    PyBuffer_Release(&samples);
    PyBuffer_Release(&program);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *
plan_packed(PyObject *self, PyObject *args)
{
    Py_buffer data, starts, sizes, samples, program, out;
    unsigned long long key;
    if (!PyArg_ParseTuple(args, "y*y*y*y*Ky*w*", &data, &starts, &sizes, &samples, &key, &program, &out))
        return NULL;
    Py_ssize_t n = starts.len / (Py_ssize_t)sizeof(int64_t);
    PyObject *result = NULL;
    const int64_t *start = starts.buf, *size = sizes.buf;
    if (sizes.len != starts.len || samples.len != starts.len ||
        out.len != n * PLAN_COLS * (Py_ssize_t)sizeof(double) || program.len % (OP_SLOTS * sizeof(double)) != 0) {
        PyErr_SetString(PyExc_ValueError, "plan_packed: starts, sizes, samples, program or out has the wrong size");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (size[i] > 0 && (start[i] < 0 || start[i] + size[i] > data.len)) {
            PyErr_Format(PyExc_ValueError, "plan_packed: member %zd lies outside the data", i);
            goto done;
        }
    Py_ssize_t ops = program.len / (Py_ssize_t)(OP_SLOTS * sizeof(double));
    const unsigned char *base = data.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        plan_one(size[i] > 0 ? base + start[i] : NULL, size[i] > 0 ? (size_t)size[i] : 0,
                 (uint64_t)((const int64_t *)samples.buf)[i], (uint64_t)key, (const double *)program.buf, ops, 0, 1,
                 (double *)out.buf + i * PLAN_COLS);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&samples);
    PyBuffer_Release(&program);
    PyBuffer_Release(&out);
    return result;
}

/* `size` bytes of `fd` at `offset` into `dst`, read until whole: 1 when they all came, 0 when a read failed or
 * came short, or the offset is negative. */
static int
pread_full(int fd, char *dst, size_t size, int64_t offset)
{
    if (offset < 0)
        return 0;
    size_t got = 0;
    while (got < size) {
        ssize_t r = pread(fd, dst + got, size - got, (off_t)(offset + (int64_t)got));
        if (r <= 0)
            return 0;
        got += (size_t)r;
    }
    return 1;
}

static PyObject *
read_batch(PyObject *self, PyObject *args)
{
    Py_buffer fds, offsets, sizes;
    if (!PyArg_ParseTuple(args, "y*y*y*", &fds, &offsets, &sizes))
        return NULL;
    Py_ssize_t n = fds.len / (Py_ssize_t)sizeof(int32_t);
    PyObject *list = NULL;
    if (offsets.len != n * (Py_ssize_t)sizeof(int64_t) || sizes.len != n * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "read_batch: fds, offsets and sizes differ in length");
        goto done;
    }
    list = PyList_New(n);
    if (list == NULL)
        goto done;
    const int64_t *size = sizes.buf, *offset = offsets.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PyBytes_FromStringAndSize(NULL, size[i] > 0 ? (Py_ssize_t)size[i] : 0);
        if (b == NULL) {
            Py_CLEAR(list);
            goto done;
        }
        PyList_SET_ITEM(list, i, b);
    }
    char *ok = PyMem_Calloc((size_t)n + 1, 1);
    if (ok == NULL) {
        Py_CLEAR(list);
        PyErr_NoMemory();
        goto done;
    }
    char **bufs = PyMem_Calloc((size_t)n + 1, sizeof *bufs);
    if (bufs == NULL) {
        PyMem_Free(ok);
        Py_CLEAR(list);
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        bufs[i] = PyBytes_AS_STRING(PyList_GET_ITEM(list, i));
    const int32_t *fd = fds.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        ok[i] = (char)pread_full(fd[i], bufs[i], size[i] > 0 ? (size_t)size[i] : 0, offset[i]);
    Py_END_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        if (!ok[i]) {
            Py_INCREF(Py_None);
            PyList_SetItem(list, i, Py_None); /* steals the reference, drops the bytes */
        }
    PyMem_Free(ok);
    PyMem_Free(bufs);
done:
    PyBuffer_Release(&fds);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&sizes);
    return list;
}

static PyObject *
gather(PyObject *self, PyObject *args)
{
    int fd;
    Py_buffer offsets, out;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "iy*nw*", &fd, &offsets, &width, &out))
        return NULL;
    Py_ssize_t n = offsets.len / (Py_ssize_t)sizeof(int64_t);
    if (width < 0 || out.len < n * width) {
        PyBuffer_Release(&offsets);
        PyBuffer_Release(&out);
        return PyErr_Format(PyExc_ValueError, "gather: out holds %zd bytes, %zd needed", out.len, n * width);
    }
    int ok = 1;
    const int64_t *at = offsets.buf;
    char *dst = out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && ok; i++)
        ok = pread_full(fd, dst + i * width, (size_t)width, at[i]);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&out);
    return PyBool_FromLong(ok);
}

static PyObject *
read_packed(PyObject *self, PyObject *args)
{
    Py_buffer fds, offsets, sizes, out;
    if (!PyArg_ParseTuple(args, "y*y*y*w*", &fds, &offsets, &sizes, &out))
        return NULL;
    Py_ssize_t n = fds.len / (Py_ssize_t)sizeof(int32_t), failed = -1, need = 0;
    PyObject *result = NULL;
    const int64_t *size = sizes.buf, *offset = offsets.buf;
    const int32_t *fd = fds.buf;
    if (offsets.len != n * (Py_ssize_t)sizeof(int64_t) || sizes.len != n * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "read_packed: fds, offsets and sizes differ in length");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        need += size[i] > 0 ? (Py_ssize_t)size[i] : 0;
    if (out.len < need) {
        PyErr_Format(PyExc_ValueError, "read_packed: out holds %zd bytes, %zd needed", out.len, need);
        goto done;
    }
    char *dst = out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        if (size[i] <= 0)
            continue;
        if (!pread_full(fd[i], dst, (size_t)size[i], offset[i])) {
            failed = i;
            break;
        }
        dst += size[i];
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(failed);
done:
    PyBuffer_Release(&fds);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&out);
    return result;
}

/* One label as feedfast.ops.generic's `label` op reads it: ASCII whitespace, a sign, decimal digits (leading
 * zeros dropped, at most 19 left), ASCII whitespace; its value less `offset` within int64. 0: refused. */
static int
parse_label(const unsigned char *p, Py_ssize_t len, int64_t offset, int64_t *value)
{
    Py_ssize_t i = 0, end = len;
    while (i < end && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r' || p[i] == '\n'))
        i++;
    while (end > i && (p[end - 1] == ' ' || p[end - 1] == '\t' || p[end - 1] == '\r' || p[end - 1] == '\n'))
        end--;
    int negative = 0;
    if (i < end && (p[i] == '+' || p[i] == '-'))
        negative = p[i++] == '-';
    if (i >= end)
        return 0;
    for (Py_ssize_t j = i; j < end; j++)
        if (p[j] < '0' || p[j] > '9')
            return 0;
    while (i < end - 1 && p[i] == '0')
        i++;
    if (end - i > 19)
        return 0;
    /* |digits| < 10^19 fits an unsigned 64-bit value; the result is checked against int64 after the offset */
    uint64_t magnitude = 0;
    for (; i < end; i++)
        magnitude = magnitude * 10u + (uint64_t)(p[i] - '0');
    /* value = +-magnitude - offset, computed in 128 bits where the compiler has them */
    __int128 v = negative ? -(__int128)magnitude : (__int128)magnitude;
    v -= offset;
    if (v < INT64_MIN || v > INT64_MAX)
        return 0;
    *value = (int64_t)v;
    return 1;
}

static PyObject *
parse_labels(PyObject *self, PyObject *args)
{
    Py_buffer data, starts, lengths, out;
    long long offset;
    if (!PyArg_ParseTuple(args, "y*y*y*Lw*", &data, &starts, &lengths, &offset, &out))
        return NULL;
    Py_ssize_t n = starts.len / (Py_ssize_t)sizeof(int64_t), bad = -1;
    PyObject *result = NULL;
    const int64_t *start = starts.buf, *length = lengths.buf;
    if (lengths.len != starts.len || out.len < n * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "parse_labels: starts, lengths and out differ in length");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (start[i] < 0 || length[i] < 0 || start[i] + length[i] > data.len) {
            PyErr_Format(PyExc_ValueError, "parse_labels: label %zd lies outside the data", i);
            goto done;
        }
    const unsigned char *base = data.buf;
    int64_t *value = out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        if (!parse_label(base + start[i], (Py_ssize_t)length[i], (int64_t)offset, &value[i])) {
            bad = i;
            break;
        }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(bad);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&out);
    return result;
}

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

/* read_files(root_fd, paths, starts, lengths, sizes, out) -> (int, int, int)
 *   Whole files by path, end to end into `out`, in the order given, the GIL released: file i's path is
 *   paths[starts[i] : starts[i] + lengths[i]] (file system bytes; relative to the folder open as `root_fd`, or
 *   absolute), its size as listed sizes[i] (int64). Each is opened, checked to be that size, read and closed.
 *   (-1, 0, 0) when every file was read whole, else (i, errno, size) for the first that was not: errno 0 when
 *   it opened but is now `size` bytes, not sizes[i] (or came short: it changed while read).
 */
static int
read_one_file(int root, const char *path, int64_t listed, char *dst, int *err, int64_t *found)
{
    int fd = openat(root, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        *err = errno;
        return 0;
    }
    struct stat st;
    int ok = fstat(fd, &st) == 0;
    if (!ok)
        *err = errno;
    else if ((int64_t)st.st_size != listed) {
        *found = (int64_t)st.st_size;
        ok = 0;
    } else if (!pread_full(fd, dst, (size_t)listed, 0)) {
        *err = errno; /* 0 when it came short */
        *found = -1;
        ok = 0;
    }
    close(fd);
    return ok;
}

static PyObject *
read_files(PyObject *self, PyObject *args)
{
    int root;
    Py_buffer paths, starts, lengths, sizes, out;
    if (!PyArg_ParseTuple(args, "iy*y*y*y*w*", &root, &paths, &starts, &lengths, &sizes, &out))
        return NULL;
    Py_ssize_t n = starts.len / (Py_ssize_t)sizeof(int64_t), failed = -1, need = 0, longest = 0;
    PyObject *result = NULL;
    const int64_t *start = starts.buf, *length = lengths.buf, *size = sizes.buf;
    if (lengths.len != starts.len || sizes.len != starts.len) {
        PyErr_SetString(PyExc_ValueError, "read_files: starts, lengths and sizes differ in length");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (start[i] < 0 || length[i] <= 0 || start[i] + length[i] > paths.len || size[i] < 0) {
            PyErr_Format(PyExc_ValueError, "read_files: file %zd's path lies outside the paths, or its size is unknown", i);
            goto done;
        }
        need += (Py_ssize_t)size[i];
        longest = length[i] > longest ? (Py_ssize_t)length[i] : longest;
    }
    if (out.len < need) {
        PyErr_Format(PyExc_ValueError, "read_files: out holds %zd bytes, %zd needed", out.len, need);
        goto done;
    }
    char *name = PyMem_Malloc((size_t)longest + 1);
    if (name == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int err = 0;
    int64_t found = 0;
    char *dst = out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        memcpy(name, (const char *)paths.buf + start[i], (size_t)length[i]);
        name[length[i]] = '\0';
        if (memchr(name, '\0', (size_t)length[i]) != NULL) { /* a path holds no NUL: it names no file */
            err = ENOENT;
            failed = i;
            break;
        }
        if (!read_one_file(root, name, size[i], dst, &err, &found)) {
            failed = i;
            break;
        }
        dst += size[i];
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(name);
    result = failed < 0 ? Py_BuildValue("nii", failed, 0, 0) : Py_BuildValue("niL", failed, err, (long long)found);
done:
    PyBuffer_Release(&paths);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"gather", gather, METH_VARARGS, "pread of fixed-size records at many offsets, the GIL released."},
    {"plan_batch", plan_batch, METH_VARARGS, "A batch's image geometry (see the module's comment)."},
    {"plan_packed", plan_packed, METH_VARARGS, "plan_batch's geometry over members end to end in one buffer."},
    {"read_batch", read_batch, METH_VARARGS, "pread of each sample's bytes, the GIL released."},
    {"read_packed", read_packed, METH_VARARGS, "pread of members into one buffer, end to end, the GIL released."},
    {"parse_labels", parse_labels, METH_VARARGS, "A batch of ASCII decimal labels to int64, the GIL released."},
    {"read_files", read_files, METH_VARARGS, "Whole files by path into one buffer, sizes checked, the GIL released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "feedfast._plan", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__plan(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "PLAN_COLS", PLAN_COLS) < 0 || PyModule_AddIntConstant(m, "OP_SLOTS", OP_SLOTS) < 0)
        return NULL;
    return m;
}
