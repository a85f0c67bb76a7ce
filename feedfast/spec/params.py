"""Checking one op's parameters against the registry's declarations."""

from __future__ import annotations

from typing import Any

from feedfast.errors import SpecError
from feedfast.ops.base import OpDef, Param
from feedfast.ops.registry import suggest


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _in_bounds(p: Param, v: float) -> bool:
    return (p.low is None or v >= p.low) and (p.high is None or v <= p.high)


def coerce(p: Param, v: Any) -> Any:
    """Return ``v`` in its canonical form for ``p``, or raise ValueError."""
    t = p.type
    if t == "int":
        ok = isinstance(v, int) and not isinstance(v, bool) and _in_bounds(p, v)
        return _ok(ok, v)
    if t == "float":
        return _ok(_is_num(v) and _in_bounds(p, float(v)), float(v) if _is_num(v) else v)
    if t == "bool":
        return _ok(isinstance(v, bool), v)
    if t == "str":
        return _ok(isinstance(v, str) and (not p.choices or v in p.choices), v)
    if t == "size":
        if isinstance(v, int) and not isinstance(v, bool):
            return _ok(_in_bounds(p, v), v)
        ok = isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, int) and _in_bounds(p, x) for x in v)
        return _ok(ok, tuple(v) if ok else v)
    if t in ("range", "angle"):
        if t == "angle" and _is_num(v):
            v = (-abs(float(v)), abs(float(v)))
        ok = isinstance(v, (list, tuple)) and len(v) == 2 and all(_is_num(x) and _in_bounds(p, x) for x in v)
        ok = ok and v[0] <= v[1]
        return _ok(ok, (float(v[0]), float(v[1])) if ok else v)
    if t == "floats3":
        if _is_num(v):
            v = [v]
        ok = isinstance(v, (list, tuple)) and len(v) in (1, 3) and all(_is_num(x) and _in_bounds(p, x) for x in v)
        return _ok(ok, tuple(float(x) for x in v) if ok else v)
    if t == "fill":
        if isinstance(v, str):
            return _ok(v in p.choices, v)
        if _is_num(v):
            v = [v]
        ok = isinstance(v, (list, tuple)) and len(v) in (1, 3) and all(_is_num(x) and _in_bounds(p, x) for x in v)
        return _ok(ok, tuple(float(x) for x in v) if ok else v)
    raise ValueError(f"unknown parameter type {t}")


def _ok(ok: bool, v: Any) -> Any:
    if not ok:
        raise ValueError(v)
    return v


def check_params(op: OpDef, given: Any, *, file: str, key: str) -> dict[str, Any]:
    """Validate ``given`` (a mapping or None) for ``op`` and fill in the defaults.

    Raises:
        SpecError: an unknown parameter, or a value of the wrong type or out of range.
    """
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise SpecError(
            f"parameters of `{op.name}` must be a mapping", file=file, key=key, value=given,
            fix=f"write `- {op.name}: {{{', '.join(p.name + ': ...' for p in op.params[:2])}}}`",
        )
    names = [p.name for p in op.params]
    for name in given:
        if name not in names:
            hint = suggest(str(name), names)
            raise SpecError(
                f"unknown parameter of `{op.name}`", file=file, key=f"{key}.{name}", value=name,
                allowed=", ".join(names) or "no parameters", fix=hint or f"remove `{name}`",
            )
    out: dict[str, Any] = {}
    for p in op.params:
        if p.name not in given:
            out[p.name] = p.default
            continue
        try:
            out[p.name] = coerce(p, given[p.name])
        except ValueError:
            raise SpecError(
                f"bad value for `{op.name}.{p.name}` ({p.doc})", file=file, key=f"{key}.{p.name}",
                value=given[p.name], allowed=p.allowed(), fix=f"the default is {p.default!r}",
            ) from None
    return out
