"""KeyTable, the compact listing: it must behave as the dict it replaces, whatever the
order of adds, sets and deletes, and a node's view of the entry it was made from must
survive later writes, as a KeyInfo of its own did."""

from __future__ import annotations

import gc
import os
import random

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from zvfs.stores.listing import KeyInfo, KeyTable, Listing

_names = st.text(alphabet="ab.0", min_size=1, max_size=3)
_versions = st.one_of(
    st.none(),
    st.just('"' + "0123456789abcdef" * 2 + '"'),  # a plain ETag: kept as 16 bytes
    st.binary(min_size=16, max_size=16).map(lambda b: '"' + b.hex() + '"'),
    st.just('"d41d8cd98f00b204e9800998ecf8427e-2"'),  # multipart: kept as it is
    st.just("v1"),
)
_infos = st.builds(KeyInfo, st.integers(0, 2**40), st.integers(-(2**63), 2**63 - 1), _versions)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_names, _infos), max_size=40))
def test_built_in_any_order_it_is_the_dict_of_the_same_sets(items: list[tuple[str, KeyInfo]]) -> None:
    """A store adds in its own order (scandir's, a zip's with duplicate members): the last
    set of a name wins, and iteration is sorted."""
    table, model = KeyTable(), {}
    for name, info in items:
        table[name] = info
        model[name] = info
    assert dict(table) == model
    assert list(table) == sorted(model)
    assert len(table) == len(model)
    for name, info in model.items():
        assert name in table and table[name] == info
    assert "zz" not in table and table.get("zz") is None
    assert table.total_size() == sum(i.size for i in model.values())
    assert table.copy() == table
    prefixes = {name[:2] for name, _ in items[::3]}
    assert Listing(table, prefixes).names() == sorted(set(model) | prefixes)


class TableAgainstDict(RuleBasedStateMachine):
    """Built, read, then changed through the mount (sets and deletes after the first read)."""

    def __init__(self) -> None:
        super().__init__()
        self.table: KeyTable = KeyTable()
        self.model: dict[str, KeyInfo] = {}
        self.nodes: list[tuple[str, KeyTable | KeyInfo, KeyInfo]] = []

    @rule(name=_names, info=_infos)
    def set(self, name: str, info: KeyInfo) -> None:
        self.table[name] = info
        self.model[name] = info

    @rule(name=_names)
    def delete(self, name: str) -> None:
        if name in self.model:
            del self.table[name]
            del self.model[name]
        else:
            assert self.table.pop(name, None) is None

    @rule(name=_names)
    def make_node(self, name: str) -> None:
        """What RawFile.child keeps for a name the listing has."""
        if name in self.model:
            self.nodes.append((name, self.table.source(name), self.model[name]))

    @invariant()
    def same_mapping(self) -> None:
        assert dict(self.table.items()) == self.model
        assert list(self.table) == sorted(self.model)
        assert len(self.table) == len(self.model)
        assert self.table.total_size() == sum(i.size for i in self.model.values())

    @invariant()
    def nodes_keep_what_they_were_made_from(self) -> None:
        for name, src, made in self.nodes:
            got = src if isinstance(src, KeyInfo) else src.made_from(name)
            assert got == made
            if isinstance(src, KeyTable):
                assert src.made_size(name) == made.size
                assert src.made_size_and_mtime_ns(name) == (made.size, made.mtime_ns)

    @invariant()
    def a_walk_in_order_finds_each_name(self) -> None:
        """A walk asks the names in sorted order (found without a search), with misses and
        repeats between: each answer is the model's."""
        for name in sorted(self.model):
            assert name in self.table and self.table[name] == self.model[name]
            assert name + "~" not in self.table  # sorts just after name: a miss there
            assert self.table.get(name) == self.model[name]  # the same name again
        for name, src, made in sorted(self.nodes, key=lambda n: n[0]):
            if isinstance(src, KeyTable):
                assert src.made_size_and_mtime_ns(name) == (made.size, made.mtime_ns)


TestTableAgainstDict = TableAgainstDict.TestCase
TestTableAgainstDict.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


