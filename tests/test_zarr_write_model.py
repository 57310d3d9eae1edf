"""Model-based test of Zarr written through a writable mount: hypothesis runs random
sequences of zarr-python 3 creating arrays (v2 and v3, sharded, the codecs of
tests/zarr_model.py), writing regions, setting attributes, resizing and deleting them,
all through the mount's raw tree, while the decoded views are read and held open. After
every step each array's ``data.raw`` and ``data.npy`` (a fresh open, and every open held
since, of those and of the first chunk's file, which an attribute set must leave
reading), the v2 mirror's shape and the
``.zvfs/arrays`` listing must show what zarr-python reads from the store itself, outside
the mount (the directory, or the bucket's keys fetched with boto3): never zvfs's own
decoder. An open held across a resize or a new array made over its own may read
``ESTALE`` instead, as the README says, or the new array's bytes, never others.

The mount keeps the default metadata TTL (60 s): every view must follow a write made
through the mount at once, not when its cache expires.

``ZVFS_ZMODEL_SEED=N`` reruns a run exactly; ``ZVFS_ZMODEL_SCALE=K`` runs K times as many
examples; ``ZVFS_ZMODEL_REPRODUCE="<hypothesis version> <blob>"`` replays the one example
a failure printed (``@reproduce_failure(...)``) on a fresh mount.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import random
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr_model as zm
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule
from test_write_model import MountModel, run_machine
from test_writes import Store, new_store

SEED = int(os.environ.get("ZVFS_ZMODEL_SEED") or random.SystemRandom().randrange(2**32))
SCALE = float(os.environ.get("ZVFS_ZMODEL_SCALE") or 1)
#: examples per store kind: an S3 example takes four times a directory's (moto is one
#: Python process on the same two cores), so S3 runs half as many in the suite; the long
#: runs (ZVFS_ZMODEL_SCALE) scale both
EXAMPLES = {"dir": max(1, round(40 * SCALE)), "s3": max(1, round(20 * SCALE))}
STEPS = 12
SLOTS = ["a", "g/b"]  # two arrays, one below a group: creating one must not hide the other


def first_chunk(spec: dict[str, Any]) -> str | None:
    """The name of the array's first (inner) chunk file below its views, None without one."""
    if not math.prod(zm.grid_shape(spec)):
        return None
    return "chunks/" + (".".join("0" * len(spec["shape"])) or "0")


@dataclass(eq=False)
class Held:
    """A view file opened earlier and kept open across the steps that follow."""

    fd: int
    slot: str
    view: str  # "data.raw", "data.npy" or "chunks/<first>"
    #: its array was made again over it, or resized, since: its reads may be ESTALE from
    #: then on (README: the old metadata cannot read the new chunks), or read what the kernel
    #: has of the new array's bytes, never anything else
    stale: bool = False


def _zarr() -> Any:
    import zarr

    return zarr


