"""One epoch of one rank on the CPU in threads: PIL (pillow-simd) decode and resize, no processes.

It yields what :func:`~feedfast.loader.backends.cpu.pil.run_pil_epoch` yields, sample for sample:
the same samples per step (:func:`~feedfast.loader.backends.cpu.pil.epoch_samples`, padding that
repeats the rank's last sample), the same :class:`~feedfast.loader.backends.dali.pipe.Batch` objects, the
same per-sample draws (:mod:`~feedfast.order.draws`, keyed by seed, epoch and sample) and so
the same crop boxes and flips, and the same :class:`~feedfast.errors.SampleError` naming shard and key.
Pixels agree with the ``pil`` backend within the tolerances stated in
``tests/test_thread_epoch.py``: equal where no reduced-size decoding applies, a grey level or
two on average where it does (see :mod:`feedfast.loader.backends.cpu.thread_sample`). One difference in
errors: a JPEG damaged only below the last row a crop reads is delivered (those rows are never
decoded), where the ``pil`` backend raises.

Why it is faster: PIL releases the GIL while it decodes and resizes, so ``workers`` threads
decode in parallel with no pickling and no copies between processes; each sample is read
with ``os.pread`` (from a remote shard: by range, on reader threads ahead of decoding, then
taken from memory, :mod:`feedfast.sources.rangeread`), decoded at reduced size when its crop
allows (JPEG DCT scaling) and cropped and resized in one call; its pixels are read from PIL's
memory without a copy where Pillow exports them, and written straight into the batch (flips
as reversed views), and ``normalize`` runs vectorized in NumPy as they are written, in the
thread that made them, while they are in cache (NumPy releases the GIL and starts no threads
of its own, where torch would start its intra-op threads in every worker thread). When the plan defers
``normalize`` to a CUDA consumer (the cheap-transfer pass), the field is yielded as uint8
HWC, as the DALI path leaves it before its copy.

Where a chunk's image chain can be planned (:mod:`~feedfast.loader.backends.cpu.batchplan`: one JPEG decode,
geometry ops and flips, host ops that draw nothing), its Python is per chunk, not per sample:
the components are read in one call, the geometry planned in C from the same draws, and the
pixels decoded, resized, flipped and normalized into the batch by the extension in one call
without the GIL (``sample_batch``; where its resize is not the installed Pillow's or not as
fast, Pillow resizes from the planned region); any sample the plan cannot take goes the per-sample
way below, and both give the same pixels bit for bit (``tests/test_batchplan.py``). On tiny
images this took one process from about 5,000 to 30,000 samples a second on one thread.

Work is queued in chunks of a batch; the steps up to ``prefetch_factor`` batches ahead of
the one being consumed are in flight. A spec with an image op that declares no threaded form (``OpDef.threaded``,
:data:`~feedfast.loader.backends.cpu.thread_sample.FAST_OPS`) runs the PIL program per sample in the same
threads (:func:`fast_path_supported` says which way a plan goes).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from feedfast import _env
from feedfast.compile.pil import PilProgram, PilStep, compile_pil, own_draws
from feedfast.compile.plan import Plan
from feedfast.errors import BackendError, FeedfastError, SampleError, ShardError
from feedfast.loader.backends.cpu import batchplan, native
from feedfast.loader.backends.cpu.pil_fast import REGION_MARGIN, JpegHeader, decode_region
from feedfast.loader.backends.cpu.samples import epoch_samples, failure_reason
from feedfast.loader.backends.cpu.second_run import image_decodes, second_raw
from feedfast.loader.backends.cpu.thread_sample import (
    REDUCING_GAP,
    NeedsFallback,
    View,
    fast_program,
    fast_program_blocker,
    fast_values,
    pixel_source,
    program_values,
    run_kernels,
    view_pixels,
)
from feedfast.loader.backends.dali import convert
from feedfast.loader.batch import Batch
from feedfast.loader.knobs import Knobs, LivePool
from feedfast.ops.color import normalize_tensor
from feedfast.ops.generic import DecodeFailure
from feedfast.ops.registry import OPS
from feedfast.order.deal import EpochPlan, step_positions
from feedfast.order.draws import SampleDraws, batch_draws, draws_key
from feedfast.order.rows import Rows
from feedfast.shards.index.columnar import Origins, RowBatch
from feedfast.sources.lostrows import lost_last
from feedfast.sources.members import Members, ShardMembers
from feedfast.sources.mixture import Dataset
from feedfast.sources.rangeread import StepReads, as_bytes, epoch_reads

_DTYPES = {"float32": torch.float32, "float16": torch.float16}


def fast_path_supported(plan: Plan) -> bool:
    """Whether every op of the plan's spec runs on the threaded fast path (else: PIL program per sample)."""
    return fast_path_blocker(plan) is None


