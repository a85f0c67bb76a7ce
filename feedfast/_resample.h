/* feedfast's port of Pillow's Image.resize for 8-bit images (feedfast/_resample.c; pillow-simd's SSE4 and AVX2
 * passes in feedfast/_resample_simd.c): no Python.
 *
 * ff_resize(src, out_w, out_h, filter, box, reducing_gap, simd, result) gives the pixels Pillow's
 * Image.resize((out_w, out_h), filter, box=box, reducing_gap=reducing_gap or None) gives for an "L"
 * image (1 byte a pixel) or an "RGB"/"RGBX" one (4 bytes a pixel, as Pillow stores them), bit for bit.
 * It touches no Python object and may run without the GIL.
 */
#ifndef FEEDFAST_RESAMPLE_H
#define FEEDFAST_RESAMPLE_H

#include <stddef.h>

/* Pillow's filter numbers (PIL.Image.Resampling). */
enum { FF_NEAREST = 0, FF_LANCZOS = 1, FF_BILINEAR = 2, FF_BICUBIC = 3, FF_BOX = 4, FF_HAMMING = 5 };

/* An 8-bit image in memory: `height` rows `stride` bytes apart, `width` pixels of `pixel` bytes (1 or 4). */
typedef struct {
    const unsigned char *data;
    ptrdiff_t stride;
    int width, height, pixel;
} FFImage;

/* A resize's result: `image` (a window of the source where the resize is a crop or a copy, else pixels in
 * `owned`); free with ff_resized_free. */
typedef struct {
    FFImage image;
    unsigned char *owned[3];
} FFResized;

/* Which Pillow's pixels to give: they differ by a grey level here and there.
 *   FF_PILLOW_12: Pillow up to 12 (checked against 12.1.1): 22-bit coefficients.
 *   FF_PILLOW_SIMD: pillow-simd (checked against 12.1.1.post0): 16-bit coefficients at the precision the
 *       largest allows, and its 1x3 reduction of 4-byte pixels rounding up more (see reduce()).
 * Pillow 13 orders its two passes by a rule not ported here (its pixels differ from both). */
enum { FF_PILLOW_12 = 0, FF_PILLOW_SIMD = 1 };

enum { FF_OK = 0, FF_NOMEM = 1, FF_INVALID = 2 };

/* Resize `src` to out_w x out_h with Pillow's `filter`, reading `box` (x0, y0, x1, y1) of it, with
 * Pillow's reducing_gap (0: None), as the Pillow `flavour` does. Returns FF_OK, FF_NOMEM, or FF_INVALID
 * with `*message` saying why (what Pillow says where Pillow refuses); result->owned is freed on failure. */
int ff_resize(const FFImage *src, int out_w, int out_h, int filter, const double box[4], double reducing_gap,
              int flavour, FFResized *result, const char **message);

void ff_resized_free(FFResized *result);

#endif
