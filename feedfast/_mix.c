/* feedfast._native.mix_into: a batch's mixup and cutmix in place, in one thread, without the GIL.
 *
 * The batch mix (feedfast/ops/batchmix.py) on a CPU batch. torch's own operations give the same
 * numbers, but on the CPU they run on torch's intra-op thread pool, whose threads compete with
 * the decoding threads for the same cores (and spin while they wait): in the loader a batch of
 * 64 x 3 x 176 x 176 cost 46 to 52 ms of wall time that way, against about 13 ms of CPU in one
 * thread. This does the same arithmetic in the producer thread alone.
 *
 * mix_into(images, keep, take, action, boxes, partner, chw) -> None
 *
 *   images: the batch, C-contiguous, float32 or uint8, B x C x H x W (chw) or B x H x W x C;
 *       written in place.
 *   keep, take: float32, B each: a blended sample's own weight and its partner's.
 *   action: uint8, B: 0 leaves the sample alone, 1 blends it with its partner
 *       (own * keep + partner * take, two float32 products and their float32 sum, as torch's
 *       mul_ / add_ round them; a uint8 batch is rounded half to even back, as torch.round),
 *       2 cuts: its box takes its partner's pixels.
 *   boxes: int64, B x 4: a cut sample's [top, bottom, left, right) in pixels.
 *   partner: int64, B: a permutation of 0..B-1 (sample i mixes with sample partner[i]).
 *
 *   Every sample is mixed with its partner's pixels as they were before the call: the
 *   permutation's cycles are walked in order (each sample is written only after the one before
 *   it in the cycle read it), and the first sample of a cycle is kept aside (only what its
 *   predecessor reads of it) for the last one. A pair that both blend is done in one pass.
 *   Raises ValueError for shapes, dtypes or a partner that is not a permutation, or a box
 *   outside the image.
 *
 * The build keeps the compiler from fusing the products into the sum (-ffp-contract=off), so the
 * floats equal torch's bit for bit (tests/test_mix_native.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_mix.h"

typedef struct {
    char *base;          /* the batch */
    Py_ssize_t sample;   /* bytes of one sample */
    Py_ssize_t count;    /* elements of one sample */
    int is_float;
    Py_ssize_t c, h, w;
    int chw;
    const float *keep, *take;
    const unsigned char *action;
    const int64_t *boxes;
} Batch;

static inline unsigned char
rounded(float v)
{
    v = nearbyintf(v); /* the default rounding mode: half to even, as torch.round */
    return v <= 0.0f ? 0 : (v >= 255.0f ? 255 : (unsigned char)v);
}

/* out = own * keep + other * take over n elements; out may be own (in place). */
static void
blend(char *out, const char *own, const char *other, Py_ssize_t n, float keep, float take, int is_float)
{
    if (is_float) {
        float *o = (float *)out;
        const float *a = (const float *)own, *b = (const float *)other;
        for (Py_ssize_t e = 0; e < n; e++) {
            float pa = a[e] * keep;
            float pb = b[e] * take;
            o[e] = pa + pb;
        }
    } else {
        unsigned char *o = (unsigned char *)out;
        const unsigned char *a = (const unsigned char *)own, *b = (const unsigned char *)other;
        for (Py_ssize_t e = 0; e < n; e++) {
            float pa = (float)a[e] * keep;
            float pb = (float)b[e] * take;
            o[e] = rounded(pa + pb);
        }
    }
}