def fast_path_blocker(plan: Plan) -> str | None:
    """Why the threaded fast path cannot run the plan's spec (naming the op), None when it can."""
    try:
        return fast_program_blocker(compile_pil(plan.spec))
    except BackendError as exc:
        return str(exc)


def chunk_way(plan: Plan) -> str:
    """How the threaded path makes a batch of this spec: planned per chunk in C, or per sample in Python (why)."""
    program = compile_pil(plan.spec)
    if not fast_program(program):
        return "per sample, the PIL program"
    if batchplan.ext is None:
        return "per sample in Python: feedfast._plan is not built"
    if batchplan.chain_of(program) is None:
        return "per sample in Python: the plan takes one image output made by decode, geometry ops and flips"
    chain = batchplan.chain_of(program)
    if chain is not None and chain.kernels:
        names = ", ".join(step.op for step in chain.kernels)
        made = "made in one call of the extension" if batchplan.one_call() else "resized by Pillow"
        return f"each chunk planned in C, its pixels {made}, then {names} on them in the worker threads"
    return "each chunk planned in C, " + ("its pixels made in one call of the extension" if batchplan.one_call()
                                          else "its pixels resized by Pillow")


@dataclass(frozen=True)
class _Field:
    """How one output field is batched: ``pixels`` (uint8 HWC, maybe normalized) or ``host`` values."""

    name: str
    kind: str
    hwc: tuple[int | None, ...] = ()
    normalize: dict[str, Any] | None = None
    host_kind: str = ""
    post: tuple[PilStep, ...] = ()
    """The tensor ops after ``normalize`` (``OpDef.threaded`` role ``tensor``), run on each normalized slot."""


def _fields(plan: Plan, program: PilProgram) -> list[_Field]:
    out = []
    for name, sid in program.outputs.items():
        step = program.steps[sid]
        norm, post, source = pixel_source(program, sid)
        if norm is not None:
            deferred = plan.nodes[plan.outputs[name]].deferred
            hwc = program.steps[source].sig.shape
            out.append(_Field(name, "pixels", hwc, None if deferred else norm.params, post=post))
        elif step.sig.kind == "image":
            out.append(_Field(name, "pixels", step.sig.shape))
        else:
            out.append(_Field(name, "host", host_kind=step.sig.kind))
    return out


_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


class _Buffers:
    """Batch tensors reused once nothing outside this module holds them.

    A fresh 38 MB batch costs thousands of page faults on first write (measured here: 7 to
    40 ms a batch of 64 float32 224 px images). Each batch is handed out as a view of a held
    tensor; while the caller keeps it, or any view of it, its storage is shared
    (``torch._C._storage_Use_Count`` above 2: the held tensor and the query's own reference),
    and it is not reused. Without that count (another torch), nothing is reused.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit if _USE_COUNT is not None else 0
        self.held: list[torch.Tensor] = []

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        count = _USE_COUNT
        for base in self.held:
            if count is not None and base.shape == shape and base.dtype == dtype and \
                    count(base.untyped_storage()._cdata) <= 2:
                return base[:]
        out = torch.empty(shape, dtype=dtype)
        if len(self.held) < self.limit:
            self.held.append(out)
        return out[:]


@dataclass
class _Job:
    """One batch in the making: its outputs, filled chunk by chunk by the pool's threads."""

    step: int
    rows: RowBatch
    origins: Origins
    draws: list[SampleDraws]
    valid: int
    outputs: dict[str, Any]
    pending: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    cancelled: bool = False
    lost: dict[int, tuple[str, str, str]] = field(default_factory=dict)  # rows whose shard was unreadable (skip)

    def finish_chunk(self, error: BaseException | None) -> bool:
        """Count a chunk done; True for the batch's last."""
        with self.lock:
            self.pending -= 1
            if error is not None and self.error is None:
                self.error = error
            if self.pending == 0 or error is not None:
                self.done.set()
            return self.pending == 0


