"""The flat tree index (one listing pass for the whole store) against the store spec's
one-level listing, computed from the keys by its definition."""

from __future__ import annotations

from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st

from zvfs.cache.tree import build_tree_index
from zvfs.stores.base import KeyInfo, Listing, Store

_segment = st.text(alphabet="ab.", min_size=0, max_size=2)
_keys = st.lists(st.lists(_segment, min_size=1, max_size=4).map("/".join).filter(bool),
                 max_size=30, unique=True)


class _Keys(Store):
    """Keys and infos only: what build_tree_index reads (list_tree, sorted as S3 lists)."""

    def __init__(self, infos: dict[str, KeyInfo]) -> None:
        self.infos = infos

    def list_tree(self, prefix: str) -> Iterator[tuple[str, KeyInfo]]:
        return iter(sorted((k, i) for k, i in self.infos.items() if k.startswith(prefix)))

    def get(self, key: str) -> bytes:
        raise NotImplementedError

    def get_range(self, key: str, start: int, length: int) -> bytes:
        raise NotImplementedError

    def info(self, key: str) -> KeyInfo:
        return self.infos[key]

    def list_dir(self, prefix: str) -> Listing:
        raise NotImplementedError


def _listing(infos: dict[str, KeyInfo], prefix: str) -> Listing:
    """The spec's listing of ``prefix``: children that are keys, and children with keys below."""
    out = Listing()
    for key, info in infos.items():
        if not key.startswith(prefix):
            continue
        rest = key[len(prefix):]
        if "/" in rest:
            out.prefixes.add(rest.split("/", 1)[0])
        elif rest:
            out.keys[rest] = info
    return out


@settings(max_examples=300, deadline=None)
@given(_keys, st.data())
def test_tree_index_is_every_directory_listing(keys: list[str], data: st.DataObject) -> None:
    infos = {k: KeyInfo(data.draw(st.integers(0, 9)), data.draw(st.integers(0, 2)),
                        data.draw(st.sampled_from([None, '"e1"'])))
             for k in keys}
    index = build_tree_index(_Keys(infos), limit=1000)
    assert index is not None
    dirs = {""} | {k[: i + 1] for k in keys for i, c in enumerate(k) if c == "/"}
    assert set(index) == dirs
    for prefix in dirs:
        assert index[prefix] == _listing(infos, prefix), prefix


def test_tree_index_gives_up_past_its_limit() -> None:
    infos = {f"a/{n}": KeyInfo(n, 0) for n in range(10)}
    assert build_tree_index(_Keys(infos), limit=10) is not None
    assert build_tree_index(_Keys(infos), limit=9) is None
