"""How ``torch.utils.data.DataLoader``'s arguments map onto feedfast's loader.

=========================  ===========  =================================================
torch argument             status       what feedfast does
=========================  ===========  =================================================
dataset (1st positional)   mapped       the spec (path, dict or Spec); shards via ``shards=``
batch_size                 supported    overrides the spec's ``batch.size``
shuffle                    mapped       True: a uniform permutation of the whole dataset per
                                        epoch over local shards (a windowed shuffle over remote
                                        ones); False: file order
drop_last                  mapped       True: ``last_batch: drop``; False: ``partial`` even when
                                        the spec says ``drop`` (an explicit argument wins);
                                        None (unset): the spec's policy
num_workers                mapped       threads of the ``dali``/``threads`` backends (0 means 1),
                                        worker processes of ``pil``; None: this rank's share of
                                        the usable cores (divided by ``LOCAL_WORLD_SIZE``)
pin_memory                 supported    pinned staging ring for a CUDA delivery device
prefetch_factor            mapped       batches made ahead on the loader's thread (and DALI's
                                        queue depth)
persistent_workers         supported    always true: threads live as long as the loader
pin_memory_device          supported    the device pinned memory serves: "" (torch's default) or
                                        the delivery device's type; it never moves batches
timeout                    supported    seconds ``next()`` waits for a batch (0: forever, torch's
                                        default); past it a ``FeedfastError``
sampler, batch_sampler     rejected     sharding and order come from feedfast (``seed``)
collate_fn                 mapped       a batch hook: the finished batch in, the batch to yield
                                        out, run ahead on the producer (torch's per-sample
                                        ``default_collate`` is refused: feedfast batches itself)
worker_init_fn             rejected     there are no Python worker processes
multiprocessing_context    rejected     there are no Python worker processes
generator                  rejected     use ``seed=``
in_order                   supported    only True
=========================  ===========  =================================================
"""

from __future__ import annotations

from typing import Any

from feedfast import _env
from feedfast.errors import UserError

REJECTED = {
    "sampler": "feedfast shards and orders samples itself; use `seed=` and `shuffle=`",
    "batch_sampler": "feedfast batches itself; use `batch_size=` and `drop_last=`",
    "worker_init_fn": "there are no Python worker processes; remove `worker_init_fn`",
    "multiprocessing_context": "there are no Python worker processes; remove it",
    "generator": "use `seed=` for reproducible order and augmentation",
}


def check_torch_kwargs(kwargs: dict[str, Any]) -> None:
    """Raise UserError for a torch argument feedfast rejects or an unknown argument."""
    for name, value in kwargs.items():
        if name in REJECTED:
            if value is None:
                continue
            raise UserError(f"feedfast.DataLoader does not take `{name}`: {REJECTED[name]}")
        if name == "in_order" and value is not True:
            raise UserError("feedfast.DataLoader always yields in order: `in_order` must be True")
        if name not in ("in_order", "persistent_workers", "timeout"):
            raise UserError(f"feedfast.DataLoader got an unknown argument `{name}`")


def timeout_seconds(value: Any) -> float | None:
    """torch's ``timeout``: seconds to wait for a batch; 0 (the default) means no limit (None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise UserError(f"timeout must be a number of seconds >= 0 (0: wait forever), got {value!r}")
    return float(value) or None


def seconds_above_zero(name: str, value: Any) -> float:
    """``value`` as seconds if it is a finite number > 0, else a UserError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise UserError(f"{name} must be a number of seconds > 0, got {value!r}")
    return float(value)


def check_pin_memory_device(value: Any, device_type: str) -> None:
    """torch's ``pin_memory_device`` names the device pinned memory serves; feedfast pins for the delivery device."""
    if value in (None, ""):
        return
    kind = str(value).split(":")[0]
    if kind != device_type or device_type == "cpu":
        raise UserError(f"pin_memory_device={value!r}: feedfast pins staging memory for the device batches are "
                        f"delivered to ({device_type}); to deliver elsewhere pass device=..., and leave "
                        f"pin_memory_device unset")


def positive(name: str, v: int) -> int:
    """``v`` if it is an integer >= 1, else a UserError naming ``name``."""
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise UserError(f"{name} must be an integer >= 1, got {v!r}")
    return v


def at_least_zero(name: str, v: int) -> int:
    """``v`` if it is an integer >= 0, else a UserError naming ``name``."""
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise UserError(f"{name} must be an integer >= 0, got {v!r}")
    return v


def rank_cores() -> int:
    """This rank's share of the usable cores: ranks on one node share them, so they are divided by the
    launcher's ``LOCAL_WORLD_SIZE`` (8 ranks on 16 cores: 2 each), at least 1.

    Raises:
        UserError: ``LOCAL_WORLD_SIZE`` is set but not an integer.
    """
    local_world = _env.launcher_int("LOCAL_WORLD_SIZE")
    return max(1, _env.usable_cores() // max(1, local_world or 1))


def threads_for(num_workers: int | None) -> int:
    """DALI CPU threads for torch's ``num_workers``: this rank's share of the cores when None
    (:func:`rank_cores`), 0 means 1."""
    if num_workers is None:
        return rank_cores()
    return max(1, at_least_zero("num_workers", num_workers))


def settle_spec(spec: Any, batch_size: int | None, shuffle: bool | None, drop_last: bool | None,
                last_batch: str | None, seed: int | None) -> Any:
    """The spec with the loader's torch-style arguments applied (they win over the spec)."""
    changes: dict[str, Any] = {}
    if batch_size is not None:
        changes["batch_size"] = positive("batch_size", batch_size)
    if shuffle is not None:
        changes.update(shuffle_shards=shuffle, shuffle_buffer=(spec.shuffle_buffer or 1024) if shuffle else 0)
    if last_batch is not None:
        if last_batch not in ("partial", "pad", "drop"):
            raise UserError(f"last_batch must be 'partial', 'pad' or 'drop', got {last_batch!r}")
        changes["last_batch"] = last_batch
    if drop_last is not None and last_batch is None:
        if drop_last:
            changes["last_batch"] = "drop"
        elif spec.last_batch == "drop":
            changes["last_batch"] = "partial"  # torch's drop_last=False: keep the incomplete batch
    if seed is not None:
        changes["seed"] = int(seed)
    return spec.replace(**changes) if changes else spec
