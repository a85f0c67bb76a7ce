"""Synthetic photo-like JPEG images and WebDataset shards for benchmarks and tests.

Images are built to cost about as much to decode as photographs: smooth multi-colour
gradients, soft-edged filled shapes, a few high-frequency pattern patches and mild grain.
Shards are deterministic: the same arguments give byte-identical tar files.

Index files are not written here; ``feedfast.shards.index.tarindex`` builds them from the paths
:func:`synth_shards` returns.
"""

from __future__ import annotations

import io
import os
import pathlib
import tarfile

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from feedfast.errors import UserError

_GRAIN_RANGE = (6.0, 17.0)
"""Per-image grain amplitude bounds: grain is uniform in ``[-amp, amp]`` 8-bit levels."""

_TEXTURE_RANGE = (10, 48)
"""Per-image bounds of the mid-frequency texture's peak amplitude, in 8-bit levels."""

_TEXTURE_CELL = 3
"""Mid-frequency texture is random noise at 1/_TEXTURE_CELL resolution, upscaled."""


def _noise_image(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A ``width`` x ``height`` RGB image of uniform random bytes drawn from ``rng``."""
    data = rng.bytes(width * height * 3)
    return Image.frombytes("RGB", (width, height), data)


def _gradient(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """Smooth multi-colour gradient: a coarse grid of random colours upscaled bicubically."""
    grid = int(rng.integers(2, 5))
    coarse = _noise_image(rng, grid, grid)
    return coarse.resize((width, height), Image.BICUBIC)


def _texture(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """Mid-frequency texture with zero mean and a random amplitude; int16 HxWx3."""
    small = _noise_image(rng, max(width // _TEXTURE_CELL, 1), max(height // _TEXTURE_CELL, 1))
    smooth = np.asarray(small.resize((width, height), Image.BILINEAR), dtype=np.int16)
    smooth -= 128
    smooth *= int(rng.integers(*_TEXTURE_RANGE))
    smooth >>= 7
    return smooth


def _grain(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Uniform per-pixel grain of a random amplitude; int16 array of ``shape``."""
    amplitude = rng.uniform(*_GRAIN_RANGE)
    table = np.round(np.linspace(-amplitude, amplitude, 256)).astype(np.int16)
    raw = np.frombuffer(rng.bytes(int(np.prod(shape))), dtype=np.uint8).reshape(shape)
    return table[raw]


def _random_color(rng: np.random.Generator) -> tuple[int, int, int]:
    """A random RGB colour."""
    r, g, b = (int(v) for v in rng.integers(0, 256, size=3))
    return (r, g, b)


def _draw_shapes(rng: np.random.Generator, img: Image.Image, count: int) -> None:
    """Draw ``count`` random ellipses, polygons and rectangles onto ``img`` in place."""
    width, height = img.size
    draw = ImageDraw.Draw(img)
    for _ in range(count):
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        rx = rng.uniform(0.05, 0.35) * width
        ry = rng.uniform(0.05, 0.35) * height
        box = (cx - rx, cy - ry, cx + rx, cy + ry)
        kind = int(rng.integers(0, 3))
        color = _random_color(rng)
        if kind == 0:
            draw.ellipse(box, fill=color)
        elif kind == 1:
            draw.rectangle(box, fill=color)
        else:
            n = int(rng.integers(3, 8))
            angles = np.sort(rng.uniform(0, 2 * np.pi, size=n))
            radii = rng.uniform(0.4, 1.0, size=n)
            points = [
                (float(cx + rx * r * np.cos(a)), float(cy + ry * r * np.sin(a)))
                for a, r in zip(angles, radii)
            ]
            draw.polygon(points, fill=color)


def _pattern_patches(rng: np.random.Generator, canvas: np.ndarray, count: int) -> None:
    """Add ``count`` elliptical high-frequency stripe patches to int16 ``canvas`` in place."""
    height, width, _ = canvas.shape
    for _ in range(count):
        pw = int(rng.integers(max(width // 8, 1), max(width // 3, 2)))
        ph = int(rng.integers(max(height // 8, 1), max(height // 3, 2)))
        x0 = int(rng.integers(0, max(width - pw, 1)))
        y0 = int(rng.integers(0, max(height - ph, 1)))
        ys = np.arange(ph, dtype=np.float32)[:, None]
        xs = np.arange(pw, dtype=np.float32)[None, :]
        fx, fy = rng.uniform(0.3, 1.5, size=2).astype(np.float32)
        stripes = np.sin(xs * fx + ys * fy)
        mask = ((xs - pw / 2) / (pw / 2)) ** 2 + ((ys - ph / 2) / (ph / 2)) ** 2 < 1.0
        amplitude = np.float32(rng.uniform(8, 25))
        patch = (stripes * mask * amplitude).astype(np.int16)[:, :, None]
        canvas[y0 : y0 + ph, x0 : x0 + pw] += patch


def make_image(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """Generate one photo-like RGB image.

    The image is a smooth multi-colour gradient with 4-9 blurred (soft-edged) filled shapes,
    1-4 high-frequency stripe patches, mid-frequency texture and mild uniform grain. A 400x350
    image encodes to roughly 30-65 KB (mean about 49 KB) as JPEG at quality 90, close to the
    54 KB measured on the ImageNet reference set.

    Args:
        rng: Source of randomness; the image is a pure function of its state.
        width: Image width in pixels, >= 1.
        height: Image height in pixels, >= 1.

    Returns:
        An RGB ``PIL.Image.Image`` of size ``(width, height)``.

    Raises:
        UserError: If ``width`` or ``height`` is below 1.
    """
    for name, value in (("width", width), ("height", height)):
        if value < 1:
            raise UserError(f"make_image: {name} must be >= 1, got {value!r}; pass a positive size")
    img = _gradient(rng, width, height)
    _draw_shapes(rng, img, int(rng.integers(4, 10)))
    radius = float(rng.uniform(0.8, 2.0)) * max(min(width, height) / 300.0, 0.25)
    canvas = np.asarray(img.filter(ImageFilter.GaussianBlur(radius)), dtype=np.int16)
    canvas += _texture(rng, width, height)
    _pattern_patches(rng, canvas, int(rng.integers(1, 5)))
    canvas += _grain(rng, canvas.shape)
    np.clip(canvas, 0, 255, out=canvas)
    return Image.fromarray(canvas.astype(np.uint8), "RGB")


_MAX_SAMPLES = 10**8
"""Keys carry an 8-digit global index, so sorted keys stay in write order below this."""


def _check(ok: bool, name: str, value: object, rule: str, fix: str) -> None:
    """Raise a ``UserError`` naming the argument, the value, the rule and the fix unless ``ok``."""
    if not ok:
        raise UserError(f"synth_shards: {name} must be {rule}, got {value!r}; {fix}")


def _validate(ints: dict[str, int], prefix: str) -> None:
    """Check the ``synth_shards`` arguments, raising ``UserError`` on the first bad one."""
    for name, value in ints.items():
        ok = isinstance(value, int) and not isinstance(value, bool)
        _check(ok, name, value, "an int", f"pass {name} as an int")
    n = ints
    rules = (
        ("samples", 1 <= n["samples"] < _MAX_SAMPLES, f"in [1, {_MAX_SAMPLES})", "pass e.g. 1000"),
        ("per_shard", n["per_shard"] >= 1, ">= 1", "pass e.g. 100"),
        ("seed", n["seed"] >= 0, ">= 0", "pass a non-negative seed"),
        ("min_side", n["min_side"] >= 1, ">= 1", "pass a positive short side like 300"),
        ("max_side", n["max_side"] >= n["min_side"], f">= min_side ({n['min_side']})",
         "raise max_side or lower min_side"),
        ("num_classes", n["num_classes"] >= 1, ">= 1", "pass e.g. 1000"),
        ("quality", 1 <= n["quality"] <= 100, "in [1, 100]", "pass e.g. 90"),
    )
    for name, ok, rule, fix in rules:
        _check(ok, name, n[name], rule, fix)
    ok = isinstance(prefix, str) and prefix != "" and not any(c in prefix for c in "./\\")
    _check(ok, "prefix", prefix, "a non-empty str without '.', '/' or '\\'", "pass e.g. 'train'")


def _sample_size(rng: np.random.Generator, min_side: int, max_side: int) -> tuple[int, int]:
    """ImageNet-like ``(width, height)``: short side uniform, aspect log-uniform in [3/4, 4/3]."""
    short = int(rng.integers(min_side, max_side + 1))
    aspect = float(np.exp(rng.uniform(0.0, np.log(4.0 / 3.0))))
    long = max(short, int(round(short * aspect)))
    return (long, short) if rng.random() < 0.5 else (short, long)


def _encode_sample(
    seed: int, index: int, min_side: int, max_side: int, num_classes: int, quality: int
) -> tuple[bytes, bytes]:
    """JPEG bytes and ASCII label bytes of sample ``index``, a pure function of its arguments."""
    rng = np.random.default_rng([seed, index])
    label = int(rng.integers(0, num_classes))
    width, height = _sample_size(rng, min_side, max_side)
    buffer = io.BytesIO()
    make_image(rng, width, height).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue(), str(label).encode("ascii")


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """Append one regular file with fixed metadata, so the tar bytes are reproducible."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def _write_shard(path: pathlib.Path, members: list[tuple[str, bytes]]) -> None:
    """Write ``members`` to a tar at ``path`` atomically (via ``path.tmp`` and ``os.replace``)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
            for name, data in members:
                _add_member(tar, name, data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # never leave a partial shard behind; the error propagates
        raise


def synth_shards(
    out_dir: str | os.PathLike[str],
    *,
    samples: int = 1000,
    per_shard: int = 100,
    seed: int = 0,
    min_side: int = 300,
    max_side: int = 500,
    num_classes: int = 1000,
    prefix: str = "train",
    quality: int = 90,
) -> list[pathlib.Path]:
    """Write deterministic synthetic WebDataset shards of photo-like JPEGs.

    Shard ``i`` is ``{out_dir}/{prefix}-{i:04d}.tar`` and holds up to ``per_shard`` samples
    (the last one may hold fewer). Sample ``g`` (global index) has key
    ``{prefix}-{g:08d}`` and two members, ``{key}.jpg`` then ``{key}.cls`` (the label in
    ASCII decimal, no newline). Keys are unique and sort in write order. Each image's short
    side is uniform in ``[min_side, max_side]``, its aspect ratio log-uniform in
    ``[3/4, 4/3]``, landscape or portrait with equal odds. Each sample depends only on
    ``(seed, g)``, and tar metadata is fixed, so the same arguments give byte-identical tars.
    No index files are written: pass the returned paths to ``feedfast.shards.index.tarindex``.

    Args:
        out_dir: Directory for the shards; created if missing.
        samples: Number of samples in total, in ``[1, 10**8)``.
        per_shard: Samples per shard, >= 1.
        seed: Seed for images, sizes and labels.
        min_side: Smallest short side in pixels, >= 1.
        max_side: Largest short side in pixels, >= ``min_side``.
        num_classes: Labels are uniform in ``[0, num_classes)``.
        prefix: Shard and key prefix; non-empty, without '.', '/' or '\\'.
        quality: JPEG quality in ``[1, 100]``.

    Returns:
        The shard paths, in shard order.

    Raises:
        UserError: If an argument is invalid or ``out_dir`` is not a directory.
    """
    ints = {"samples": samples, "per_shard": per_shard, "seed": seed, "min_side": min_side,
            "max_side": max_side, "num_classes": num_classes, "quality": quality}
    _validate(ints, prefix)
    root = pathlib.Path(out_dir)
    is_dir = not root.exists() or root.is_dir()
    _check(is_dir, "out_dir", str(root), "a directory", "pass a directory path")
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for shard, start in enumerate(range(0, samples, per_shard)):
        members: list[tuple[str, bytes]] = []
        for index in range(start, min(start + per_shard, samples)):
            jpg, cls = _encode_sample(seed, index, min_side, max_side, num_classes, quality)
            key = f"{prefix}-{index:08d}"
            members += [(f"{key}.jpg", jpg), (f"{key}.cls", cls)]
        path = root / f"{prefix}-{shard:04d}.tar"
        _write_shard(path, members)
        paths.append(path)
    return paths
