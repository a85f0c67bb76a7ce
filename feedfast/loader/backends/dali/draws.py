"""A step's draws for DALI's feed: each sample's crop window and flips, as the other backends draw them.

:mod:`feedfast.compile.dali_draws` says which of the graph's nodes take their draws as data; here they
are computed for a step from the bytes the feed read: in C for the whole step
(``feedfast._plan.plan_packed``: the JPEG's frame header, then the chain's draws keyed by (seed, epoch,
sample), the GIL released), and in Python for a sample the C plan cannot read (an image that is not a
JPEG: its size from its header through PIL, then the op's own rule on the same draws). A sample whose
size neither reads gets the window of its first pixel and a warning naming it: DALI fails such a
sample in most cases, and its failure is then rescued or named as any other.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import numpy as np

from feedfast.compile.dali_draws import FedDraws
from feedfast.ops import threaded as th
from feedfast.ops.registry import OPS
from feedfast.order.draws import SampleDraws, keyed_draws
from feedfast.sources.members import StepBytes

try:
    from feedfast import _plan
except ImportError:  # not built at install: every sample takes the Python walk
    _plan = None

log = logging.getLogger("feedfast.dali")

COLS, OK = th.PLAN_COLS, th.PLAN_OK
WIDTH, HEIGHT, BOX, HFLIP, VFLIP = th.COL_WIDTH, th.COL_HEIGHT, th.COL_BOX, th.COL_HFLIP, th.COL_VFLIP


class StepDraws:
    """One epoch's fed draws (``fed``, keyed by ``key``: :func:`~feedfast.order.draws.draws_key`)."""

    def __init__(self, fed: FedDraws, key: int) -> None:
        self.fed, self.key = fed, key

    def arrays(self, members: Any, draw_ids: np.ndarray, name: Callable[[int], tuple[str, str]]) -> list[np.ndarray]:
        """The step's fed outputs, after its components: anchor and shape (float32 [n, 2], x then y) of each
        window, then the horizontal and (unless folded) vertical flags (int32 [n]).

        Args:
            members: the step's images: a :class:`~feedfast.sources.members.StepBytes` (packed), or a list of
                arrays or buffers (one a sample; empty for none).
            draw_ids: what each sample's draws are keyed by (``RowBatch.draw_ids``).
            name: sample ``i``'s (shard, key), for a warning.
        """
        ids = np.ascontiguousarray(draw_ids, dtype=np.int64)
        rows = np.zeros((len(ids), COLS), dtype=np.float64)
        rows[:, 0] = -1
        if _plan is not None and isinstance(members, StepBytes):
            _plan.plan_packed(members.data, np.ascontiguousarray(members.starts), np.ascontiguousarray(members.sizes),
                              ids, self.key, self.fed.program, rows)
        elif _plan is not None:
            _plan.plan_batch(list(members), ids, self.key, self.fed.program, 0, rows, True)
        walked = np.flatnonzero(rows[:, 0] != OK)
        for i, draws in zip(walked.tolist(), keyed_draws(self.key, ids[walked]) if len(walked) else []):
            self._walk(i, _member(members, i), draws, rows[i], name)
        out: list[np.ndarray] = []
        if self.fed.window is not None:
            box = rows[:, BOX:BOX + 4].astype(np.float32)
            out += [np.ascontiguousarray(box[:, :2]), np.ascontiguousarray(box[:, 2:] - box[:, :2])]
        if self.fed.flip is not None:
            out.append(rows[:, HFLIP].astype(np.int32))
            if self.fed.flip_vertical:
                out.append(rows[:, VFLIP].astype(np.int32))
        return out

    def _walk(self, i: int, data: Any, draws: SampleDraws, row: np.ndarray,
              name: Callable[[int], tuple[str, str]]) -> None:
        """Sample ``i``'s row in Python: its size (from the C plan's header, else PIL's), the window op's
        rule and the flip's on its draws (the ops between them draw nothing)."""
        width, height = int(row[WIDTH]), int(row[HEIGHT])
        if width < 1 or height < 1:
            width, height = _size(data)
        row[BOX:BOX + 4] = (0, 0, 1, 1)
        if width < 1 or height < 1:
            shard, key = name(i)
            log.warning("shard %r, sample %r: neither libjpeg nor PIL reads its image's size; DALI is fed the "
                        "window of its first pixel", shard, key)
        elif self.fed.window is not None:
            form = OPS[self.fed.window_op].threaded
            geometry = form.geometry(width, height, self.fed.window_params, draws)  # type: ignore[union-attr,misc]
            left, top, w, h = geometry.crop if geometry is not None and geometry.crop else (0, 0, width, height)
            row[BOX:BOX + 4] = (left, top, left + w, top + h)
        if self.fed.flip is not None:
            flips = OPS[self.fed.flip_op].threaded.flips  # type: ignore[union-attr]
            row[HFLIP], row[VFLIP] = flips(self.fed.flip_params, draws)  # type: ignore[misc]


def _member(members: StepBytes | Sequence[Any], i: int) -> Any:
    return members.member(i) if isinstance(members, StepBytes) else members[i]


def _size(data: Sequence[int] | np.ndarray) -> tuple[int, int]:
    """(width, height) from the image's header as feedfast's PIL opener reads it; (0, 0) where it cannot (over
    twice Pillow's pixel limit included, which the other backends refuse as well)."""
    from feedfast.checks.decoders import open_image

    try:
        return tuple(open_image(bytes(data)).size)  # type: ignore[return-value]
    except Exception:  # noqa: BLE001 - any failure to read a header means: size unknown (named by the caller)
        return 0, 0
