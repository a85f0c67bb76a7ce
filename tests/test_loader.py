"""feedfast.DataLoader on real JPEG shards through DALI on the CPU."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
import torch

import feedfast
from feedfast.errors import UserError
from tests.helpers import keys_of_epoch, labels_of


def _loader(spec: dict, shards: list[str], **kw: object) -> feedfast.DataLoader:
    kw.setdefault("num_workers", 2)
    return feedfast.DataLoader(spec, shards=shards, **kw)


def test_batches_have_declared_shapes_dtypes_and_true_labels(small_spec: dict, shards: list[str]) -> None:
    truth = labels_of(shards)
    loader = _loader(small_spec, shards)
    sizes = []
    for images, labels in loader:
        assert images.dtype == torch.float32 and images.shape[1:] == (3, 32, 32)
        assert labels.dtype == torch.int64
        keys = [k for _, k in loader.last_origins]
        assert labels.tolist() == [truth[k] for k in keys]
        assert -2.2 < float(images.min()) and float(images.max()) < 2.7  # ImageNet-normalized range
        sizes.append(images.shape[0])
    assert sizes == [4, 4, 4, 4, 4, 3] and len(loader) == 6
    assert loader.stats() == {"delivered": 23, "skipped": 0, "padded": 0, "dropped": 0, "batches": 6, "converted": 0}


def test_every_sample_once_per_shuffled_epoch_and_orders_differ(small_spec: dict, shards: list[str]) -> None:
    loader = _loader(small_spec, shards, shuffle=True)
    epochs = [keys_of_epoch(loader) for _ in range(2)]
    truth = set(labels_of(shards))
    for keys in epochs:
        assert Counter(keys) == Counter(truth)
    assert epochs[0] != epochs[1] and loader.epoch == 2


def test_same_seed_same_batches_other_seed_other_augmentation(small_spec: dict, shards: list[str]) -> None:
    a = [x.clone() for x, _ in _loader(small_spec, shards)]
    b = [x.clone() for x, _ in _loader(small_spec, shards)]
    c = [x.clone() for x, _ in _loader(small_spec, shards, seed=99)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("policy,sizes,padded,dropped", [
    ("partial", [4, 4, 4, 4, 4, 3], 0, 0), ("pad", [4] * 6, 1, 0), ("drop", [4] * 5, 0, 3),
])
def test_last_batch_policies(small_spec: dict, shards: list[str], policy: str, sizes: list[int], padded: int,
                             dropped: int) -> None:
    loader = _loader(small_spec, shards, last_batch=policy)
    assert [x.shape[0] for x, _ in loader] == sizes and len(loader) == len(sizes)
    s = loader.stats()
    assert (s["padded"], s["dropped"], s["delivered"] + s["dropped"]) == (padded, dropped, 23)


def test_break_reiterate_and_set_epoch(small_spec: dict, shards: list[str]) -> None:
    loader = _loader(small_spec, shards, shuffle=True)
    first = None
    for i, _ in enumerate(loader):
        first = first or list(loader.last_origins)
        if i == 1:
            break
    assert loader.epoch == 0  # an interrupted epoch ends it: the next iter() runs the next epoch, as torch's
    again = next(iter(loader))  # iterator draws a new permutation (tests/test_torch_compat.py has the rest)
    assert loader.epoch == 1 and loader.last_origins != first and again[0].shape[0] == 4
    loader.set_epoch(5)
    keys5 = keys_of_epoch(loader)
    loader.set_epoch(5)
    assert keys_of_epoch(loader) == keys5 and loader.epoch == 6


def test_state_dict_resumes_mid_epoch_and_across_the_epoch_boundary(small_spec: dict, shards: list[str]) -> None:
    def run(loader: feedfast.DataLoader, epochs: int) -> list[tuple[torch.Tensor, list[str]]]:
        out = []
        for _ in range(epochs):
            out += [(x.clone(), [k for _, k in loader.last_origins]) for x, _ in loader]
        return out

    full = run(_loader(small_spec, shards, shuffle=True), 2)
    part = _loader(small_spec, shards, shuffle=True)
    it = iter(part)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(part.state_dict()))
    part.close()
    resumed = _loader(small_spec, shards, shuffle=True)
    resumed.load_state_dict(state)
    rest = run(resumed, 2)  # the rest of epoch 0, then all of epoch 1
    assert len(rest) == len(full) - 3
    for (x, kx), (y, ky) in zip(full[3:], rest):
        assert kx == ky and torch.equal(x, y)


def test_close_and_context_manager(small_spec: dict, shards: list[str]) -> None:
    with _loader(small_spec, shards, backend="dali") as loader:
        it = iter(loader)
        next(it)
        assert loader._backend.life is not None and loader._producer is not None and loader._producer.alive
    assert loader._backend.life is None and loader._producer is None
    assert sum(1 for _ in loader) == 6  # usable again after close


def test_dict_outputs_and_torch_arguments(shards: list[str], small_spec: dict) -> None:
    small_spec["outputs"] = {"image": "image", "label": "label"}
    batch = next(iter(_loader(small_spec, shards, drop_last=True, prefetch_factor=1, persistent_workers=True)))
    assert set(batch) == {"image", "label"}
    # torch's default collate means what the loader does already: no hook (the batch hook: test_torch_compat.py)
    assert _loader(small_spec, shards, collate_fn=torch.utils.data.default_collate).settings.hook is None
    with pytest.raises(UserError, match="unknown argument `bogus`"):
        _loader(small_spec, shards, bogus=1)
    with pytest.raises(UserError, match="no full batch"):
        _loader(small_spec, shards, batch_size=30, drop_last=True)


def test_tiny_cnn_trains_on_the_loader(small_spec: dict, shards: list[str]) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(8, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    small_spec["pipeline"]["image"] = ["decode", {"resize": {"size": [32, 32]}}, "normalize"]
    loader = _loader(small_spec, shards)
    images, labels = next(iter(loader))
    losses = []
    for _ in range(25):  # fit one fixed batch: the loss must fall
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    for images, labels in loader:  # and a full epoch runs through the same loop
        torch.nn.functional.cross_entropy(model(images), labels).backward()


@pytest.mark.parametrize("backend", ["threads", "dali"])
def test_state_at_the_last_batch_points_to_the_next_epoch(small_spec: dict, shards: list[str], backend: str) -> None:
    """Taken after an epoch's last batch, a state resumes the next epoch as the uninterrupted run makes it, pixels
    too: DALI's pipeline runs on from one epoch into the next, so the state carries its checkpoint (step 0)."""
    loader = _loader(small_spec, shards, shuffle=True, backend=backend)
    for _ in loader:
        state = loader.state_dict()
    assert (state["epoch"], state["step"]) == (1, 0)
    assert state["dali"] is None if backend == "threads" else state["dali"]["step"] == 0
    nxt = [(x.clone(), list(loader.last_origins)) for x, _ in loader]
    resumed = _loader(small_spec, shards, shuffle=True, backend=backend)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    again = [(x.clone(), list(resumed.last_origins)) for x, _ in resumed]
    assert [k for _, k in again] == [k for _, k in nxt]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(again, nxt))


