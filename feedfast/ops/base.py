"""What an op is: its parameters, its output signature, and how each backend emits it.

An :class:`OpDef` is data. The registry (:mod:`feedfast.ops.registry`) is the one list of
them; validation, ``feedfast plan``, the generated spec reference and did-you-mean hints
all read it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Literal, Protocol, Sequence

if TYPE_CHECKING:
    from feedfast.ops.threaded import Threaded

Kind = Literal["encoded", "image", "tensor", "label", "json", "bytes", "array"]


class Rng(Protocol):
    """What augmentation ops draw from: a ``random.Random``, or a sample's counter-based draws
    (:class:`feedfast.order.draws.SampleDraws`)."""

    def random(self) -> float:
        """Uniform in [0, 1)."""
        ...

    def uniform(self, a: float, b: float) -> float:
        """Uniform in [a, b]."""
        ...

    def randint(self, a: int, b: int) -> int:
        """An integer in [a, b]."""
        ...


def stream_for(rng: Rng, n: int) -> Rng:
    """The ``n``-th independent stream of a sample's draws where ``rng`` has streams
    (:meth:`feedfast.order.draws.SampleDraws.stream`), else ``rng`` itself (a ``random.Random``)."""
    stream = getattr(rng, "stream", None)
    return stream(n) if stream is not None else rng


@dataclass(frozen=True)
class Signature:
    """What flows along an edge of the plan, per sample.

    Attributes:
        kind: ``encoded`` (bytes of an image file), ``image`` (decoded pixels), ``tensor``
            (normalized floats), ``label`` (int64 scalar), ``json``, ``bytes``, ``array``.
        shape: per-sample shape in ``layout`` order; ``None`` for an extent that varies.
        dtype: ``uint8``, ``float32``, ``float16``, ``int64``, or ``object`` for host data.
        layout: ``HWC``, ``CHW`` or ``""``.
        device: where the data lives after this node: ``cpu``, ``gpu`` or ``host``.
    """

    kind: Kind
    shape: tuple[int | None, ...] = ()
    dtype: str = "uint8"
    layout: str = ""
    device: str = "cpu"

    def with_(self, **changes: Any) -> "Signature":
        """A copy with some fields changed."""
        return replace(self, **changes)

    def describe(self) -> str:
        """A short human form, e.g. ``image uint8 HWC [?, ?, 3] @cpu``."""
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.kind} {self.dtype} {self.layout or '-'} [{dims}] @{self.device}"


class SignatureError(ValueError):
    """An op cannot take the signature it is given (raised by ``infer``; becomes a SpecError)."""


@dataclass(frozen=True)
class Param:
    """One parameter of an op, with what is allowed.

    Attributes:
        name: the key in the spec.
        type: ``int``, ``float``, ``bool``, ``str``, ``size`` (int or [h, w]), ``range``
            (two floats, low <= high), ``floats3`` (three floats), ``angle``
            (a float a, meaning [-a, a], or a range) or ``fill`` (one or three numbers, or one
            of ``choices``).
        default: the value when absent; ``REQUIRED`` when the spec must give it.
        doc: one line for the reference and ``--help``.
        low, high: inclusive bounds for numbers (and for each number of a range).
        choices: the allowed strings.
    """

    name: str
    type: str
    default: Any
    doc: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()

    def allowed(self) -> str:
        """A human description of the allowed values, used in errors and docs."""
        if self.type == "fill":
            words = " or ".join(repr(c) for c in self.choices)
            lo, hi = f"{self.low:g}", f"{self.high:g}"
            return f"a number or three in [{lo}, {hi}]" + (f", or {words}" if words else "")
        if self.choices:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        bounds = ""
        if self.low is not None or self.high is not None:
            lo = "-inf" if self.low is None else f"{self.low:g}"
            hi = "inf" if self.high is None else f"{self.high:g}"
            bounds = f" in [{lo}, {hi}]"
        return {
            "int": "an integer",
            "float": "a number",
            "bool": "true or false",
            "str": "a string",
            "size": "an integer or [height, width]",
            "range": "[low, high] with low <= high",
            "floats3": "a list of three numbers",
            "angle": "a number a (meaning [-a, a]) or [low, high]",
        }[self.type] + bounds


REQUIRED = object()


@dataclass(frozen=True)
class DaliForm:
    """A DALI emitter with the operator name(s) ``feedfast plan`` shows for it."""

    name: str
    emit: Callable[..., Any]


@dataclass(frozen=True)
class OpDef:
    """An op: name, parameters, signature rule, and one emitter per backend.

    Attributes:
        name: the op's name in specs; the registry's key.
        doc: one line for the reference.
        params: the parameters, in documentation order.
        infer: ``(input signature, params) -> output signature``; raises SignatureError.
        dali: emitter ``(ctx, node, inputs) -> DataNode`` or None when DALI cannot run it.
        pil: emitter ``(value, params, rng) -> value`` for the portable backend, or None.
        random: whether the op draws random numbers (never merged by CSE).
        devices: the placements DALI offers for it.
        dali_name: DALI operator name(s) for ``feedfast plan``.
        host: runs on the host after the DALI graph (generic ops on raw bytes).
        refuses: a host op that can refuse a sample's bytes (``DecodeFailure``): run on every
            sample when shards are opened under ``on_error: skip`` (:mod:`feedfast.checks.labels`).
        hw_effect: what the op does to a sample's (height, width), which the DALI emitters track
            (:mod:`feedfast.compile.shapes`): ``keep``, ``header`` (read from the encoded bytes), ``size`` (its ``size`` parameter), ``resize``
            (an integer ``size`` is the shorter side, ``[h, w]`` exact) or ``layout`` (no longer HW).
        threaded: its form on the threaded CPU path (:mod:`feedfast.ops.threaded`); None sends a
            spec holding it to the per-sample PIL program.
        dali_after_decode: the DALI form ``(ctx, decode params, params, x)`` of the op fused with
            the ``decode`` right before it (a region-of-interest decode), or None.
        absorbs: the ops that fold into this op's DALI form when they come right before it,
            nearest first (``normalize``: ``flip`` then ``center_crop``, as ``crop_mirror_normalize``).
        folds: for an op named in another's ``absorbs``: whether these parameters can fold.
        dali_folded: the emitter ``(ctx, {op: params}, x)`` of this op with what it absorbed.
        conditionals: whether its DALI form needs ``enable_conditionals`` (``nvidia.dali.auto_aug``).
        dali_refuses: ``params -> reason`` where DALI has no form for these parameters (else None):
            ``auto`` then leaves the spec to the threaded path.
        dali_draws: how its DALI form takes its draws as data fed per sample (:mod:`feedfast.compile.dali_draws`):
            ``window`` (a crop window of the decoded image: ``ctx.fed`` holds ``anchor`` and ``shape``) or
            ``flips`` (``horizontal`` and ``vertical``); None: it draws from DALI's generator.
    """

    name: str
    doc: str
    params: tuple[Param, ...]
    infer: Callable[[Signature, dict[str, Any]], Signature]
    dali: Callable[..., Any] | None = None
    pil: Callable[..., Any] | None = None
    random: bool = False
    devices: tuple[str, ...] = ("cpu", "gpu")
    dali_name: str = ""
    host: bool = False
    refuses: bool = False
    hw_effect: Literal["keep", "header", "size", "resize", "layout"] = "keep"
    threaded: "Threaded | None" = None
    dali_after_decode: DaliForm | None = None
    absorbs: tuple[str, ...] = ()
    folds: Callable[[dict[str, Any]], bool] | None = None
    dali_folded: Callable[..., Any] | None = None
    conditionals: bool = False
    dali_refuses: Callable[[dict[str, Any]], "str | None"] | None = None
    dali_draws: Literal["window", "flips"] | None = None


def as_hw(size: int | Sequence[int]) -> tuple[int, int]:
    """A ``size`` parameter as (height, width)."""
    if isinstance(size, int):
        return size, size
    return int(size[0]), int(size[1])


def positive_range(name: str, r: Sequence[float]) -> None:
    """Raise SignatureError unless the range ``r`` satisfies ``0 < low <= high``."""
    if r[0] <= 0 or r[0] > r[1]:
        raise SignatureError(f"`{name}` must satisfy 0 < low <= high, got {list(r)}")


def same_image(op: str, *, rgb: bool = False) -> Callable[[Signature, dict[str, Any]], Signature]:
    """The signature rule of an image op that keeps shape, type and layout (``rgb``: needs 3 channels)."""

    def infer(sig: Signature, p: dict[str, Any]) -> Signature:
        require(sig, kind=("image",), op=op)
        if rgb and sig.shape[2] not in (3, None):
            raise SignatureError(f"`{op}` needs an RGB image; `decode` has color: gray")
        return sig

    return infer


def require(sig: Signature, *, kind: Sequence[str], op: str, dtype: str | None = None) -> None:
    """Raise SignatureError unless ``sig`` is of one of ``kind`` (and ``dtype``)."""
    if sig.kind not in kind:
        wants = " or ".join(kind)
        raise SignatureError(
            f"`{op}` needs {wants} input but gets {sig.kind} ({sig.describe()})"
            + (": put `decode` first" if "image" in kind and sig.kind == "encoded" else "")
            + (": it must come before `normalize`" if sig.kind == "tensor" and "image" in kind else "")
        )
    if dtype and sig.dtype != dtype:
        raise SignatureError(f"`{op}` needs {dtype} input but gets {sig.dtype}")
