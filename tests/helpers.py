"""Shared test helpers: tiny shards and specs, and ranks in spawned processes."""

from __future__ import annotations

import json
import multiprocessing as mp
import socket
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

from feedfast.write.synth import synth_shards

SMALL_SPEC: dict[str, Any] = {
    "version": 1,
    "name": "small-train",
    "pipeline": {
        "image": ["decode", {"random_resized_crop": {"size": 32}}, {"flip": {"horizontal": 0.5}}, "normalize"],
        "label": ["label"],
    },
    "outputs": ["image", "label"],
    "batch": {"size": 4},
    "seed": 3,
}


def make_shards(out: Path, *, samples: int, per_shard: int, seed: int = 1) -> list[str]:
    """Small real JPEG shards (64 to 96 px), labels in 0..9."""
    paths = synth_shards(out, samples=samples, per_shard=per_shard, seed=seed, min_side=64, max_side=96,
                         num_classes=10)
    return [str(p) for p in paths]


def shard_with_bad_sample(out: Path, good: bytes, bad: bytes) -> str:
    """``out/broken-0000.tar``: samples a, b, bad, c (``.jpg`` and ``.cls``), where ``bad`` holds ``bad``."""
    import io
    import tarfile

    path = out / "broken-0000.tar"
    with tarfile.open(path, "w") as tar:
        for key, data in (("a", good), ("b", good), ("bad", bad), ("c", good)):
            for ext, payload in (("jpg", data), ("cls", b"1")):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return str(path)


def unindexed_shards(out: Path) -> list[str]:
    """23 samples in 5 shards (5, 5, 5, 5, 3) in ``out``, with no index files beside them (as remote shards come)."""
    paths = make_shards(out, samples=23, per_shard=5)
    for idx in out.glob("*.idx"):
        idx.unlink()
    return paths


def labels_of(shards: list[str]) -> dict[str, int]:
    """Each sample key's label, read from the tars' ``.cls`` members."""
    import tarfile

    out = {}
    for path in shards:
        with tarfile.open(path) as tar:
            for member in tar:
                if member.name.endswith(".cls"):
                    out[member.name[:-4]] = int(tar.extractfile(member).read())  # type: ignore[union-attr]
    return out


def state_after(loader: Any, stop: int) -> dict[str, Any]:
    """The loader's state after ``stop`` batches taken epoch after epoch, through JSON as a checkpoint file holds it."""
    import json

    taken, it = 0, iter(loader)
    while taken < stop:
        try:
            next(it)
            taken += 1
        except StopIteration:
            it = iter(loader)
    return json.loads(json.dumps(loader.state_dict()))


def keys_of_epoch(loader: Any) -> list[str]:
    """The real (non-padded) sample keys one epoch of ``loader`` yields."""
    keys: list[str] = []
    for _ in loader:
        keys += [k for _, k in loader.last_origins[: loader.last_valid]]
    return keys


class FakeStream:
    """A stand-in CUDA stream for the device layer: it logs what it was told to wait for."""

    def __init__(self, gpu: "FakeGpu", name: str) -> None:
        self.gpu, self.name = gpu, name

    def wait_stream(self, other: "FakeStream") -> None:
        self.gpu.log.append(("wait_stream", self.name, other.name))

    def wait_event(self, event: "FakeEvent") -> None:
        self.gpu.log.append(("wait_event", self.name, event.id))

    def synchronize(self) -> None:
        self.gpu.log.append(("synchronize", self.name))

    def __repr__(self) -> str:
        return f"FakeStream({self.name})"


class FakeEvent:
    """A stand-in CUDA event: complete when the fake GPU says so (at once when ``auto``)."""

    def __init__(self, gpu: "FakeGpu") -> None:
        self.gpu, self.id, self.done, self.stream = gpu, len(gpu.events), False, ""
        gpu.events.append(self)

    def record(self, stream: FakeStream | None = None) -> None:
        self.gpu.note_use()
        self.stream = stream.name if stream is not None else self.gpu.active
        self.done = self.gpu.auto
        self.gpu.log.append(("record", self.stream, self.id))

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.gpu.log.append(("host_sync", self.id))
        self.done = True