def test_set_epoch_after_load_state_dict_keeps_the_resume_point(small_spec: dict, shards: list[str]) -> None:
    loader = _loader(small_spec, shards, shuffle=True)
    full = [list(loader.last_origins) for _ in loader]
    part = _loader(small_spec, shards, shuffle=True)
    it = iter(part)
    next(it), next(it)
    state = part.state_dict()
    resumed = _loader(small_spec, shards, shuffle=True)
    resumed.load_state_dict(state)
    resumed.set_epoch(0)  # the usual top-of-epoch call
    assert [list(resumed.last_origins) for _ in resumed] == full[2:]


def test_set_epoch_between_iter_and_next_counts(small_spec: dict, shards: list[str]) -> None:
    a = _loader(small_spec, shards, shuffle=True)
    a.set_epoch(3)
    want = [list(a.last_origins) for _ in a]
    b = _loader(small_spec, shards, shuffle=True)
    it = iter(b)
    b.set_epoch(3)  # Lightning calls iter() before on_train_epoch_start
    assert [list(b.last_origins) for _ in it] == want


@pytest.mark.parametrize("shuffle", [True, False])
def test_one_pipeline_is_built_off_the_training_thread_for_the_loaders_life(
        monkeypatch: pytest.MonkeyPatch, small_spec: dict, shards: list[str], shuffle: bool) -> None:
    """Issue 36: DALI's ``Pipeline.build`` once per loader, over six epochs, on the producer thread; the next epoch's
    steps are queued while this one's last are in flight."""
    import threading

    from nvidia.dali import Pipeline

    built: list[str] = []
    real = Pipeline.build

    def spy(self: Any, *args: Any, **kw: Any) -> Any:
        if not self._built:  # DALI calls build() before each run too; it builds once
            built.append(threading.current_thread().name)
        return real(self, *args, **kw)

    monkeypatch.setattr(Pipeline, "build", spy)
    loader = _loader(small_spec, shards, backend="dali", shuffle=shuffle)
    queued_early = []
    for _ in range(6):
        it = iter(loader)
        for i, _batch in enumerate(it):
            if i == len(loader) - 1:  # the last batch: the next epoch is queued already
                queued_early.append(loader._backend.life.queue.find(loader.epoch, loader.epoch_plan(), 0) is not None)
    assert len(built) == 1 and built[0] != threading.main_thread().name, built
    assert all(queued_early), queued_early
    loader.close()


