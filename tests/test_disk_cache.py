"""The optional disk tier (--cache-dir) through real mounts of a moto bucket."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import mount_stats as _stats
from conftest import store_files


def _read_all(mnt: Path, ref: Path) -> None:
    for key, path in sorted(store_files(ref).items()):
        assert (mnt / key).read_bytes() == path.read_bytes(), key


def _cache_bytes(cache_dir: Path) -> int:
    return sum(p.stat().st_size for p in cache_dir.rglob("*") if p.is_file())


def test_persistent_disk_cache_serves_a_second_mount(mount, moto, s3_env, zarr_s3, zarr_dir, tmp_path):
    cache = tmp_path / "cache"
    opts = ("--endpoint-url", moto.endpoint, "--cache-dir", str(cache), "--metadata-ttl", "indefinite")
    first = mount(zarr_s3, *opts, env=s3_env)
    _read_all(first.path, zarr_dir)
    s1 = _stats(first.path)
    assert s1["disk_cache_misses"] > 0 and s1.get("disk_cache_hits", 0) == 0
    assert _cache_bytes(cache) > 0
    mount.cleanup()

    second = mount(zarr_s3, *opts, env=s3_env)
    _read_all(second.path, zarr_dir)
    s2 = _stats(second.path)
    # every object came from disk: the only store traffic left is the listing
    assert s2["disk_cache_hits"] >= len(store_files(zarr_dir)) - 1
    assert s2.get("store_requests", 0) == 0, s2


def test_disk_cache_is_per_mount_unless_immutable(mount, moto, s3_env, zarr_s3, zarr_dir, tmp_path):
    cache = tmp_path / "cache"
    opts = ("--endpoint-url", moto.endpoint, "-o", f"cache_dir={cache}")
    first = mount(zarr_s3, *opts, env=s3_env)
    _read_all(first.path, zarr_dir)
    mount.cleanup()
    second = mount(zarr_s3, *opts, env=s3_env)
    _read_all(second.path, zarr_dir)
    s2 = _stats(second.path)
    assert s2.get("disk_cache_hits", 0) == 0  # data may have changed: nothing reused
    assert s2["store_requests"] > 0


def test_disk_cache_stays_within_its_bound(mount, moto, s3_env, zarr_s3, zarr_dir, tmp_path):
    cache = tmp_path / "cache"
    bound = 700 * 1024
    total = sum(p.stat().st_size for p in store_files(zarr_dir).values())
    assert total > bound  # the sample holds two 600 kB chunks, so the bound must bite
    m = mount(zarr_s3, "--endpoint-url", moto.endpoint, "--cache-dir", str(cache),
              "--cache-max-size", str(bound), env=s3_env)
    _read_all(m.path, zarr_dir)
    assert 0 < _cache_bytes(cache) <= bound
    assert _stats(m.path).get("disk_cache_evictions", 0) > 0
    assert not [p for p in cache.rglob("*.tmp")], os.listdir(cache)


def test_the_disk_caches_writer_passes_every_writer_call_on() -> None:
    """The disk cache wraps each S3 writer; a call it did not pass on fell to KeyWriter's
    default: with --cache-dir, an unlink S3 refused left its writers storing nothing
    (undiscard), an append went through write, and a SIGTERM's abandon said nothing of the
    kept bytes."""
    from zvfs.cache.disk import _ForgetOnCommit
    from zvfs.stores.base import KeyWriter

    calls = [n for n, v in vars(KeyWriter).items()
             if not n.startswith("_") and (callable(v) or isinstance(v, property))]
    assert {"commit", "close", "undiscard", "abandon", "append"} <= set(calls)
    assert [n for n in calls if n not in vars(_ForgetOnCommit)] == []