class _Epoch:
    """The epoch's samples, files, pool work and batch assembly."""

    def __init__(self, plan: Plan, program: PilProgram, paths: tuple[str, ...], rows: Rows,
                 ep: EpochPlan, *, batch_size: int, knobs: Knobs, seed: int, epoch: int,
                 reads: StepReads | None = None, members: Members | None = None, skip_failed: bool = False) -> None:
        self.program, self.paths, self.rows, self.ep = program, paths, rows, ep
        self.batch_size, self.seed, self.epoch = batch_size, seed, epoch
        self.fields = _fields(plan, program)
        self.fast = fast_program(program)
        self.constants = {f.name: _constants(f.normalize, f.normalize["layout"] == "CHW")
                          for f in self.fields if f.normalize}
        self.flat = {name: (mean.ravel(), inv.ravel()) for name, (mean, inv) in self.constants.items()}
        self.knobs = knobs
        pixel_fields = sum(f.kind == "pixels" for f in self.fields)
        self.buffers = _Buffers(limit=pixel_fields * (knobs.max_prefetch + 3))  # in flight, the consumer's, a spare
        self.members = members or ShardMembers(paths)  # the dataset's reader of local bytes (sources/members.py)
        self.reads = reads  # remote shards: each step's bytes read ahead by range (sources/rangeread.py)
        # a sample that fails as it is read (images in place, checked when read) is lost, counted, under skip
        self.skip_failed = skip_failed
        # a shard unreadable mid-epoch loses its rows
        self.skip = skip_failed or (reads is not None and reads.source.skip)
        self.spare: dict[str, Any] | None = None
        self._local = threading.local()
        self.check_seconds, self.decodes = plan.spec.check_seconds, image_decodes(program)
        self.chain = batchplan.chain_of(program) if self.fast else None
        self.key = draws_key(seed, epoch)
        self.host_chains = _host_chains(program) if self.chain is not None else {}
        if self.chain is not None and set(program.outputs) != {self.chain.output, *self.host_chains}:
            self.chain = None  # an output the plan does not make (a component passed through as it is)
        # decided once an epoch, not per chunk; a chain with kernels has its uint8 pixels made in one call
        # into a scratch batch, runs its kernels on them, then writes them into the batch
        self.one_call = self.chain is not None and batchplan.one_call()

    def submit(self, pool: LivePool, step: int) -> _Job:
        batch = self.rows.take(step_positions(step, self.batch_size, self.ep.rank_samples, self.ep.batch_sizes[step]))
        n = len(batch.samples)
        outputs: dict[str, Any] = {}
        for f in self.fields:
            dims = [d for d in f.hwc if d is not None]
            if f.kind == "host" or len(dims) != 3:
                outputs[f.name] = [None] * n
            elif f.normalize is None:
                outputs[f.name] = self.buffers.take((n, *dims), torch.uint8)
            else:
                h, w, c = dims
                shape = (n, c, h, w) if f.normalize["layout"] == "CHW" else (n, h, w, c)
                outputs[f.name] = self.buffers.take(shape, _DTYPES[f.normalize["dtype"]])
        chunk = max(1, math.ceil(self.batch_size / (2 * self.knobs.threads)))
        starts = range(0, n, chunk)
        draws = batch_draws(seed=self.seed, epoch=self.epoch, samples=batch.draw_ids)
        job = _Job(step, batch, Origins(self.rows.index, self.paths, batch), draws, self.ep.valid[step], outputs,
                   len(starts))
        if self.reads is not None:
            self.reads.want(step)
        for a in starts:
            pool.submit(self._run_chunk, job, a, min(n, a + chunk))
        return job

    def result(self, job: _Job) -> Batch:
        job.done.wait()
        if self.reads is not None:
            self.reads.release(job.step)
        if job.error is not None:
            raise job.error
        if job.lost:
            _move_lost_last(job, self.spare or self._zeros(job))
        elif self.skip and job.valid:
            self.spare = {name: value[0].clone() if isinstance(value, torch.Tensor) else value[0]
                          for name, value in job.outputs.items()}  # what fills a batch all of whose rows are lost
        fields: dict[str, Any] = {}
        for f in self.fields:
            value = job.outputs[f.name]
            if f.kind == "host":
                value = convert.collate(value, f.host_kind)
            elif isinstance(value, list):  # pixels of varying size: stacked as the pil backend does
                value = torch.stack([torch.from_numpy(np.ascontiguousarray(v)) for v in value])
                value = normalize_tensor(value, f.normalize) if f.normalize else value
                for i in range(len(value) if f.post else 0):
                    self._post(value[i].numpy(), f, job.draws[i])
            fields[f.name] = value
        return Batch(fields, job.origins, job.valid, lost=tuple(job.lost.values()))

    def _zeros(self, job: _Job) -> dict[str, Any]:
        """What fills a batch all of whose rows are lost before any sample of the epoch was made: zeros (a label
        0; other host values None).

        Raises:
            ShardError: an output of varying size has no zeros to fill with; names the shard.
        """
        out: dict[str, Any] = {}
        for f in self.fields:
            if f.kind != "host" and not isinstance(job.outputs[f.name], torch.Tensor):
                shard, _, why = next(iter(job.lost.values()))
                raise ShardError(f"shard {shard!r} cannot be read ({why}), and output {f.name!r} has no fixed "
                                 "size to fill its rows with before a sample of the epoch was made")
            out[f.name] = 0 if f.kind != "host" or f.host_kind == "label" else None
        return out

    def _run_chunk(self, job: _Job, a: int, b: int) -> None:
        error: BaseException | None = None
        try:
            if not job.cancelled:
                self._fill(job, a, b)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consuming thread by result()
            error = exc
        if job.finish_chunk(error) and error is None and not job.cancelled:
            self.knobs.count_batch()

    def _fill(self, job: _Job, a: int, b: int) -> None:
        arrays = {name: out.numpy() for name, out in job.outputs.items() if isinstance(out, torch.Tensor)}
        lost = self._lost(job, a, b)
        planned = self._planned(job, a, b, arrays) if self.chain is not None else {}
        for i in range(a, b):
            if job.cancelled or job.error is not None:
                return
            if i in lost:
                continue  # filled and moved past the samples by result()
            values = planned.get(i)
            if values is None:
                try:
                    values = self._sample(job, i)
                except SampleError as exc:
                    if not self.skip_failed:
                        raise
                    with job.lock:
                        job.lost[i] = (exc.shard, exc.key, exc.reason)
                    continue
            for f in self.fields:
                value = values[f.name]
                if value is _WRITTEN:
                    pass
                elif f.name not in arrays:
                    job.outputs[f.name][i] = value
                elif f.normalize is None:
                    np.copyto(arrays[f.name][i], value)
                else:
                    self._normalize_into(arrays[f.name][i], value, f.name)
                if f.post and f.name in arrays:
                    self._post(arrays[f.name][i], f, job.draws[i])

    def _lost(self, job: _Job, a: int, b: int) -> dict[int, str]:
        """Rows ``a .. b`` whose shard could not be read, under skip (remote shards), recorded in the job with
        their (shard, key, reason)."""
        if self.reads is None or not self.reads.source.skip:
            return {}
        self.reads.chunk(job.step, a, b, count=False)  # waits for the rows' reads (counted when they are used)
        lost = self.reads.lost(job.step, a, b)
        if lost:
            with job.lock:
                for i, reason in lost.items():
                    shard, key = job.origins[i]
                    job.lost[i] = (shard, key, reason)
        return lost

    def _planned(self, job: _Job, a: int, b: int, arrays: dict[str, np.ndarray]) -> dict[int, dict[str, Any]]:
        """Rows ``a .. b`` of the batch whose image chain :mod:`.batchplan` planned, computed from the plan.

        Each component's bytes are read for the chunk at once, the image chain's geometry
        planned at once (:mod:`.batchplan`) and the host fields computed per field; then the
        pixels are made by the extension straight into the batch, the whole chunk in one call
        (``sample_batch``: decode, resize, flips, normalize; the value is then :data:`_WRITTEN`)
        where :func:`~feedfast.loader.backends.cpu.batchplan.one_call` says so, else by Pillow from the
        planned region. A sample the plan leaves out (or whose region does not decode, or whose
        host op fails) is not in the result: :meth:`_sample` takes it the Python way, from the
        same draws, and raises what is wrong.
        """
        from PIL import Image

        chain = self.chain
        assert chain is not None
        rows = job.rows
        raws: Sequence[Sequence[bytes | memoryview | None]]
        if self.reads is not None:  # remote shards: the bytes read ahead, from memory
            raws = self.reads.chunk(job.step, a, b)
        else:
            raws = self.members.chunk(rows, a, b)
        images = raws[chain.component]
        plans = batchplan.plan(chain, images, rows.draw_ids[a:b], self.key, Image.MAX_IMAGE_PIXELS)
        host = {name: _host_column(steps, raws) for name, steps in self.host_chains.items()}
        made = self._one_call(chain, images, plans, arrays, a, b)
        done, scratch = made if made is not None else (None, None)
        statuses = plans[:, batchplan.STATUS].tolist()
        out: dict[int, dict[str, Any]] = {}
        for j, status in enumerate(statuses):
            if status != batchplan.OK:
                continue
            values = {name: column[j] for name, column in host.items()}
            if any(v is _FAILED for v in values.values()):
                continue
            if done is not None and done[j] and scratch is None:
                values[chain.output] = _WRITTEN
            else:
                if done is not None and done[j]:
                    pixels = scratch[j]  # type: ignore[index]
                else:
                    pixels = self._pillow_pixels(chain, images[j], plans[j].tolist())
                if pixels is None:
                    continue
                if chain.kernels:
                    pixels = run_kernels(pixels, chain.kernels, job.draws[a + j].replay())
                values[chain.output] = pixels
            out[a + j] = values
        return out

    def _one_call(self, chain: batchplan.Chain, images: Sequence[bytes | memoryview | None], plans: np.ndarray,
                  arrays: dict[str, np.ndarray], a: int, b: int) -> tuple[list[bool], np.ndarray | None] | None:
        """The planned samples' pixels made by the extension in one call, where
        :func:`~feedfast.loader.backends.cpu.batchplan.one_call` said so for this epoch: which were (None: none was tried),
        and where: into the batch, or (a chain with kernels, which run on the uint8 pixels before they are
        written) into this thread's uint8 scratch of the chunk, returned with them."""
        target = arrays.get(chain.output)
        if target is None or not self.one_call:
            return None
        flavour = native.resample_flavour()
        assert native.ext is not None and flavour is not None
        mean, inv = self.flat.get(chain.output, (None, None))
        chw = chain.output in self.constants and self.constants[chain.output][0].ndim == 3  # as _normalize_into reads it
        scratch, rows = None, target[a:b]
        if chain.kernels:
            hwc = next(f.hwc for f in self.fields if f.name == chain.output)
            scratch = rows = self._pixel_scratch((b - a, *hwc))  # type: ignore[arg-type]
            mean, inv, chw = None, None, False
        done = np.zeros(b - a, dtype=np.int8)
        native.ext.sample_batch(images, plans, done, rows[0], rows, mean, inv, chain.gray, chw, REGION_MARGIN,
                                flavour, REDUCING_GAP)
        return done.astype(bool).tolist(), scratch

    def _pixel_scratch(self, shape: tuple[int, ...]) -> np.ndarray:
        """This thread's uint8 buffer of a chunk's pixels (the pixels a chain's kernels run on)."""
        buf = getattr(self._local, "pixels", None)
        if buf is None or buf.shape[1:] != shape[1:] or buf.shape[0] < shape[0]:
            buf = self._local.pixels = np.empty(shape, dtype=np.uint8)
        return buf[:shape[0]]

    def _pillow_pixels(self, chain: batchplan.Chain, raw: bytes | memoryview | None,
                       row: list[float]) -> np.ndarray | None:
        """A planned sample's pixels made by Pillow from its planned region (None: the region did not decode)."""
        assert raw is not None  # planned: read, and a JPEG
        header = JpegHeader((int(row[batchplan.WIDTH]), int(row[batchplan.HEIGHT])), "L" if chain.gray else "RGB")
        factor = int(row[batchplan.FACTOR])
        r, bx, sz, c = batchplan.REGION, batchplan.BOX, batchplan.SIZE, batchplan.CLIP
        region = decode_region(header, raw, factor, (int(row[r]), int(row[r + 1]), int(row[r + 2]), int(row[r + 3])))
        if region is None:
            return None
        resample = int(row[batchplan.RESAMPLE])
        view = View(chain.decode, (row[bx], row[bx + 1], row[bx + 2], row[bx + 3]), (int(row[sz]), int(row[sz + 1])),
                    (int(row[c]), int(row[c + 1]), int(row[c + 2]), int(row[c + 3])),
                    None if resample < 0 else resample, bool(row[batchplan.HFLIP]), bool(row[batchplan.VFLIP]))
        return view_pixels(region[0], view, float(factor), (region[1], region[2]))

    @staticmethod
    def _post(slot: np.ndarray, f: _Field, draws: SampleDraws) -> None:
        """The field's tensor ops (after ``normalize``) on one sample's slot of the batch, in place."""
        layout = f.normalize["layout"] if f.normalize else "HWC"
        for step in f.post:
            kernel = OPS[step.op].threaded.kernel  # type: ignore[union-attr]
            kernel(slot, {**step.params, "layout": layout}, own_draws(step, draws.replay()))  # type: ignore[misc]

    def _normalize_into(self, out: np.ndarray, pixels: np.ndarray, name: str) -> None:
        """``normalize`` of one image's uint8 HWC pixels into its slot of the batch.

        In one pass in feedfast's extension where it is built (:mod:`.native`), else in NumPy;
        both release the GIL and start no threads (torch would start its intra-op threads in
        every worker thread); the arithmetic is :func:`~feedfast.ops.color.normalize_tensor`'s, bit for bit.
        """
        mean, inv = self.constants[name]
        if native.normalize_into(pixels, out, *self.flat[name], mean.ndim == 3):
            return
        dst = out if out.dtype == np.float32 else self._scratch(out.shape)
        np.copyto(dst, pixels.transpose(2, 0, 1) if mean.ndim == 3 else pixels, casting="unsafe")
        np.subtract(dst, mean, out=dst)
        np.multiply(dst, inv, out=dst)
        if dst is not out:
            np.copyto(out, dst, casting="same_kind")

    def _scratch(self, shape: tuple[int, ...]) -> np.ndarray:
        """This thread's float32 buffer for one image (for outputs of another dtype)."""
        buf = getattr(self._local, "scratch", None)
        if buf is None or buf.shape != shape:
            buf = self._local.scratch = np.empty(shape, dtype=np.float32)
        return buf

    def _sample(self, job: _Job, i: int) -> dict[str, Any]:
        number = int(job.rows.shard[i])
        shard = self.paths[number]
        try:
            raw = self._raw(job, i)
            named = job.origins.lazy(i)  # PIL's warnings go to logging naming the sample (read if they come)
            try:
                if self.fast:
                    try:
                        return fast_values(self.program, raw, job.draws[i].replay(), sample=named)
                    except NeedsFallback:
                        pass  # this sample takes the PIL program, from the same draws
                return program_values(self.program, raw, job.draws[i].replay(), sample=named)
            except DecodeFailure as exc:  # an image PIL cannot read is delivered when DALI's decoder reads it
                fixed = second_raw(self.program, raw, exc, seconds=self.check_seconds, decodes=self.decodes)
                if fixed is None:
                    raise
                return program_values(self.program, fixed, job.draws[i].replay(), sample=named)
        except FeedfastError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever a decoder or plugin raises names the sample
            key = job.origins[i][1]
            raise SampleError("the threaded CPU backend could not process a sample", shard=shard, key=key,
                              reason=failure_reason(exc, shard, key)) from None

    def _raw(self, job: _Job, i: int) -> list[bytes]:
        """Row ``i``'s member bytes per component (``b""`` where it has no such member)."""
        if self.reads is not None:
            return [as_bytes(column[0]) for column in self.reads.chunk(job.step, i, i + 1)]
        return self.members.sample(job.rows, i)

    def close(self) -> None:
        """Close the shard files and stop the remote reads."""
        self.members.close()
        if self.reads is not None:
            self.reads.close()


