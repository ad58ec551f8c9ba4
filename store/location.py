"""Fleet locations: where published segments live. The only module that imports ``pyarrow``.

A LOCATION (``shared/CONTRACT.md``) is a local or mounted directory (NFS, Lustre, CephFS) or an
object-store URL:

* ``s3://BUCKET/PREFIX``: AWS or any S3-compatible service (MinIO, Ceph RGW, moto). Endpoint,
  region and credentials come from the usual places: ``AWS_ENDPOINT_URL_S3`` /
  ``AWS_ENDPOINT_URL``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID`` and
  ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE`` and ``~/.aws/credentials``, web identity (IRSA) and
  the instance profile (the AWS SDK's default chain).
* ``gs://BUCKET/PREFIX``: Google Cloud Storage with Application Default Credentials
  (``GOOGLE_APPLICATION_CREDENTIALS``, workload identity, the metadata server);
  ``STORAGE_EMULATOR_HOST`` points it at an emulator or private endpoint, without credentials.
* ``az://CONTAINER/PREFIX``: Azure Blob Storage, account from ``AZURE_STORAGE_ACCOUNT_NAME``,
  key from ``AZURE_STORAGE_ACCOUNT_KEY`` when set, else Azure's default credential chain
  (workload identity, managed identity, ``AZURE_CLIENT_ID``/``AZURE_TENANT_ID``/
  ``AZURE_CLIENT_SECRET``); or all from ``AZURE_STORAGE_CONNECTION_STRING``, whose
  ``BlobEndpoint`` names Azurite's or a sovereign cloud's endpoint.

Why pyarrow's filesystems: one PyPI wheel that speaks S3, GCS and Azure natively (C++ SDKs, no
Python SDK per cloud), reads Parquet datasets with column and partition pruning that DuckDB scans
directly, and never downloads anything at run time (DuckDB's httpfs extension would be fetched on
first use, which air-gapped clusters cannot do). fsspec with s3fs/gcsfs/adlfs would need three
more SDKs.

Writes are whole or nothing: on a directory, a segment is written to a hidden temporary name in
its final folder, fsynced and renamed over the final name (atomic on POSIX filesystems, NFS
included); on an object store, an object becomes visible only when its upload completes.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from store.errors import BadInput, Failure
from store.masking import mask_url
from store.safewrite import copy_file

SCHEMES = ("s3", "gs", "az")
_URL = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<bucket>[^/?#]*)(?P<prefix>/[^?#]*)?$")


class BadLocation(BadInput):
    """A LOCATION that cannot mean anything (unknown scheme, no bucket): exit 2."""


class LocationError(Failure):
    """The location could not be read or written (network, permissions, full disk): exit 1."""


@dataclass(frozen=True, slots=True)
class Location:
    """A parsed LOCATION: ``scheme`` is ``file`` for a directory, else ``s3``, ``gs`` or ``az``;
    ``root`` is the directory (``file``) or ``BUCKET/PREFIX`` without slashes at the ends."""

    scheme: str
    root: str
    _fs: list[Any] = field(default_factory=list, compare=False, repr=False)

    @property
    def url(self) -> str:
        """The canonical text: an absolute directory or ``scheme://bucket/prefix``."""
        return self.root if self.scheme == "file" else f"{self.scheme}://{self.root}"

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"

    def __str__(self) -> str:
        return self.url


def is_url(text: str) -> bool:
    """Whether ``text`` looks like ``scheme://...`` (an object-store LOCATION, or a mistake)."""
    return "://" in text


def parse(text: str, what: str = "--to") -> Location:
    """A LOCATION from the user's text. Raises :class:`BadLocation` naming ``what``."""
    text = text.strip()
    if not text:
        raise BadLocation(f"{what}: empty location (give a directory or s3://BUCKET/PREFIX)")
    if not is_url(text):
        if text.startswith("file:"):
            text = text.removeprefix("file:").removeprefix("//")
        return Location("file", str(Path(text).expanduser().absolute()))
    match = _URL.match(text)
    if not match or match.group("scheme") not in SCHEMES:
        raise BadLocation(
            f"{what} {mask_url(text)}: unknown location (use a directory, s3://BUCKET/PREFIX, "
            "gs://BUCKET/PREFIX or az://CONTAINER/PREFIX)"
        )
    bucket, scheme = match.group("bucket"), match.group("scheme")
    if not bucket:
        raise BadLocation(f"{what} {mask_url(text)}: no bucket (use {scheme}://BUCKET/PREFIX)")
    if "@" in bucket:  # never echo, log or store credentials given in the location
        raise BadLocation(
            f"{what} {mask_url(text)}: credentials in the location are not accepted (they would "
            "land in logs); give them as usual (AWS_*, GOOGLE_APPLICATION_CREDENTIALS, AZURE_*)"
        )
    prefix = (match.group("prefix") or "").strip("/")
    root = f"{bucket}/{prefix}" if prefix else bucket
    return Location(match.group("scheme"), root)


# -- the filesystems -------------------------------------------------------------------------------


def _filesystem(location: Location) -> Any:
    """The pyarrow filesystem of an object-store location (made once per Location)."""
    if not location._fs:
        location._fs.append(_make_filesystem(location))
    return location._fs[0]