def test_a_version_that_is_not_an_etag_turns_the_digests_into_strings() -> None:
    etag = '"' + "ab" * 16 + '"'
    table = KeyTable([("a", KeyInfo(1, 1, etag)), ("b", KeyInfo(2, 2, etag)),
                      ("c", KeyInfo(3, 3, None)), ("d", KeyInfo(4, 4, etag))])
    assert [i.version for i in table.values()] == [etag, etag, None, etag]


def test_a_listing_given_a_dict_keeps_a_table() -> None:
    listing = Listing({"b": KeyInfo(2, 0), "a": KeyInfo(1, 0)})
    assert isinstance(listing.keys, KeyTable)
    assert list(listing.keys) == ["a", "b"]
    assert listing == Listing(KeyTable([("a", KeyInfo(1, 0)), ("b", KeyInfo(2, 0))]))


def _heap_bytes(make) -> float:
    """Bytes the Python heap grows by while ``make()``'s result is alive, per key of 100,000."""
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        held = make()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del held
    return (after - before) / 100_000


def test_a_table_costs_a_fraction_of_the_dict_of_keyinfos_it_replaces() -> None:
    """The names are the listing's own either way; what a key costs beyond its name is
    measured, for a directory store's entries (size, distinct mtime) and S3's (an ETag)."""
    rng = random.Random(7)
    names = [f"{i // 500}.{i % 500}" for i in range(100_000)]
    rng.shuffle(names)  # scandir's order, not sorted
    mtimes = [1_700_000_000_000_000_000 + rng.randrange(10**9) for _ in names]
    etags = ['"' + os.urandom(16).hex() + '"' for _ in names]

    def table(with_etags: bool):
        t = KeyTable()
        for name, m, e in zip(names, mtimes, etags, strict=True):
            t[name] = KeyInfo(256, m, e if with_etags else None)
        len(t)  # built and sorted, as on its first lookup
        return t

    def dict_of(with_etags: bool):
        return {name: KeyInfo(256, m + 0, (e + " ")[:-1] if with_etags else None)
                for name, m, e in zip(names, mtimes, etags, strict=True)}

    directory, directory_dict = _heap_bytes(lambda: table(False)), _heap_bytes(lambda: dict_of(False))
    s3, s3_dict = _heap_bytes(lambda: table(True)), _heap_bytes(lambda: dict_of(True))
    assert directory <= 30, directory  # a name's reference, a size and an mtime: 24 bytes
    assert s3 <= 46, s3  # and a 16-byte digest
    assert directory_dict >= 3 * directory and s3_dict >= 3 * s3, (directory_dict, s3_dict)


def test_threads_that_read_a_fresh_table_at_once_all_see_it_whole() -> None:
    """The first read sorts the table; the trio thread and a worker (df's count) may make it
    together. Each must see every key, in order, never a table half sorted."""
    import sys
    import threading

    rng = random.Random(3)
    names = [f"{i}.{j}" for i in range(200) for j in range(200)]
    for _ in range(5):
        rng.shuffle(names)
        table = KeyTable((n, KeyInfo(i, i)) for i, n in enumerate(names))
        start, failures = threading.Barrier(6), []

        def reader(table: KeyTable = table, start: threading.Barrier = start,
                   failures: list[BaseException] = failures) -> None:
            start.wait()
            try:
                assert table["199.199"].size == names.index("199.199")
                assert list(table) == sorted(names)
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                failures.append(exc)

        old = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # hand the GIL over as often as CPython can
        try:
            threads = [threading.Thread(target=reader) for _ in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            sys.setswitchinterval(old)
        assert not failures, failures[0]


def test_a_nodes_size_and_mtime_are_its_entrys() -> None:
    table = KeyTable([("b", KeyInfo(2, 2_500_000_000, '"' + "cd" * 16 + '"')), ("a", KeyInfo(1, 1_500_000_001))])
    for name in ("a", "b", "a"):
        assert table.made_size(name) == table[name].size
        assert table.made_size_and_mtime_ns(name) == (table[name].size, table[name].mtime_ns)
    table["a"] = KeyInfo(9, 9_500_000_000)  # a write: the node still reads what it was made from
    assert table.made_size("a") == 1 and table["a"].size == 9


def test_names_asked_in_order_out_of_order_and_missing_are_found_as_by_a_search() -> None:
    """The table remembers the last name it found and tries the next one first: a walk in
    order, a walk backwards, jumps, names that are not there (between two, before the first,
    after the last) and equal names that are other string objects all get a search's answer."""
    names = [f"n{i:03d}" for i in range(100)]
    table = KeyTable([(n, KeyInfo(i, i * 10**9 + 1)) for i, n in enumerate(names)])
    rng = random.Random(7)
    asks = names + names[::-1] + rng.choices(names, k=300)
    asks += [n + "x" for n in names[::7]] + ["a", "z", "n", "n100", ""]
    asks += ["".join(list(n)) for n in names]  # equal, not the same object
    for n in asks:
        want = names.index(n) if n in names else None
        if want is None:
            assert n not in table and table.get(n) is None, n
        else:
            assert table[n] == KeyInfo(want, want * 10**9 + 1), n
            assert table.made_size_and_mtime_ns(n) == (want, want * 10**9 + 1), n


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 13), max_size=3),
       st.lists(st.sampled_from([".zarray", ".zattrs", "0", "1.x", "zz", "9"]), unique=True))
