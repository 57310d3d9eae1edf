"""The inode table alone (zvfs.fs.inodes): the numbers, runs, unbinding, freeing and
quarantine that ZvfsOperations builds on, checked without a mount or an Operations.
tests/test_core.py checks the same rules through the FUSE operations."""

from __future__ import annotations

from zvfs.fs.inodes import ROOT, InodeTable
from zvfs.views.node import BytesFile, StaticDir


def _table(derived: tuple[str, ...] = (), oldest: list[int] | None = None) -> InodeTable:
    """A table over an empty root; ``oldest[0]`` plays the oldest open directory handle."""
    held = oldest if oldest is not None else [1 << 62]
    return InodeTable(StaticDir({}), derived, lambda: held[0])


def test_a_listing_is_one_run_and_each_name_keeps_its_number() -> None:
    t = _table()
    names = [f"k{i:03d}" for i in range(10)]
    first = t.new_run(ROOT, names)
    assert first == ROOT + 1
    assert [t.find(ROOT, n) for n in names] == list(range(first, first + 10))
    assert t.find(ROOT, "nope") is None
    assert t.path(first + 3) == "/k003" and t.child_path(first, "x") == "/k000/x"
    assert t.bound(first + 3) and t.still_named(first + 3, ROOT, "k003")
    assert sorted(t.bound_children(ROOT)) == list(range(first, first + 10))
    assert t.in_use() == 11  # the root too


def test_unbinding_half_a_run_lets_the_run_go_and_keeps_the_rest_bound() -> None:
    t = _table()
    names = [f"k{i}" for i in range(6)]
    first = t.new_run(ROOT, names)
    assert t.pop(ROOT, "k0") == first and t.pop(ROOT, "k1") == first + 1
    assert ROOT in t.runs and t.unbinds == 2  # two of six dead: the run stays
    assert t.pop(ROOT, "k2") == first + 2  # half dead: compacted into one-by-one bindings
    assert ROOT not in t.runs and not t.unbound and ROOT not in t.dead_in
    assert t.ino_of[ROOT] == {"k3": first + 3, "k4": first + 4, "k5": first + 5}
    assert t.find(ROOT, "k2") is None and t.find(ROOT, "k4") == first + 4
    assert t.pop(ROOT, "k2") is None


def test_a_freed_number_waits_for_the_listings_open_before_it_and_comes_back_a_generation_on() -> None:
    oldest = [5]  # a directory handle numbered 5 is open
    t = _table(oldest=oldest)
    ino = t.new(ROOT, "a", BytesFile(b"x"))
    t.ino_of.setdefault(ROOT, {})["a"] = ino
    assert t.pop(ROOT, "a") == ino
    assert t.release(ino, quarantine_until=7) == []  # handles up to 7 were dealt out then
    assert t.name_at[ino - ROOT] == "" and t.node_at[ino - ROOT] is None
    assert t.in_use() == 1
    fresh = t.new(ROOT, "b", None)  # handle 5 still open: not dealt out again yet
    assert fresh != ino and t.generation.get(fresh, 0) == 0
    oldest[0] = 8  # every handle that could list it is closed
    again = t.new(ROOT, "c", None)
    assert again == ino and t.generation[ino] == 1 and t.name_at[ino - ROOT] == "c"


def test_releasing_a_directory_returns_what_was_bound_below_it() -> None:
    t = _table()
    d = t.new(ROOT, "d", StaticDir({}))
    t.ino_of.setdefault(ROOT, {})["d"] = d
    first = t.new_run(d, ["x", "y", "z"])
    t.pop(d, "y")  # a dead slot of the run: not below it any more
    below = t.release(d, None)
    assert sorted(below) == [first, first + 2]
    assert all(t.still_below(child, d) for child in below)
    assert t.free == [d] and d not in t.runs


def test_names_below_a_derived_prefix_are_marked_and_the_rest_are_not() -> None:
    t = _table(derived=("/.zvfs/",))
    z = t.new(ROOT, ".zvfs", None)
    plain = t.new(ROOT, "data", None)
    assert z in t.toward_derived and not t.derived[z - ROOT]
    arrays = t.new(z, "arrays", None)
    run = t.new_run(arrays, ["a", "b"])
    assert t.derived[arrays - ROOT] and t.derived[run - ROOT] and t.derived[run + 1 - ROOT]
    assert not t.derived[plain - ROOT] and plain not in t.toward_derived
