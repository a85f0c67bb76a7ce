"""Which backend runs a loader (``auto``: the threaded path where it applies, else DALI), and building it.

See :mod:`.base` for the backends and the interface they share.
"""

from __future__ import annotations

import logging

from feedfast.compile.plan import Plan
from feedfast.errors import UserError
from feedfast.loader.backends.base import Backend, BackendSettings
from feedfast.sources import rangeread
from feedfast.sources.mixture import Dataset
from feedfast.spec.runtime import BACKENDS

log = logging.getLogger("feedfast")


def backend_type(name: str) -> type[Backend] | None:
    """The class of backend ``name``, None for ``auto`` (or a name :func:`choose_backend` refuses)."""
    if name == "dali":
        from feedfast.loader.backends.dali.backend import DaliBackend

        return DaliBackend
    if name in ("threads", "pil"):
        from feedfast.loader.backends.cpu.program import PilBackend, ThreadsBackend

        return ThreadsBackend if name == "threads" else PilBackend
    return None


def make_backend(name: str, settings: BackendSettings) -> Backend:
    """The backend ``name`` (one :func:`choose_backend` gave), built from the loader's settings."""
    kind = backend_type(name)
    if kind is None:
        raise UserError(f"backend must be one of {', '.join(repr(b) for b in BACKENDS if b != 'auto')}, got {name!r}")
    return kind(settings)


def choose_backend(requested: str, plan: Plan, shards: Dataset) -> str:
    """The backend for ``requested`` (``auto``: ``threads`` where it applies, else ``dali``).

    ``threads`` and ``pil`` run on the CPU over shards with ranged reads (every kind feedfast
    opens: a ``pipe:`` shard is read from the shard cache); ``auto`` also needs every op of the
    spec on the threaded fast path and a PIL that imports (:func:`auto_backend` says why not,
    in a log line on ``feedfast`` at INFO and in ``feedfast plan``).
    """
    if requested not in BACKENDS:
        raise UserError(f"backend must be one of {', '.join(repr(b) for b in BACKENDS)}, got {requested!r}")
    chosen, why = (requested, "") if requested != "auto" else auto_backend(plan, shards)
    kind = backend_type(chosen)
    if kind is not None and shards.source_kind not in kind.sources:  # what a backend reads, it declares
        because = f" (auto chose it: {why})" if requested == "auto" else ""
        raise UserError(f"backend={chosen!r}{because} does not yet read images in place (a dataset of kind "
                        f"{shards.source_kind!r}: {shards.paths[0]!r}): use backend='threads' (placement='cpu'), "
                        f"or write shards with `feedfast shards make` to read them with backend={chosen!r}")
    if kind is not None and shards.checks_when_read and not kind.skips_as_read:
        because = f" (auto chose it: {why})" if requested == "auto" else ""
        raise UserError(f"backend={chosen!r}{because} reads images in place ({shards.paths[0]!r}) under "
                        "on_error: raise only: a file it cannot decode fails its batch, and is not skipped. Use "
                        "on_error: raise (a bad file is then named), backend='threads' (placement='cpu'), or write "
                        "shards with `feedfast shards make`, whose images are checked when they are opened")
    if requested in ("threads", "pil"):
        unranged = rangeread.unranged(shards.read_kinds)
        if unranged is not None:
            raise UserError(f"backend={requested!r} reads shards by byte range, and {unranged!r} shards have none: "
                            "read them through the shard cache, or use backend='dali'")
        if plan.placement != "cpu":
            raise UserError(f"backend={requested!r} runs on the CPU: use placement='cpu' (or backend='dali')")
        return requested
    if requested == "dali":
        return "dali"
    if chosen == "dali":  # the threaded path is the faster one on the CPU: say why it was not taken
        log.info("backend auto chose dali: %s", why)
    return chosen


def auto_backend(plan: Plan, shards: Dataset) -> tuple[str, str]:
    """The backend ``auto`` picks, and why (``feedfast plan`` and a log line say it).

    By speed, not by where the bytes live: on the CPU the threaded path is the faster one
    wherever it runs every op (measured in ``make bench``, remote rows included), and it reads
    remote shards by range ahead of decoding (``benchmarks/remote.py``).
    """
    if plan.placement != "cpu":
        return "dali", f"the pipeline is placed on {plan.placement}"
    unranged = rangeread.unranged(shards.read_kinds)
    if unranged is not None:
        return "dali", f"{unranged!r} shards have no ranged reads (the threaded path reads by range)"
    try:
        from feedfast.loader.backends.cpu.threads import fast_path_blocker
    except ImportError as exc:  # no PIL
        return "dali", f"PIL does not import ({exc})"
    blocker = fast_path_blocker(plan)
    remote = sorted({kind for kind in shards.read_kinds if kind != "file"})
    where = f", its {', '.join(remote)} shards read by range ahead of decoding" if remote else ""
    if not blocker:
        return "threads", f"every op runs on the threaded path, faster than DALI's CPU pipeline{where}"
    refused = dali_refusal(plan)
    if refused:
        return "threads", f"{blocker}, and DALI cannot run the spec ({refused}): the PIL program per sample, in threads{where}"
    return "dali", blocker


def dali_refusal(plan: Plan) -> str | None:
    """Why DALI has no form for an op of the plan with its parameters (``OpDef.dali``, ``dali_refuses``), or None."""
    from feedfast.ops.registry import OPS

    for n in plan.nodes:
        for op in n.op.split("+") if n.op != "read" else ():
            found = OPS[op]
            if found.dali is None and not found.host:
                return f"op `{op}` ({n.key}) has no DALI form"
            reason = found.dali_refuses(n.params if op == n.op else n.params[op]) if found.dali_refuses else None
            if reason:
                return f"{n.key}: {reason}"
    return None