class FakeGpu:
    """A stand-in device layer (see ``feedfast.loader.devices.DeviceLayer``) that records the order of stream work.

    Device tensors are CPU tensors; ``copy_in`` clones on the active stream and logs it.
    With ``auto=False`` events stay pending until :meth:`complete` is called.

    It also stands in for each thread's current CUDA device (0 on a thread that did not call
    :meth:`bind_thread`, as with CUDA): every copy and event record notes the calling thread's
    current device in ``used_devices``, the spy for "the producer thread sets its device first".
    """

    cuda = True

    def __init__(self, auto: bool = True) -> None:
        import threading

        import torch

        self.device = torch.device("cuda", 0)
        self.auto = auto
        self.log: list[tuple[Any, ...]] = []
        self.events: list[FakeEvent] = []
        self.training = FakeStream(self, "training")
        self.streams = 0
        self.active = "training"
        self._current = threading.local()
        self.used_devices: list[tuple[str, int]] = []  # (thread name, its current device) at each copy and record

    def bind_thread(self) -> None:
        self._current.index = self.device.index

    def current_device(self) -> int:
        """The calling thread's current device: 0 until it binds, as a new CUDA thread's is."""
        return int(getattr(self._current, "index", 0))

    def note_use(self) -> None:
        import threading

        self.used_devices.append((threading.current_thread().name, self.current_device()))

    def new_stream(self) -> FakeStream:
        self.streams += 1
        return FakeStream(self, f"side{self.streams}")

    def current_stream(self) -> FakeStream:
        return self.training

    def new_event(self) -> FakeEvent:
        return FakeEvent(self)

    def on(self, stream: FakeStream) -> Any:
        import contextlib

        gpu = self

        @contextlib.contextmanager
        def ctx() -> Any:
            before, gpu.active = gpu.active, stream.name
            try:
                yield stream
            finally:
                gpu.active = before

        return ctx()

    def host_buffer(self, numel: int, dtype: Any, pin: bool) -> Any:
        import torch

        return torch.empty(numel, dtype=dtype)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        import torch

        return torch.empty(shape, dtype=dtype)

    def copy_in(self, host: Any) -> Any:
        self.note_use()
        self.log.append(("copy", self.active, host.data_ptr()))
        return host.clone()

    def keep_for(self, tensor: Any, stream: FakeStream) -> None:
        self.log.append(("keep", stream.name))

    def complete(self, upto: int | None = None) -> None:
        """Finish the work of every event (or of events with id < ``upto``)."""
        for e in self.events:
            if upto is None or e.id < upto:
                e.done = True


ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 (for gloo's rendezvous or a launcher's master port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_report(out: str | Path, rank: int, body: Callable[[], Any]) -> None:
    """In a spawned rank: ``body()``'s result as JSON in ``out/rank{rank}.json``, or its traceback in ``.error``."""
    try:
        Path(out, f"rank{rank}.json").write_text(json.dumps(body()))
    except BaseException:
        Path(out, f"rank{rank}.error").write_text(traceback.format_exc())
        raise


def spawn_ranks(target: Callable[..., None], world: int, out: Path, args: Callable[[int], tuple[Any, ...]], *,
                timeout_s: float) -> list[Any]:
    """``target(*args(rank))`` for each rank in a fresh spawned process; each rank's :func:`rank_report` JSON.

    Fails (does not hang) when a rank is still running after ``timeout_s``, reported an error
    or exited non-zero; a rank still running is killed.
    """
    if str(ROOT) not in sys.path:  # the children import the test module by name
        sys.path.insert(0, str(ROOT))
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=args(r)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout_s)
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        errors = {r: (out / f"rank{r}.error").read_text() for r in range(world) if (out / f"rank{r}.error").exists()}
        assert not hung, f"ranks {hung} of {world} still running after {timeout_s} s; errors: {errors}"
        assert not errors, f"ranks failed: {errors}"
        assert [p.exitcode for p in procs] == [0] * world
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]



EXTRA_OF = {"torchvision": "compare", "timm": "test", "accelerate": "test"}
"""The extra that installs each optional peer the tests compare against."""


def _absent(top: str) -> str:
    return (f"{top} is not installed: the `{EXTRA_OF.get(top, 'test')}` extra (make setup's small set, for a disk "
            "under 9 GB free, leaves it out)")


def extra(module: str) -> Any:
    """Import ``module`` of an optional peer (torchvision, timm, Accelerate), or skip the test naming its extra.

    ``make setup`` installs them all where the disk holds the full set; its small set (under 9 GB free: torch's CPU
    build, no torchvision beside it) leaves them out, and what they check is then skipped, said as such.
    """
    import pytest

    return pytest.importorskip(module, reason=_absent(module.split(".")[0]))


def needs(top: str) -> Any:
    """Mark a test whose code path imports the optional peer ``top`` inside feedfast: skipped, named, without it."""
    import importlib.util

    import pytest

    return pytest.mark.skipif(importlib.util.find_spec(top) is None, reason=_absent(top))


def image_tree(root: Path, *, empty_class: bool = False) -> Path:
    """An image folder with everything torchvision's ImageFolder has a rule for, or none: nested folders sorted
    by whole path (``a b`` before ``a/``), odd names (spaces, unicode, dots, upper-case endings), hidden files,
    hidden folders and a hidden class, non-image files, a linked folder and a broken link; ``empty_class`` adds a
    class with no image. File ``i`` holds ``i + 1`` bytes of its own path (the files are read back in tests)."""
    names = [
        "cat/1.jpg", "cat/a/x.JPG", "cat/a b/y.png", "cat/a/b/z.jpeg", "cat/a.b/q.webp", "cat/.hidden.jpg",
        "cat/.cache/h.png", "cat/notes.txt", "cat/x.jpg.txt", "cat/.jpg", "cat/jpg", "cat/Z.TIFF",
        "dog/café ü.jpg", "dog/with space.jpeg", "dog/a.b.c.PnG", "dog/deep/er/est/d.bmp", "dog/README",
        "Dog/upper.jpg", ".hidden_class/h.jpg", "zebra 2/ü/z.pgm", "zebra 2/z.ppm", "top.jpg",
    ]
    for i, name in enumerate(names):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes((name.encode() * (i + 2))[: i + 1])
    (root / "dog" / "linked").symlink_to(root / "cat" / "a", target_is_directory=True)
    (root / "cat" / "dangling.jpg").symlink_to(root / "nowhere.jpg")
    if empty_class:
        (root / "empty").mkdir()
        (root / "empty" / "readme.txt").write_text("no images here")
    return root


def age_tree(root: Path, seconds: float = 3600) -> None:
    """Set every folder's (and file's) times ``seconds`` into the past: a listing of a tree just written is not
    cached (its folders changed too recently to be trusted), one of an aged tree is."""
    import os
    import time

    when = time.time() - seconds
    for folder, _dirs, files in os.walk(root):
        for name in files:
            if os.path.exists(os.path.join(folder, name)):
                os.utime(os.path.join(folder, name), (when, when))
        os.utime(folder, (when, when))
