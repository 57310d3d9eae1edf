"""The botocore client behind the S3 store, with three of botocore's costs taken out.

botocore is built for every AWS service at once; a mount talks to one. Each tweak
below changes no request and no answer, only work botocore repeats, and each
leaves botocore as it is where botocore is not laid out as expected:

- :func:`fast_timestamp`: timestamps parsed without dateutil (listing and GET CPU);
- :func:`reuse_endpoints`: one endpoint resolution per bucket, not per key (GET CPU);
- :func:`steady_user_agent`: the User-Agent header built once, not twice a request (CPU
  of every request);
- :func:`quick_service_lookup`: a client made without walking the directory of every
  AWS service botocore ships (the store's open, on the path to the first listing);
- :func:`_import_without_pyopenssl`: botocore imported without pyOpenSSL (35 ms of the
  mount and 10 MiB of the daemon's memory, where pyOpenSSL is installed).

Import this module before anything imports botocore, as :mod:`zvfs.stores.s3` does.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any


def _import_without_pyopenssl() -> None:
    """Import botocore with ``urllib3.contrib.pyopenssl`` hidden.

    botocore imports that module only to take from it urllib3's *original* SSLContext,
    the one pyOpenSSL's injection would replace. Where pyOpenSSL is installed (gsutil and
    the Google libraries pull it in), the import loads pyOpenSSL and cryptography: 35 ms
    and 10 MiB of RSS here. No one injects pyOpenSSL into the daemon, so urllib3's own
    SSLContext, which botocore falls back to when the import fails, is the same class.
    The module is hidden only while botocore is imported, so a later import of it works.
    """
    name = "urllib3.contrib.pyopenssl"
    if "botocore.httpsession" in sys.modules or name in sys.modules:
        return  # botocore is already in, or pyOpenSSL is: nothing to save
    sys.modules[name] = None  # type: ignore[assignment]  # an import of it now fails
    try:
        import botocore.httpsession  # noqa: F401
    finally:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]


_import_without_pyopenssl()

# isort: split
from botocore.context import get_context  # noqa: E402
from botocore.exceptions import DataNotFoundError  # noqa: E402
from botocore.utils import parse_timestamp  # noqa: E402

_EPOCH = datetime.fromtimestamp(0, UTC)


def fast_timestamp(value: str) -> datetime:
    """A timestamp of a response, as botocore's own parser reads it, but ISO 8601 with a zone
    (a listing's LastModified: '2026-11-26T10:41:01.000Z') by ``datetime.fromisoformat``,
    and an HTTP date in GMT (every GET's and HEAD's Last-Modified header:
    'Fri, 27 Nov 2026 18:20:01 GMT') by ``email.utils``.

    botocore hands every timestamp to dateutil, which took two thirds of the CPU of
    parsing a ListObjectsV2 page of 1,000 keys (~55 ms a page): at 200,000 keys that is
    seconds of the daemon's one GIL. A header's date cost each GET 97 us of it, 4 us by
    ``email.utils``. Anything else (a naive time, another zone) still goes to botocore's
    parser."""
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        parsed = _http_date(value)
    if parsed is not None and parsed.tzinfo is not None:
        return parsed
    try:
        return parse_timestamp(value)
    except (TypeError, ValueError, OverflowError):
        # no date at all: the key is still listed (with the epoch as its mtime), where the
        # whole page, and every listing that held it, failed
        return _EPOCH


def _http_date(value: str) -> datetime | None:
    """An HTTP date ending in GMT as an aware datetime, or None (then botocore's parser decides)."""
    if not isinstance(value, str) or not value.endswith(" GMT"):
        return None
    try:
        return parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None


#: the parameters S3's endpoint rules refer to (found once a process)
_RULESET_REFS: frozenset[str] | None = None


def _ruleset_refs(loader: Any) -> frozenset[str]:
    """The parameters S3's endpoint rules refer to, from the rule set the client's own
    loader read to build it (its cache: no second read of botocore's data)."""
    global _RULESET_REFS
    if _RULESET_REFS is None:
        refs: set[str] = set()
        stack: list[Any] = [loader.load_service_model("s3", "endpoint-rule-set-1")["rules"]]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                if isinstance(item.get("ref"), str):
                    refs.add(item["ref"])
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
        _RULESET_REFS = frozenset(refs)
    return _RULESET_REFS


def reuse_endpoints(client: Any) -> bool:
    """Let the client's resolved endpoint serve every key of a bucket.

    botocore resolves the endpoint of each request by evaluating S3's rule set, behind a
    cache keyed by all the request's parameters, ``Key`` included: a new key is a miss, and
    the evaluation was a sixth of a GET's CPU. ``Key``, ``Prefix`` and ``CopySource`` are
    declared by the rule set but no rule reads them, so they are dropped from what the
    cache sees; any parameter a rule does read still is. Returns False (and changes nothing)
    where botocore is not laid out as expected."""
    provider = getattr(getattr(client, "_ruleset_resolver", None), "_provider", None)
    resolve = getattr(provider, "resolve_endpoint", None)
    loader = getattr(client, "_loader", None)
    if resolve is None or loader is None:
        return False
    try:
        used = _ruleset_refs(loader)
    except Exception:  # noqa: BLE001 - an optimisation: without it the client is as botocore made it
        return False

    def resolve_endpoint(**params: Any) -> Any:
        return resolve(**{k: v for k, v in params.items() if k in used})

    provider.resolve_endpoint = resolve_endpoint
    return True


def steady_user_agent(client: Any) -> bool:
    """Let the client build its User-Agent header once for each set of features.

    botocore builds the header twice for every request (once with the request, once more
    to add the request's feature ids), cleaning each of some 20 components character by
    character: 5% of a 1 MiB GET's CPU here. Every input but the features (the session's
    and the client's settings, the platform, the Python) is fixed when the client is made,
    so the header is kept per set of features, the client's and the request's, and is the
    same string botocore would build. Returns False (and changes nothing) where botocore
    is not laid out as expected."""
    creator = getattr(client, "_user_agent_creator", None)
    build = getattr(creator, "to_string", None)
    if build is None or not hasattr(creator, "_client_features"):
        return False
    made: dict[tuple[frozenset[str], frozenset[str]], str] = {}

    def to_string() -> str:
        ctx = get_context()
        key = (frozenset(creator._client_features or ()), frozenset(ctx.features if ctx is not None else ()))
        header = made.get(key)
        if header is None:
            if len(made) >= 64:  # features are a handful; bounded all the same
                made.clear()
            header = made[key] = build()
        return header

    creator.to_string = to_string
    return True


class _KnownServices(Sequence[str]):
    """What a loader's ``list_available_services(type_name)`` returns, but ``name in it``
    is answered from that one service's directory.

    botocore checks that a service is known before it loads its model, by listing every
    service that has a ``type_name`` file: a walk of some 400 directories and 1,300 stats
    on each client's first load of a model type, 40-85 ms of an S3 store's open with a cold
    page cache. ``list_api_versions`` asks the same question of one service (a version
    directory holding a ``type_name`` file, on any search path). Anything that iterates the
    list still gets the whole walk, made once, on first use."""

    def __init__(self, loader: Any, type_name: str, walk: Callable[[str], list[str]]) -> None:
        self._loader = loader
        self._type = type_name
        self._walk = walk
        self._all: list[str] | None = None

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name.startswith("."):
            return name in self._list()  # not a plain directory name: as botocore would answer
        try:
            self._loader.list_api_versions(name, self._type)
        except DataNotFoundError:
            return False
        return True

    def _list(self) -> list[str]:
        if self._all is None:
            self._all = self._walk(self._type)
        return self._all

    def __getitem__(self, i: Any) -> Any:
        return self._list()[i]

    def __len__(self) -> int:
        return len(self._list())

    def __iter__(self) -> Iterator[str]:
        return iter(self._list())


def quick_service_lookup(loader: Any) -> bool:
    """Make ``loader`` (a botocore session's data loader) answer "is this service known?"
    without its walk of every service (see :class:`_KnownServices`). Returns False, and
    changes nothing, where the loader is not laid out as expected."""
    walk = getattr(loader, "list_available_services", None)
    if walk is None or not callable(getattr(loader, "list_api_versions", None)):
        return False
    loader.list_available_services = lambda type_name: _KnownServices(loader, type_name, walk)
    return True