def test_normalize_constants_are_made_once_per_device_without_a_host_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    from feedfast.ops import color

    params = {"mean": [0.1, 0.2, 0.3], "std": [0.5, 0.5, 0.5], "dtype": "float32", "layout": "CHW"}
    x = torch.randint(0, 256, (2, 4, 4, 3), dtype=torch.uint8)
    first = color.normalize_tensor(x, params)

    def no_tensor(*args: Any, **kw: Any) -> Any:
        raise AssertionError("torch.tensor from host data is a blocking copy on CUDA")

    monkeypatch.setattr(torch, "tensor", no_tensor)
    again = color.normalize_tensor(x, params)
    assert torch.equal(first, again) and first.shape == (2, 3, 4, 4)
    want = (x.float() / 255 - torch.as_tensor([0.1, 0.2, 0.3])) / 0.5
    torch.testing.assert_close(first, want.permute(0, 3, 1, 2), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["threads"])
def test_the_next_epoch_starts_while_this_one_drains_and_gives_the_same_batches(
        small_spec: dict, shards: list[str], backend: str) -> None:
    kw: dict[str, Any] = {"backend": backend, "shuffle": True}
    loader = _loader(small_spec, shards, **kw)
    first = [(x.clone(), list(loader.last_origins)) for x, _ in loader]
    assert loader._backend.ahead is not None and loader._backend.ahead[0] == 1  # started at the end of epoch 0
    second = [(x.clone(), list(loader.last_origins)) for x, _ in loader]
    fresh = _loader(small_spec, shards, **kw)
    fresh.set_epoch(1)
    want = [(x.clone(), list(fresh.last_origins)) for x, _ in fresh]
    assert [k for _, k in second] == [k for _, k in want] != [k for _, k in first]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(second, want))
    loader.set_epoch(5)  # another epoch than the one started: it is dropped, epoch 5 runs from its start
    fresh.set_epoch(5)
    assert [list(loader.last_origins) for _ in loader] == [list(fresh.last_origins) for _ in fresh]
    loader.close()
    assert loader._backend.ahead is None