_WRITTEN = object()
"""A planned sample's image value when its pixels were written into the batch already."""
_FAILED = object()
"""A host value that could not be computed by :func:`_host_column` (the Python way says why)."""


def _move_lost_last(job: _Job, spare: dict[str, Any]) -> None:
    """A batch with rows lost (their shard could not be read, under skip), made whole (:func:`lost_last`): each
    lost row a copy of the batch's first sample; in a batch with none left, of ``spare`` (each field's value of
    a sample of an earlier batch, or zeros before there was one: a label 0). A lost padding row is filled the
    same way and not counted: the sample it repeats is."""
    samples = job.valid
    order, fill, job.valid = lost_last(len(job.origins), samples, job.lost)
    for name, value in job.outputs.items():
        other = value[fill] if fill is not None else spare[name]
        if isinstance(value, torch.Tensor):
            for i in job.lost:
                value[i] = other
            job.outputs[name] = value[order]
        else:
            job.outputs[name] = [other if i in job.lost else value[i] for i in order]
    origins = list(job.origins)
    job.origins = [origins[i] for i in order]  # type: ignore[assignment]  # a lost row keeps its own name
    job.draws = [job.draws[i] for i in order]
    job.lost = {i: why for i, why in job.lost.items() if i < samples}


def _host_chains(program: PilProgram) -> dict[str, list[PilStep]]:
    """Each host output's steps, from the one after its component's read to the output."""
    chains = {}
    for name, sid in program.outputs.items():
        steps = []
        while program.steps[sid].op != "read":
            steps.append(program.steps[sid])
            sid = program.steps[sid].inputs[0]
        if steps and all(OPS[step.op].host for step in steps):
            chains[name] = steps[::-1]
    return chains