class ZarrWriteModel(MountModel):
    """One example: arrays made and changed by zarr-python through a fresh directory of the mount."""

    checks = 0

    def __init__(self) -> None:
        super().__init__()
        self.specs: dict[str, dict[str, Any]] = {}  # slot -> the spec it was made from, shape kept current
        self.held: list[Held] = []

    # -- helpers ------------------------------------------------------------------------

    def views(self, slot: str) -> Path:
        return self.mnt / ".zvfs" / "arrays" / self.ex / slot

    def open_array(self, slot: str) -> Any:
        zarr = _zarr()
        return zarr.open_array(zarr.storage.LocalStore(str(self.root)), path=slot, mode="r+")

    @contextlib.contextmanager
    def store_side(self) -> Iterator[Path]:
        """The example's directory as the store holds it, outside the mount: the directory
        itself, or the bucket's keys below it fetched with boto3: once for every array a
        check reads, not once an array."""
        if self.store.kind == "dir":
            yield self.store.root / self.ex
            return
        with tempfile.TemporaryDirectory() as tmp:
            yield self.store.download(Path(tmp), under=f"{self.ex}/") / self.ex

    @staticmethod
    def reference(side: Path, slot: str) -> np.ndarray:
        """What zarr-python reads of ``slot`` from ``side`` (:meth:`store_side`)."""
        zarr = _zarr()
        return np.asarray(zarr.open_array(zarr.storage.LocalStore(str(side)), path=slot, mode="r")[...])

    def metadata_rewritten(self, slot: str) -> None:
        for h in self.held:
            if h.slot == slot:
                h.stale = True

    def forget_held(self, slot: str) -> None:
        for h in [h for h in self.held if h.slot == slot]:
            os.close(h.fd)
            self.held.remove(h)

    # -- rules ----------------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        os.mkdir(self.root)

    @rule(slot=st.sampled_from(SLOTS), spec=zm.array_specs(writers=("zarr3",)))
    def create(self, slot: str, spec: dict[str, Any]) -> None:
        """zarr.create_array(overwrite=True) through the mount: the old array's keys are
        deleted, the new metadata and chunks written (chunk keys deleted afterwards too)."""
        spec = json.loads(json.dumps(spec))  # a copy whose shape the model may change
        zm.write_zarr3(spec, self.root, slot)
        self.specs[slot] = spec
        self.metadata_rewritten(slot)

    @precondition(lambda self: bool(self.specs))
    @rule(i=st.integers(0, 10**6), data=st.data())
    def write_region(self, i: int, data: st.DataObject) -> None:
        slot = sorted(self.specs)[i % len(self.specs)]
        spec = self.specs[slot]
        box = []
        for n in spec["shape"]:
            lo = data.draw(st.integers(0, n))
            box.append(slice(lo, data.draw(st.integers(lo, n))))
        values = zm.make_data({**spec, "seed": data.draw(st.integers(0, 2**16)),
                               "data": data.draw(st.sampled_from(["random", "sparse", "fill"]))})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.open_array(slot)[tuple(box)] = values[tuple(box)]

    @precondition(lambda self: any(s["shape"] for s in self.specs.values()))
    @rule(i=st.integers(0, 10**6), data=st.data())
    def resize(self, i: int, data: st.DataObject) -> None:
        """Array.resize: new metadata, and the chunks wholly outside the new shape deleted."""
        slots = sorted(s for s, spec in self.specs.items() if spec["shape"])
        slot = slots[i % len(slots)]
        spec = self.specs[slot]
        shape = [data.draw(st.integers(0, 40)) for _ in spec["shape"]]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.open_array(slot).resize(tuple(shape))
        if shape != spec["shape"]:
            self.metadata_rewritten(slot)
        spec["shape"] = shape  # the same shape: the same document written again, read on

    @precondition(lambda self: bool(self.specs))
    @rule(i=st.integers(0, 10**6), name=st.sampled_from(["units", "long_name", "note"]),
          value=st.one_of(st.text(max_size=20), st.integers(-5, 5), st.lists(st.integers(0, 3), max_size=3)))
    def set_attribute(self, i: int, name: str, value: Any) -> None:
        """``attrs[name] = value``: zarr.json (v3) or .zattrs (v2) rewritten, the layout kept,
        so every open view reads on."""
        slot = sorted(self.specs)[i % len(self.specs)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.open_array(slot).attrs[name] = value

    @precondition(lambda self: bool(self.specs))
    @rule(i=st.integers(0, 10**6))
    def delete(self, i: int) -> None:
        """rm -r of an array's directory through the mount."""
        slot = sorted(self.specs)[i % len(self.specs)]
        shutil.rmtree(self.root / slot)
        del self.specs[slot]
        self.forget_held(slot)

    @precondition(lambda self: bool(self.specs) and len(self.held) < 6)
    @rule(i=st.integers(0, 10**6), view=st.sampled_from(["data.raw", "data.npy", "chunk"]))
    def hold(self, i: int, view: str) -> None:
        """Open a view and keep it open: its later reads must follow the writes too."""
        slot = sorted(self.specs)[i % len(self.specs)]
        if view == "chunk":  # the first chunk's file, when the array has chunks
            view = first_chunk(self.specs[slot]) or "data.raw"
        fd = os.open(self.views(slot) / view, os.O_RDONLY)
        self.held.append(Held(fd, slot, view))

    # -- the check, after every step ------------------------------------------------------

    def npy_bytes(self, slot: str, raw: bytes) -> bytes:
        """data.npy as a fresh open reads it, checked against ``raw``."""
        npy = (self.views(slot) / "data.npy").read_bytes()
        self.check_npy(slot, npy, raw, "")
        return npy

    def check_npy(self, slot: str, npy: bytes, raw: bytes, what: str) -> None:
        header, shape, fortran, dtype = zm.parse_npy_header(npy)
        spec = self.specs[slot]
        assert (shape, fortran, dtype) == (tuple(spec["shape"]), False, zm.declared_dtype(spec)), (
            f"{slot}/data.npy{what}: header says {shape}, {dtype}")
        assert npy[header:] == raw, f"{slot}/data.npy{what}: the values differ from zarr-python's"

    @invariant()
    def views_show_the_store(self) -> None:
        """Held opens first: a fresh open of a view would drop the kernel's cached pages of
        it, and hide pages kept stale."""
        type(self).checks += 1
        if not self.root.exists():
            return
        raws: dict[str, bytes] = {}
        chunks: dict[str, bytes] = {}  # the first chunk's bytes, of the arrays that have it
        with self.store_side() if self.specs else contextlib.nullcontext() as side:
            for slot, spec in self.specs.items():
                ref = self.reference(side, slot)
                assert list(ref.shape) == spec["shape"], (slot, ref.shape, spec["shape"])
                raws[slot] = zm.expected_raw(spec, ref)
                if first_chunk(spec) is not None:
                    chunks[slot] = zm.expected_chunk(spec, ref, (0,) * len(spec["shape"]))
        for h in self.held:
            if h.view.startswith("chunks/"):
                # the new array may have no such chunk (another grid): ESTALE is then the
                # only answer
                want = chunks.get(h.slot) if first_chunk(self.specs[h.slot]) == h.view else None
            else:
                want = raws[h.slot] if h.view == "data.raw" else self.npy_bytes(h.slot, raws[h.slot])
            if h.stale:
                try:
                    got = os.pread(h.fd, (0 if want is None else len(want)) + 1, 0)
                except OSError as exc:
                    assert exc.errno == errno.ESTALE, f"{h.slot}/{h.view}, held, array made anew: {exc!r}"
                else:
                    assert want is not None, f"{h.slot}/{h.view}, held, array made anew without it: read {got!r}"
                    # pages a fresh open of the new array filled: what it reads now, or a
                    # part of it, cut where a read reached the daemon and was refused
                    assert want.startswith(got), (f"{h.slot}/{h.view}, held, array made anew: read "
                                                  f"{len(got)} bytes that are not the new array's")
                continue
            size = os.fstat(h.fd).st_size
            body = os.pread(h.fd, size + 1, 0)
            assert len(body) == size, f"{h.slot}/{h.view}, held open: fstat says {size} bytes, read {len(body)}"
            if h.view != "data.npy":
                assert body == want, (f"{h.slot}/{h.view}, held open since an earlier step: "
                                      f"{size} bytes, zarr-python's {len(want or b'')}")
            else:
                self.check_npy(h.slot, body, raws[h.slot], ", held open since an earlier step")
        listed = self.mnt / ".zvfs" / "arrays" / self.ex
        want_top = sorted({s.split("/")[0] for s in self.specs})
        got_top = sorted(os.listdir(listed)) if want_top or listed.exists() else []
        assert got_top == want_top, f".zvfs/arrays/{self.ex}: {got_top}, the model {want_top}"
        for slot, spec in self.specs.items():
            raw = raws[slot]
            where = self.views(slot)
            got = (where / "data.raw").read_bytes()
            assert got == raw, f"{slot}/data.raw: {len(got)} bytes, zarr-python's {len(raw)}" + (
                "" if len(got) != len(raw) else f"; first difference at "
                f"{next(k for k, (x, y) in enumerate(zip(got, raw, strict=True)) if x != y)}")
            self.check_npy(slot, (where / "data.npy").read_bytes(), raw, "")
            zarray = self.mnt / ".zvfs" / "v2" / self.ex / slot / ".zarray"
            if 0 in spec["shape"]:  # left out of the mirror: it holds no value (README)
                assert not zarray.exists(), f"{slot}: of no elements, and in the v2 mirror"
            else:
                mirror = json.loads(zarray.read_text())
                assert mirror["shape"] == (spec["shape"] or [1]), (slot, mirror["shape"])  # 0-d: [1]

    def teardown(self) -> None:
        for h in self.held:
            os.close(h.fd)
        self.held.clear()
        shutil.rmtree(self.root, ignore_errors=True)


def run_model(store: Store, mount, examples: int) -> None:
    machine = run_machine(ZarrWriteModel, store, store.mount(mount), "ZVFS_ZMODEL", SEED, examples, STEPS)
    print(f"{machine.counter} examples, {machine.checks} checks", flush=True)
    assert machine.checks >= examples * 3, "the examples ran too few steps to test anything"


@pytest.mark.parametrize("kind", ["dir", "s3"])
def test_zarr_written_through_the_mount_reads_back_in_every_view(kind: str, request, tmp_path, mount) -> None:
    run_model(new_store(kind, request, tmp_path), mount, EXAMPLES[kind])