def test_a_grids_names_made_when_read_are_the_sorted_names_of_its_chunks(grid, extra) -> None:
    """A chunks/ directory (and a v2 mirror's array) lists its grid's names without making
    them all: each is computed from its position, in or out of order, and its chunk index
    with it. They are what sorting every chunk_name (and the extra files) gives."""
    from itertools import product

    from zvfs.views.chunk_files import GridNames, chunk_name

    names = GridNames(tuple(grid), sorted(extra))
    model = sorted([(e, None) for e in extra]  # as ChunkGridDir listed them: extras first
                   + [(chunk_name(i), i) for i in product(*(range(n) for n in grid))],
                   key=lambda e: e[0])
    assert len(names) == len(model) and list(names) == [n for n, _ in model]
    order = list(range(len(model)))
    random.Random(len(model)).shuffle(order)
    for i in list(range(len(model))) + order:  # in order (one after the other), then any
        assert names.entry(i) == model[i] and names[i] == model[i][0]
    assert list(GridNames(None, sorted(extra))) == sorted(extra)  # too many chunks: none


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="ab.\x00", max_size=3), max_size=30),
       st.sets(st.text(alphabet="ab.", max_size=2), max_size=4),
       st.lists(st.tuples(st.booleans(), st.text(alphabet="ab.\x00", max_size=3)), max_size=8),
       st.sampled_from([((), ()), ({"ab"}, ()), ({"ab"}, {"ab"}), ((), {"b.."})]))
def test_a_listings_names_read_in_place_are_its_sorted_usable_names(keys, prefixes, changes, shown) -> None:
    """What the raw tree lists (``names_view``): every key and prefix, each once, sorted,
    less the names that cannot be a path segment (given apart) and those hidden, plus those
    added; whatever the writes after the listing was sealed, read by index, by bisection
    and in order, as a list of them all would be."""
    from bisect import bisect_left

    from zvfs.stores.keys import safe_name

    listing = Listing(KeyTable((k, KeyInfo(1, 0)) for k in keys), set(prefixes))
    list(listing.keys)  # sealed: later sets and deletes are the table's overlay
    for add, name in changes:
        if add:
            listing.keys[name] = KeyInfo(2, 0)
        else:
            listing.keys.pop(name, None)
    hide, add = shown
    names, unsafe = listing.names_view(hide=hide, add=add)
    every = set(listing.keys) | listing.prefixes
    want = sorted({n for n in every if safe_name(n) and n not in hide} | set(add))
    assert list(names) == want and len(names) == len(want)
    assert [names[i] for i in range(len(names))] == want
    assert [names[i] for i in range(-len(names), 0)] == want
    for name in every | {"", "a", "b~", "zz"}:
        assert bisect_left(names, name) == bisect_left(want, name)
    assert sorted(set(unsafe)) == sorted(n for n in every if not safe_name(n))