def _host_column(steps: list[PilStep], raws: Sequence[Sequence[bytes | memoryview | None]]) -> list[Any]:
    """A host field's values over a chunk: its steps (ops that draw nothing) from the component's bytes.

    A ``label`` read straight from its component takes a batch fast path where every label is
    plain ASCII digits (what ``label`` accepts, without its checks); any sample that fails is
    :data:`_FAILED`. A remote shard's members (memoryview slices of their request) are made
    ``bytes`` first: host ops parse them in Python.
    """
    column: list[Any] = [r if r is None or isinstance(r, bytes) else bytes(r) for r in raws[steps[0].inputs[0]]]
    if len(steps) == 1 and steps[0].op == "label":
        offset = steps[0].params["offset"]
        if all(r is not None and r.isdigit() and len(r) <= 18 for r in column):
            return [int(r) - offset for r in column]  # type: ignore[arg-type]
    values = []
    for value in column:
        try:
            for step in steps:
                if value is None:
                    break
                value = OPS[step.op].pil(value, step.params, None)  # type: ignore[misc, arg-type]
        except Exception:  # noqa: BLE001 - the Python way raises the error that names the sample
            value = None
        values.append(_FAILED if value is None else value)
    return values


def _constants(params: dict[str, Any], chw: bool) -> tuple[np.ndarray, np.ndarray]:
    """``normalize``'s mean and 1/std in pixel units as float32, shaped to broadcast over CHW or HWC."""
    mean = np.array([m * 255.0 for m in params["mean"]], dtype=np.float32)
    inv = np.array([1.0 / (s * 255.0) for s in params["std"]], dtype=np.float32)
    return (mean[:, None, None], inv[:, None, None]) if chw else (mean, inv)