def _make_filesystem(location: Location) -> Any:
    from pyarrow import fs  # noqa: PLC0415  (loaded only where a location is used)

    try:
        if location.scheme == "s3":
            return fs.S3FileSystem(**s3_options(os.environ))
        if location.scheme == "gs":
            return fs.GcsFileSystem(**gcs_options(os.environ))
        return _azure(fs, os.environ)
    except (OSError, ValueError, TypeError) as exc:
        raise LocationError(f"{location}: cannot open ({_one_line(exc)})") from None


def s3_options(env: Any) -> dict[str, Any]:
    """S3FileSystem arguments from the ``AWS_*`` variables (the SDK reads credentials itself)."""
    options: dict[str, Any] = {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        scheme, _, rest = endpoint.partition("://")
        if not rest:
            scheme, rest = "https", endpoint
        options["endpoint_override"] = rest.rstrip("/")
        options["scheme"] = scheme
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        options["region"] = region
    elif endpoint:
        options["region"] = "us-east-1"  # S3-compatible services ignore it; skip the lookup
    return options


def gcs_options(env: Any) -> dict[str, Any]:
    """GcsFileSystem arguments: ``STORAGE_EMULATOR_HOST`` (Google's variable for an emulator or
    a private endpoint, ``http://127.0.0.1:9023``) points it there, without credentials;
    otherwise Application Default Credentials (the C++ SDK reads them itself)."""
    endpoint = env.get("STORAGE_EMULATOR_HOST")
    if not endpoint:
        return {}
    scheme, _, rest = endpoint.partition("://")
    if not rest:
        scheme, rest = "http", endpoint
    return {"endpoint_override": rest.rstrip("/"), "scheme": scheme, "anonymous": True}


def azure_options(env: Any) -> dict[str, Any]:
    """AzureFileSystem arguments: the account (``AZURE_STORAGE_ACCOUNT_NAME``) and key
    (``AZURE_STORAGE_ACCOUNT_KEY``), or both and the endpoint from
    ``AZURE_STORAGE_CONNECTION_STRING`` (``AccountName=…;AccountKey=…;BlobEndpoint=…``, as the
    portal and Azurite give it); without a key, Azure's default credential chain."""
    parts = dict(
        item.split("=", 1)
        for item in (env.get("AZURE_STORAGE_CONNECTION_STRING") or "").split(";")
        if "=" in item
    )
    account = (
        env.get("AZURE_STORAGE_ACCOUNT_NAME")
        or env.get("AZURE_STORAGE_ACCOUNT")
        or parts.get("AccountName")
    )
    if not account:
        raise BadLocation(
            "az:// needs the storage account: set AZURE_STORAGE_ACCOUNT_NAME "
            "(and AZURE_STORAGE_ACCOUNT_KEY, or a managed or workload identity), or "
            "AZURE_STORAGE_CONNECTION_STRING"
        )
    key = (
        env.get("AZURE_STORAGE_ACCOUNT_KEY")
        or env.get("AZURE_STORAGE_KEY")
        or parts.get("AccountKey")
    )
    options: dict[str, Any] = {"account_name": account, "account_key": key or None}
    endpoint = parts.get("BlobEndpoint")
    if endpoint:  # Azurite or a sovereign cloud: ``http://127.0.0.1:10000/devstoreaccount1``
        scheme, _, rest = endpoint.partition("://")
        authority = (rest or scheme).split("/")[0]
        scheme = scheme if rest else "https"
        # The Data Lake endpoint (pyarrow asks it whether the account has a hierarchical
        # namespace before writing) is the same service on an emulator.
        options |= {"blob_storage_authority": authority, "blob_storage_scheme": scheme}
        options |= {"dfs_storage_authority": authority, "dfs_storage_scheme": scheme}
    return options


def _azure(fs: Any, env: Any) -> Any:
    return fs.AzureFileSystem(**azure_options(env))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


# -- writing ---------------------------------------------------------------------------------------


def put(location: Location, relpath: str, source: Path) -> None:
    """Copy the local file ``source`` to ``relpath`` under the location, whole or not at all.
    Overwrites: a retry after a crash replaces the same segment. Raises :class:`LocationError`."""
    try:
        if location.is_local:
            _put_local(Path(location.root) / relpath, source)
        else:
            _put_object(location, relpath, source)
    except (OSError, ValueError) as exc:  # pyarrow: ArrowIOError, ArrowInvalid
        raise LocationError(f"{location}: cannot write {relpath} ({_one_line(exc)})") from None


def _put_local(target: Path, source: Path) -> None:
    # A hidden, unpredictable temporary name (O_EXCL | O_NOFOLLOW), fsync, rename: mode 0640,
    # for segments name other users' processes.
    copy_file(source, target)


def _put_object(location: Location, relpath: str, source: Path) -> None:
    data = source.read_bytes()
    with _filesystem(location).open_output_stream(f"{location.root}/{relpath}") as out:
        out.write(data)


def delete(location: Location, relpaths: Iterable[str]) -> None:
    """Remove ``relpaths`` under the location (ones already gone are fine: two removers, or
    a retry). Raises :class:`LocationError` (no delete permission, the service down)."""
    for relpath in relpaths:
        try:
            if location.is_local:
                with contextlib.suppress(FileNotFoundError):
                    (Path(location.root) / relpath).unlink()
            else:
                _delete_object(location, relpath)
        except (OSError, ValueError) as exc:  # pyarrow: ArrowIOError, ArrowInvalid
            raise LocationError(f"{location}: cannot remove {relpath} ({_one_line(exc)})") from None


def _delete_object(location: Location, relpath: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        _filesystem(location).delete_file(f"{location.root}/{relpath}")


# -- reading ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class Entry:
    """A file under a location: its path relative to the location's root, and its size."""

    relpath: str
    size_bytes: int


def list_dirs(location: Location, relpath: str) -> list[str]:
    """The names of the folders directly under ``relpath`` (none when it does not exist)."""
    try:
        if location.is_local:
            base = Path(location.root) / relpath
            if not base.is_dir():
                return []
            return sorted(e.name for e in os.scandir(base) if e.is_dir())
        infos = _infos(location, relpath, recursive=False)
        if not infos:
            return _dirs_from_files(location, relpath)
        return sorted(info.base_name for info in infos if info.type.name == "Directory")
    except (OSError, ValueError) as exc:  # pyarrow: ArrowIOError, ArrowInvalid
        raise LocationError(f"{location}: cannot list {relpath} ({_one_line(exc)})") from None


def _dirs_from_files(location: Location, relpath: str) -> list[str]:
    """The folders under ``relpath`` from a recursive listing: pyarrow's GCS filesystem sees
    no folders in gcp-storage-emulator's answer to a delimited listing (issue 26), and a
    listing with nothing at all costs nothing more to repeat recursively."""
    base = f"{location.root}/{relpath}".rstrip("/") + "/"
    found = {
        info.path[len(base) :].split("/", 1)[0]
        for info in _infos(location, relpath, recursive=True)
        if info.path.startswith(base) and "/" in info.path[len(base) :]
    }
    return sorted(found)


def list_files(location: Location, relpath: str) -> list[Entry]:
    """Every finished file under ``relpath``, recursively (temporary names left by an
    interrupted write are skipped)."""
    try:
        if location.is_local:
            base = Path(location.root)
            start = base / relpath
            if not start.is_dir():
                return []
            return sorted(
                Entry(str(p.relative_to(base)), p.stat().st_size)
                for p in start.rglob("*")
                if p.is_file() and not p.name.startswith(".")
            )
        prefix = len(location.root) + 1
        return sorted(
            Entry(info.path[prefix:], int(info.size or 0))
            for info in _infos(location, relpath, recursive=True)
            if info.type.name == "File" and not info.base_name.startswith(".")
        )
    except (OSError, ValueError) as exc:  # pyarrow: ArrowIOError, ArrowInvalid
        raise LocationError(f"{location}: cannot list {relpath} ({_one_line(exc)})") from None


def _infos(location: Location, relpath: str, recursive: bool) -> list[Any]:
    from pyarrow import fs  # noqa: PLC0415

    path = f"{location.root}/{relpath}".rstrip("/")
    selector = fs.FileSelector(path, recursive=recursive, allow_not_found=True)
    return list(_filesystem(location).get_file_info(selector))


def fetch(location: Location, relpaths: list[str], folder: Path, threads: int = 8) -> None:
    """Copy ``relpaths`` of the location into ``folder`` (same relative paths), in parallel.
    Raises :class:`LocationError`."""
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    def one(relpath: str) -> None:
        target = folder / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        if location.is_local:
            target.write_bytes((Path(location.root) / relpath).read_bytes())
            return
        with _filesystem(location).open_input_stream(f"{location.root}/{relpath}") as src:
            target.write_bytes(src.read())

    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(one, relpaths))
    except (OSError, ValueError) as exc:  # pyarrow: ArrowIOError, ArrowInvalid
        raise LocationError(f"{location}: cannot read segments ({_one_line(exc)})") from None


_ARROW_TYPES = {"DOUBLE": "float64", "BIGINT": "int64", "VARCHAR": "string", "BOOLEAN": "bool_"}


def dataset(location: Location, relpaths: Iterable[str], columns: list[tuple[str, str]]) -> Any:
    """A lazy Parquet dataset over ``relpaths`` of an object-store location with the given
    (column, SQL type) schema: a column a segment lacks (an older schema) reads as null, one it
    has beyond the schema is ignored. DuckDB scans it directly, reading only the columns and
    row groups a query needs."""
    import pyarrow as pa  # noqa: PLC0415
    from pyarrow import dataset as ds  # noqa: PLC0415

    schema = pa.schema([(name, getattr(pa, _ARROW_TYPES[sql])()) for name, sql in columns])
    paths = [f"{location.root}/{p}" for p in relpaths]
    try:
        return ds.dataset(paths, schema=schema, format="parquet", filesystem=_filesystem(location))
    except (OSError, pa.ArrowException) as exc:
        raise LocationError(f"{location}: cannot read segments ({_one_line(exc)})") from None
