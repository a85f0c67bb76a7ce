"""Natural-photograph benchmark sets, made once from photographs that ship in registry packages.

Sources (all real photographs, none synthetic):

- scikit-image 0.26.0's ``skimage/data`` (its wheel, fetched with ``pip download --no-deps``,
  read as a zip; nothing is installed): astronaut, chelsea, coffee, hubble_deep_field,
  ihc, motorcycle_left, motorcycle_right, retina, rocket (colour photographs, 0.14 to 2.0 MP);
- matplotlib's ``mpl-data/sample_data/grace_hopper.jpg`` (already in the environment).

Two sets are built from them, deterministic for a seed:

- ``imagenet``: ImageNet-like variants: a random crop of 45 to 100 % of a photo's area
  (aspect 3:4 to 4:3), resized (Lanczos) so its shorter side is 300 to 500 px, JPEG quality
  75 to 95, 4:2:0, as ImageNet's JPEGs are;
- ``highres``: 2 to 14 megapixel JPEGs (quality 90): mosaics of the photos at their native
  scale (each tile a random crop, scaled by 1.0 to 1.6, more where a row is taller than the photo), so pixel statistics stay those of
  photographs, at the sizes where reduced-size (DCT-scaled) decoding applies.

Ten source photographs are few: crops, scales and qualities vary, but content repeats.
"""

from __future__ import annotations

import io
import random
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from PIL import Image

from feedfast import _env
from feedfast.shards.index.tarindex import load_index

SKIMAGE = "scikit-image==0.26.0"
SKIMAGE_PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "hubble_deep_field.jpg", "ihc.png",
                  "motorcycle_left.png", "motorcycle_right.png", "retina.jpg", "rocket.jpg")


def source_photos(cache: Path) -> list[tuple[str, Image.Image]]:
    """The source photographs as RGB images, by name (the wheel is downloaded once into ``cache``)."""
    folder = cache / "photo-sources"
    folder.mkdir(parents=True, exist_ok=True)
    wheels = sorted(folder.glob("scikit_image-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                        SKIMAGE, "-d", str(folder)], check=True)
        wheels = sorted(folder.glob("scikit_image-*.whl"))
    photos = []
    with zipfile.ZipFile(wheels[-1]) as wheel:
        for name in SKIMAGE_PHOTOS:
            photos.append((name, Image.open(io.BytesIO(wheel.read(f"skimage/data/{name}"))).convert("RGB")))
    import matplotlib

    hopper = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    photos.append((hopper.name, Image.open(hopper).convert("RGB")))
    return photos


def _imagenet_like(rng: random.Random, photo: Image.Image) -> Image.Image:
    w, h = photo.size
    for _ in range(20):
        area = w * h * rng.uniform(0.45, 1.0)
        aspect = rng.uniform(3 / 4, 4 / 3)
        cw, ch = int(round((area * aspect) ** 0.5)), int(round((area / aspect) ** 0.5))
        if cw <= w and ch <= h:
            break
    else:
        cw, ch = w, h
    left, top = rng.randint(0, w - cw), rng.randint(0, h - ch)
    crop = photo.crop((left, top, left + cw, top + ch))
    short = rng.randint(300, 500)
    scale = short / min(cw, ch)
    return crop.resize((max(1, round(cw * scale)), max(1, round(ch * scale))), Image.LANCZOS)


def _mosaic(rng: random.Random, photos: list[Image.Image]) -> Image.Image:
    megapixels = rng.uniform(2.0, 14.0)
    aspect = rng.choice((4 / 3, 3 / 2, 16 / 9))
    width = int((megapixels * 1e6 * aspect) ** 0.5)
    height = int(megapixels * 1e6 / width)
    if rng.random() < 0.3:
        width, height = height, width  # portrait
    canvas = Image.new("RGB", (width, height))
    y = 0
    while y < height:
        row_h = rng.randint(300, 900)
        x = 0
        while x < width:
            photo = rng.choice(photos)
            scale = max(rng.uniform(1.0, 1.6), row_h / photo.height)  # tiles fill the row: no flat gaps
            src_w, src_h = min(photo.width, int(rng.randint(300, 1100) / scale)), int(row_h / scale)
            left, top = rng.randint(0, photo.width - src_w), rng.randint(0, photo.height - src_h)
            tile = photo.crop((left, top, left + src_w, top + src_h)).resize((round(src_w * scale), row_h),
                                                                             Image.LANCZOS)
            canvas.paste(tile, (x, y))
            x += tile.width
        y += row_h
    return canvas


def _encode(img: Image.Image, quality: int) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality, subsampling="4:2:0")
    return buf.getvalue()


def photo_dataset(kind: str, *, samples: int, per_shard: int, seed: int = 0, cache_dir: Path | None = None) -> list[str]:
    """Shard paths of a natural-photo set (``imagenet`` or ``highres``), written and indexed once."""
    cache = cache_dir or _env.cache_dir()
    out = cache / f"photos-{kind}-{samples}-{per_shard}-{seed}"
    paths = [out / f"train-{i:04d}.tar" for i in range(-(-samples // per_shard))]
    if (out / "COMPLETE").exists():
        return [str(p) for p in paths]
    print(f"making {samples} {kind} JPEGs from natural photographs in {out} (once) ...", flush=True)
    photos = source_photos(cache)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"{kind}/{seed}")
    for s, path in enumerate(paths):
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(s * per_shard, min(samples, (s + 1) * per_shard)):
                label = rng.randrange(len(photos))
                if kind == "imagenet":
                    jpeg = _encode(_imagenet_like(rng, photos[label][1]), rng.randint(75, 95))
                else:
                    jpeg = _encode(_mosaic(rng, [p for _, p in photos]), 90)
                for ext, data in (("jpg", jpeg), ("cls", str(label).encode())):
                    info = tarfile.TarInfo(f"{i:08d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        load_index(path, cache)
    (out / "COMPLETE").write_text("ok\n", encoding="utf-8")
    return [str(p) for p in paths]