def run_thread_epoch(plan: Plan, shards: Dataset, ep: EpochPlan, *, rank: int, world: int, batch_size: int,
                     workers: int | None, seed: int, epoch: int, start: int = 0,
                     prefetch_factor: int = 2, knobs: Knobs | None = None,
                     program: PilProgram | None = None) -> Iterator[Batch]:
    """Yield this rank's batches of the epoch from step ``start`` on, computed in threads.

    Args:
        plan: the loader's plan; its spec is recompiled as a PIL program (unfused, CPU), and a
            ``normalize`` the plan defers (consumer ``cuda``) is left to the consumer.
        shards: the dataset: opened shards (the (filtered) indexes and sizes ``open_shards`` gives DALI), or
            images in place (:mod:`feedfast.sources.folder`); its ``members`` reads local bytes.
        ep: this rank's epoch plan (shard order, steps, batch sizes, valid counts).
        rank, world: this rank and the world size.
        batch_size: the spec's batch size (the stride of steps in the rank's samples).
        workers: threads; 0 or None: the usable cores.
        seed, epoch: fix the shuffle and every sample's augmentation.
        start: the first step to yield (resume).
        prefetch_factor: batches in flight ahead of the one being consumed (at least 1).
        knobs: threads and batches in flight read live (:mod:`feedfast.loader.knobs`), in place
            of ``workers`` and ``prefetch_factor``; a change applies from the next chunk queued.
        program: the plan's spec as a PIL program, compiled once by the backend (None: compiled here).

    Raises:
        BackendError: an op has no PIL form (raised by the first ``next``), or a thread failed.
        SampleError: a sample could not be decoded; names the shard and key.
        ShardError: a shard or its index cannot be read.
    """
    program, rows = epoch_samples(plan, shards, ep, rank=rank, world=world, seed=seed, epoch=epoch, program=program)
    knobs = knobs or Knobs(threads=workers or _env.usable_cores(), prefetch=max(1, prefetch_factor))
    work = _Epoch(plan, program, shards.paths, rows, ep, batch_size=batch_size, knobs=knobs, seed=seed, epoch=epoch,
                  reads=epoch_reads(shards, rows, ep, batch_size=batch_size, skip=plan.spec.on_error == "skip",
                                    threads=knobs.max_threads),
                  members=shards.members(program.exts), skip_failed=shards.checks_when_read)
    pool = LivePool(knobs, name="feedfast-cpu")
    jobs: deque[_Job] = deque()
    submitted = start
    try:
        for step in range(start, ep.steps):
            while submitted < ep.steps and submitted <= step + knobs.prefetch:
                jobs.append(work.submit(pool, submitted))
                submitted += 1
            yield work.result(jobs.popleft())
    finally:
        for job in jobs:
            job.cancelled = True
        pool.shutdown()
        work.close()