/* Both samples of a pair that blend with each other, each from the other's pixels before the pass. */
static void
blend_pair(const Batch *b, Py_ssize_t i, Py_ssize_t j)
{
    const float ki = b->keep[i], ti = b->take[i], kj = b->keep[j], tj = b->take[j];
    if (b->is_float) {
        float *x = (float *)(b->base + i * b->sample), *y = (float *)(b->base + j * b->sample);
        for (Py_ssize_t e = 0; e < b->count; e++) {
            const float u = x[e], v = y[e];
            float pu = u * ki, pv = v * ti;
            float qv = v * kj, qu = u * tj;
            x[e] = pu + pv;
            y[e] = qv + qu;
        }
    } else {
        unsigned char *x = (unsigned char *)(b->base + i * b->sample), *y = (unsigned char *)(b->base + j * b->sample);
        for (Py_ssize_t e = 0; e < b->count; e++) {
            const float u = (float)x[e], v = (float)y[e];
            float pu = u * ki, pv = v * ti;
            float qv = v * kj, qu = u * tj;
            x[e] = rounded(pu + pv);
            y[e] = rounded(qv + qu);
        }
    }
}

/* Copy box `box` of sample `src` (a sample's bytes) into `dst` at the same place. */
static void
copy_box(const Batch *b, char *dst, const char *src, const int64_t *box)
{
    const Py_ssize_t item = b->is_float ? 4 : 1;
    const Py_ssize_t top = box[0], bottom = box[1], left = box[2], right = box[3];
    if (bottom <= top || right <= left)
        return;
    if (b->chw) {
        const Py_ssize_t span = (right - left) * item;
        for (Py_ssize_t ch = 0; ch < b->c; ch++)
            for (Py_ssize_t y = top; y < bottom; y++) {
                const Py_ssize_t at = ((ch * b->h + y) * b->w + left) * item;
                memcpy(dst + at, src + at, span);
            }
    } else {
        const Py_ssize_t span = (right - left) * b->c * item;
        for (Py_ssize_t y = top; y < bottom; y++) {
            const Py_ssize_t at = ((y * b->w + left) * b->c) * item;
            memcpy(dst + at, src + at, span);
        }
    }
}

/* Sample i mixed from `source` (its partner's pixels as they were). */
static void
apply(const Batch *b, Py_ssize_t i, const char *source)
{
    char *own = b->base + i * b->sample;
    if (b->action[i] == 1)
        blend(own, own, source, b->count, b->keep[i], b->take[i], b->is_float);
    else if (b->action[i] == 2 && source != own)
        copy_box(b, own, source, b->boxes + 4 * i);
}

/* What sample i's action reads of its partner `p`, copied from p into `saved` at the same places. */
static void
keep_aside(const Batch *b, Py_ssize_t i, Py_ssize_t p, char *saved)
{
    const char *from = b->base + p * b->sample;
    if (b->action[i] == 1)
        memcpy(saved, from, b->sample);
    else if (b->action[i] == 2)
        copy_box(b, saved, from, b->boxes + 4 * i);
}

