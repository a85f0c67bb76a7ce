"""A sample whose image PIL cannot decode, run again on DALI's pixels (both CPU backends).

When a sample's PIL program (or the threaded path's) fails, :func:`second_raw` finds the image
components PIL cannot decode and replaces each with DALI's pixels in the decode op's colour
(:mod:`feedfast.checks.second_decode`), as lossless PPM bytes that PIL opens at once; the
caller runs the sample again on them with the same draws (``SampleDraws.replay()``), so its
crops and flips are those of the first try. What DALI decodes is thereby delivered as the
DALI backend delivers it; what neither decodes raises with both decoders' reasons.
"""

from __future__ import annotations

from typing import Sequence

from feedfast.checks.second_decode import as_ppm, second_opinion
from feedfast.compile.pil import PilProgram
from feedfast.ops.generic import DecodeFailure
from feedfast.spec.model import CHECK_SECONDS


def image_decodes(program: PilProgram) -> list[tuple[int, str]]:
    """(component, colour) of each step that decodes a component's bytes into an image, read from the
    steps' declared signatures (encoded bytes in, an image out)."""
    steps = program.steps
    return [(s.inputs[0], str(s.params.get("color", "rgb"))) for s in steps
            if s.inputs and s.sig.kind == "image" and steps[s.inputs[0]].op == "read"
            and steps[s.inputs[0]].sig.kind == "encoded"]


def pil_failure(data: bytes) -> str | None:
    """Why PIL cannot decode ``data`` to pixels (``Type: message``), or None when it can."""

    from feedfast.checks.decoders import open_image, short, to_8bit

    try:
        img = open_image(data)
        img.load()
        to_8bit(img)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is PIL's answer
        return short(exc)
    return None


def second_raw(program: PilProgram, raw: Sequence[bytes], failure: BaseException, *,
               seconds: float = CHECK_SECONDS, decodes: list[tuple[int, str]] | None = None) -> list[bytes] | None:
    """The sample's components with DALI's pixels (PPM) in place of each non-empty image PIL cannot decode;
    None when PIL decodes them all (the failure is not an image's: re-raise it).

    Args:
        program: the sample's PIL program (its decode steps say which components are images, in what colour).
        raw: the components' bytes, in ``program.components`` order.
        failure: what the first try raised (its message leads the error when DALI fails too).
        seconds: the CPU time each DALI decode may take (the spec's ``source.check_seconds``).
        decodes: ``image_decodes(program)``, when the caller keeps it.

    Raises:
        DecodeFailure: DALI cannot decode such an image either: ``"<failure>; DALI: <reason>"``.
    """
    fixed = list(raw)
    done: set[int] = set()
    for component, color in image_decodes(program) if decodes is None else decodes:
        data = raw[component]
        if component in done or not data or pil_failure(data) is None:
            continue
        pixels, reason = second_opinion(bytes(data), color=color, seconds=seconds)
        if pixels is None:
            raise DecodeFailure(f"{failure}; {reason}") from None
        fixed[component] = as_ppm(pixels)
        done.add(component)
    return fixed if done else None