PyObject *
mix_into(PyObject *self, PyObject *args)
{
    Py_buffer img, keep, take, action, boxes, partner;
    PyObject *o_img, *o_keep, *o_take, *o_action, *o_boxes, *o_partner;
    int chw;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOp", &o_img, &o_keep, &o_take, &o_action, &o_boxes, &o_partner, &chw))
        return NULL;
    /* the images writable and C-contiguous, with their format; the rest read-only */
    if (PyObject_GetBuffer(o_img, &img, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    Py_buffer *held[6] = {&img, NULL, NULL, NULL, NULL, NULL};
    PyObject *rest[5] = {o_keep, o_take, o_action, o_boxes, o_partner};
    Py_buffer *views[5] = {&keep, &take, &action, &boxes, &partner};
    for (int k = 0; k < 5; k++) {
        if (PyObject_GetBuffer(rest[k], views[k], PyBUF_C_CONTIGUOUS) < 0)
            goto fail;
        held[k + 1] = views[k];
    }
    const char *problem = NULL;
    int is_float = 0;
    const char *format = img.format ? img.format : "B";
    if (img.ndim != 4)
        problem = "images must be a batch of four dimensions";
    else if (strcmp(format, "f") == 0 && img.itemsize == 4)
        is_float = 1;
    else if (!((strcmp(format, "B") == 0 || strcmp(format, "b") == 0) && img.itemsize == 1))
        problem = "images must be float32 or uint8";
    Py_ssize_t batch = problem ? 0 : img.shape[0];
    if (problem == NULL) {
        if (keep.len != batch * 4 || take.len != batch * 4)
            problem = "keep and take must be float32, one per sample";
        else if (action.len != batch)
            problem = "action must be uint8, one per sample";
        else if (boxes.len != batch * 4 * 8 || partner.len != batch * 8)
            problem = "boxes (B x 4) and partner (B) must be int64";
    }
    const Py_ssize_t c = problem ? 0 : (chw ? img.shape[1] : img.shape[3]);
    const Py_ssize_t h = problem ? 0 : (chw ? img.shape[2] : img.shape[1]);
    const Py_ssize_t w = problem ? 0 : (chw ? img.shape[3] : img.shape[2]);
    const int64_t *part = (const int64_t *)partner.buf, *box = (const int64_t *)boxes.buf;
    const unsigned char *act = (const unsigned char *)action.buf;
    unsigned char *seen = problem ? NULL : calloc(batch > 0 ? batch : 1, 1);
    Py_ssize_t *order = problem ? NULL : malloc((batch > 0 ? batch : 1) * sizeof(Py_ssize_t));
    if (problem == NULL && (seen == NULL || order == NULL))
        problem = "out of memory";
    for (Py_ssize_t i = 0; problem == NULL && i < batch; i++) {
        if (part[i] < 0 || part[i] >= batch || seen[part[i]]++)
            problem = "partner must be a permutation of the batch's samples";
        else if (act[i] > 2)
            problem = "action must be 0, 1 or 2";
        else if (act[i] == 2 && !(0 <= box[4 * i] && box[4 * i] <= box[4 * i + 1] && box[4 * i + 1] <= h &&
                                   0 <= box[4 * i + 2] && box[4 * i + 2] <= box[4 * i + 3] && box[4 * i + 3] <= w))
            problem = "a cut box lies outside the image";
    }
    Batch b = {(char *)img.buf, problem ? 0 : img.len / (batch ? batch : 1), c * h * w, is_float, c, h, w, chw,
               (const float *)keep.buf, (const float *)take.buf, act, box};
    char *saved = problem ? NULL : malloc(b.sample > 0 ? b.sample : 1);
    if (problem == NULL && saved == NULL)
        problem = "out of memory";
    if (problem != NULL) {
        PyErr_SetString(PyExc_ValueError, problem);
        free(seen);
        free(order);
        free(saved);
        goto fail;
    }
    memset(seen, 0, batch);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t s = 0; s < batch; s++) {
        if (seen[s])
            continue;
        Py_ssize_t n = 0, i = s;
        do {
            order[n++] = i;
            seen[i] = 1;
            i = part[i];
        } while (i != s);
        if (n == 1) { /* its own partner: a blend with itself, a cut from itself */
            apply(&b, s, b.base + s * b.sample);
        } else if (n == 2 && act[order[0]] == 1 && act[order[1]] == 1) {
            blend_pair(&b, order[0], order[1]);
        } else {
            const Py_ssize_t last = order[n - 1]; /* its partner is s, written first */
            keep_aside(&b, last, s, saved);
            for (Py_ssize_t k = 0; k < n; k++) {
                const Py_ssize_t at = order[k];
                apply(&b, at, k == n - 1 ? saved : b.base + part[at] * b.sample);
            }
        }
    }
    Py_END_ALLOW_THREADS
    free(seen);
    free(order);
    free(saved);
    for (int k = 0; k < 6; k++)
        if (held[k])
            PyBuffer_Release(held[k]);
    Py_RETURN_NONE;
fail:
    for (int k = 0; k < 6; k++)
        if (held[k])
            PyBuffer_Release(held[k]);
    return NULL;
}
