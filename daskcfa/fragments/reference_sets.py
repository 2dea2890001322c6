"""fsspec reference sets (kerchunk's format), parsed by daskcfa into plain entries.

A reference set is untrusted input, as an aggregation file is: it arrives
from storage and names other files. fsspec's ``ReferenceFileSystem`` expands
a version-1 set's URLs with ``str.format`` (which walks attributes: a URL
``{{t.__globals__[...]}}`` reads the reader's memory) or jinja2, and runs
``gen`` entries; so daskcfa never hands a set to it. Instead each key becomes
either inline bytes or a :class:`Target` -- a resolved URL, allowed by the
read's safe-URI policy, with an offset and a length -- before anything is
read from it:

* ``{{name}}`` in a URL is replaced, textually and once, by the template
  ``name`` (a plain string without braces); any other brace field, a
  template holding braces, an undeclared name and ``gen`` entries are
  refused (:class:`~daskcfa.errors.FragmentReadError`);
* every target is resolved against the set's own location and checked by
  the policy (a refusal is an :class:`~daskcfa.errors.UnsafeURIError`
  quoting the URL redacted);
* entries and inline bytes are counted against ``daskcfa.limits.max-memory``
  before they are kept: a JSON set may take at most that once parsed
  (``limits.JSON_EXPANSION`` bytes per character), and a
  Parquet set (fsspec's lazy layout: ``.zmetadata`` and
  ``<array>/refs.<n>.parq`` files of ``record_size`` rows) is read with
  pyarrow one file at a time, as its chunks are asked for, each file charged
  from its footer before its columns are read.
"""

from __future__ import annotations

import base64
import binascii
from abc import ABC, abstractmethod
import io
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from .. import storage
from ..errors import BudgetError, CFAError, CFAFormatError, FragmentReadError, redact
from .. import limits
from ..storage.policy import LocationPolicy
from ..storage.profiles import ProfileRef

__all__ = ["Target", "ReferenceSet", "open_reference_set", "METADATA_NAMES"]

#: The names of Zarr metadata documents (v2 and v3): everything else under an array is a chunk.
METADATA_NAMES = frozenset({".zarray", ".zgroup", ".zattrs", ".zmetadata", "zarr.json"})
#: What one entry costs held in memory (a key, a target and its numbers).
ENTRY_BYTES = 256
#: A URL field daskcfa expands: ``{{name}}``, spaces allowed inside the braces as jinja2 writes them.
_FIELD = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
#: A Parquet set's columns (``raw``: inline bytes; else ``path``, ``offset`` and ``size``).
_COLUMNS = ("path", "offset", "size", "raw")


@dataclass(frozen=True)
class Target:
    """Bytes of another file: ``length`` bytes from ``offset`` (``length`` None: the whole file)."""

    url: str
    offset: int
    length: int | None


class ReferenceSet(ABC):
    """A parsed reference set: Zarr metadata documents, and each chunk's inline bytes or target."""

    def __init__(self, uri: str, profile: ProfileRef, policy: LocationPolicy | None) -> None:
        self.uri, self._profile = uri, profile
        self.policy = policy if policy is not None else LocationPolicy.for_aggregation(uri)
        self._resolved: dict[str, str] = {}  # URL as written -> resolved and allowed
        self._charged = 0

    # -- what the Zarr store asks --------------------------------------------------------------

    @abstractmethod
    def metadata(self) -> Mapping[str, bytes]:
        """Every Zarr metadata document (key -> JSON bytes)."""

    @abstractmethod
    def entry(self, key: str) -> bytes | Target | None:
        """The chunk ``key``: inline bytes, a target, or None (not in the set: the fill value)."""

    @abstractmethod
    def keys(self) -> Iterator[str]:
        """Every key whose entry is held in memory (metadata documents at least)."""

    # -- parsing rules shared by JSON and Parquet sets -----------------------------------------

    def _charge(self, nbytes: int, what: str) -> None:
        limits.charge(self._charged + nbytes, f"{what} (with the {self._charged:,} bytes already held)",
                      file=self.uri)
        self._charged += nbytes

    def _inline(self, key: str, value: str | bytes) -> bytes:
        data = value.encode() if isinstance(value, str) else bytes(value)
        if data.startswith(b"base64:"):
            try:
                return base64.b64decode(data[7:], validate=True)
            except (binascii.Error, ValueError):
                raise self._error(f"entry {key!r} is not valid base64") from None
        return data

    def _target(self, key: str, url: Any, offset: Any = 0, length: Any = None,
                templates: Mapping[str, str] | None = None) -> Target:
        if not isinstance(url, str) or not url:
            raise self._error(f"entry {key!r} names no URL")
        if templates is not None:
            url = _expand(url, templates, lambda why: self._error(f"entry {key!r}: {why}"))
        if "{{" in url or "}}" in url:
            raise self._error(f"entry {key!r}: URL {redact(url)!r} holds a brace field, which daskcfa does not expand")
        for number in (offset, length):
            if number is not None and (not isinstance(number, int) or isinstance(number, bool) or number < 0):
                raise self._error(f"entry {key!r}: offset and length must be integers >= 0, not {number!r}")
        resolved = self._resolved.get(url)
        if resolved is None:
            resolved = storage.resolve(url, self.uri)
            self.policy.check(resolved)
            self._resolved[url] = resolved
        return Target(resolved, int(offset or 0), None if length is None else int(length))

    def _error(self, why: str) -> FragmentReadError:
        return FragmentReadError(f"reference set refused: {why}", file=self.uri)


def _expand(url: str, templates: Mapping[str, str], error: Any) -> str:
    """``url`` with each ``{{name}}`` replaced by its template, textually, once."""
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in templates:
            raise error(f"URL template {name!r} is not declared")
        return templates[name]

    return _FIELD.sub(one, url)


class _JSONSet(ReferenceSet):
    """A JSON reference set (versions 0 and 1), every entry parsed when opened."""

    def __init__(self, uri: str, profile: ProfileRef, policy: LocationPolicy | None) -> None:
        super().__init__(uri, profile, policy)
        try:
            document = storage.read_json(uri, profile, policy=policy)
        except BudgetError as exc:
            raise FragmentReadError(f"{exc.reason}; store large reference sets as Parquet", file=uri) from None
        except CFAFormatError as exc:
            raise self._error(exc.reason) from None
        if not isinstance(document, dict):
            raise self._error("not a JSON object")
        version = document.get("version")
        if version is None:
            refs, templates = document, None
        elif version == 1:
            unknown = sorted(set(document) - {"version", "templates", "refs", "gen"})
            if unknown:
                raise self._error(f"unknown version-1 fields {unknown}")
            if document.get("gen"):
                raise self._error("'gen' entries (generated keys) are not read by daskcfa: list the keys in 'refs'")
            refs, templates = document.get("refs", {}), _templates(document.get("templates", {}), self._error)
        else:
            raise self._error(f"unknown reference set version {redact(str(version))[:40]!r}")
        if not isinstance(refs, dict):
            raise self._error("'refs' is not an object")
        self._charge(ENTRY_BYTES * len(refs), f"reference set of {len(refs):,} entries")
        self._metadata: dict[str, bytes] = {}
        self._chunks: dict[str, bytes | Target] = {}
        inline = 0
        for key, value in refs.items():
            if isinstance(value, dict):
                data: bytes | Target = json.dumps(value).encode()
            elif isinstance(value, str):
                data = self._inline(key, value)
            elif isinstance(value, list) and len(value) in (1, 3):
                data = self._target(key, *value, templates=templates)
            else:
                raise self._error(f"entry {key!r} is not inline data, [url] or [url, offset, length]")
            inline += len(data) if isinstance(data, bytes) else 0
            if key.rsplit("/", 1)[-1] in METADATA_NAMES:
                if not isinstance(data, bytes):
                    raise self._error(f"metadata document {key!r} must be inline")
                self._metadata[key] = data
            else:
                self._chunks[key] = data
        self._charge(inline, f"reference set's {inline:,} bytes of inline data")

    def metadata(self) -> Mapping[str, bytes]:
        return self._metadata

    def entry(self, key: str) -> bytes | Target | None:
        return self._chunks.get(key)

    def keys(self) -> Iterator[str]:
        yield from self._metadata
        yield from self._chunks


def _templates(templates: Any, error: Any) -> dict[str, str]:
    if not isinstance(templates, dict):
        raise error("'templates' is not an object")
    for name, value in templates.items():
        if not isinstance(value, str) or "{" in value or "}" in value:
            raise error(f"template {name!r} is not a plain string (templates holding braces are not expanded)")
    return templates


class _ParquetSet(ReferenceSet):
    """fsspec's Parquet layout: its ``.zmetadata`` read when opened, each ``refs.<n>.parq`` file
    when a chunk in it is first asked for (read with pyarrow; charged before it is read)."""

    def __init__(self, uri: str, profile: ProfileRef, policy: LocationPolicy | None) -> None:
        super().__init__(uri, profile, policy)
        try:
            import pyarrow.parquet  # noqa: F401  (fails early, with what to install)
        except ImportError:
            raise FragmentReadError("a Parquet reference set needs pyarrow (pip install 'daskcfa[parquet]')",
                                    file=uri) from None
        self._root = uri.rstrip("/")
        head = f"{self._root}/.zmetadata"
        size = storage.size(head, profile, policy=policy)  # (charged below as it expands when parsed)
        try:
            document = storage.read_json(head, profile, known_size=size, policy=policy)
        except (BudgetError, CFAFormatError) as exc:
            raise self._error(f".zmetadata: {exc.reason}") from None
        if not isinstance(document, dict) or not isinstance(document.get("metadata"), dict):
            raise self._error(".zmetadata holds no 'metadata' object")
        record_size = document.get("record_size")
        if not isinstance(record_size, int) or isinstance(record_size, bool) or record_size < 1:
            raise self._error(f"record_size must be an integer >= 1, not {redact(str(record_size))[:40]!r}")
        self._record_size = record_size
        self._metadata = {}
        for key, value in document["metadata"].items():
            if key.rsplit("/", 1)[-1] not in METADATA_NAMES:
                raise self._error(f".zmetadata holds {key!r}, not a Zarr metadata document")
            if any(part in ("", ".", "..") for part in key.split("/")[:-1]) or "\\" in key:
                raise self._error(f".zmetadata key {key!r} is not a plain path below the set")  # (record file names)
            self._metadata[key] = json.dumps(value).encode() if isinstance(value, dict) else self._inline(key, value)
        self._charge(size * limits.JSON_EXPANSION, f"Parquet reference set metadata of {size:,} bytes")
        self._records: dict[tuple[str, int], dict[str, list[Any]]] = {}

    def metadata(self) -> Mapping[str, bytes]:
        return self._metadata

    def keys(self) -> Iterator[str]:
        yield from self._metadata

    def entry(self, key: str) -> bytes | Target | None:
        if "/" not in key:
            return None
        field, chunk = key.rsplit("/", 1)
        number = self._chunk_number(field, chunk)
        if number is None:
            return None
        record, row = divmod(number, self._record_size)
        columns = self._record(field, record)
        if columns is None or row >= len(columns["offset"]):
            return None
        raw = columns["raw"][row] if "raw" in columns else None
        if raw is not None:
            return self._inline(key, raw)
        path = columns["path"][row]
        if path is None:
            return None
        offset, size = columns["offset"][row], columns["size"][row]
        if not offset and not size:  # (0 or null: the whole file, as fsspec reads it)
            return self._target(key, path)
        return self._target(key, path, offset, size)

    def _chunk_number(self, field: str, chunk: str) -> int | None:
        """The chunk's place in the array's C-order chunk grid (fsspec's row numbering)."""
        try:
            meta = json.loads(self._metadata[f"{field}/.zarray"])
            grid = [math.ceil(int(s) / int(c)) for s, c in zip(meta["shape"], meta["chunks"])] or [1]
            index = [int(i) for i in chunk.split(".")]
        except (KeyError, ValueError, TypeError, ZeroDivisionError):
            return None
        if len(index) != len(grid) or any(not 0 <= i < n for i, n in zip(index, grid)):
            return None
        number = 0
        for i, n in zip(index, grid):
            number = number * n + i
        return number

    def _record(self, field: str, record: int) -> dict[str, list[Any]] | None:
        cached = self._records.get((field, record))
        if cached is None and (field, record) not in self._records:
            cached = self._records[field, record] = self._read_record(f"{self._root}/{field}/refs.{record}.parq")
        return cached

    def _read_record(self, uri: str) -> dict[str, list[Any]] | None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            size = storage.size(uri, self._profile, policy=self.policy)
        except CFAError:  # (no file: the chunks it would hold are not written)
            return None
        self._charge(size, f"Parquet reference file of {size:,} bytes")
        data = storage.read_bytes(uri, self._profile, known_size=size, policy=self.policy)
        try:
            # (strings kept dictionary-encoded as read: a repeated value is held once until charged)
            stored = pq.ParquetFile(io.BytesIO(data)).schema_arrow.names
            parquet = pq.ParquetFile(io.BytesIO(data), read_dictionary=[n for n in ("path", "raw") if n in stored])
            meta = parquet.metadata
            names = [n for n in _COLUMNS if n in parquet.schema_arrow.names]
            if meta.num_rows > self._record_size or "raw" not in names and not {"path", "offset", "size"} <= set(names):
                raise self._error(f"{redact(uri)}: {meta.num_rows:,} rows of columns {names}, expected at most "
                                  f"{self._record_size:,} rows of {list(_COLUMNS)}")
            columns: dict[str, list[Any]] = {}
            for name in names:  # column by column, row group by row group, each charged before it is read
                j = parquet.schema_arrow.names.index(name)
                _check_column_type(name, parquet.schema_arrow.field(j).type,
                                   lambda why: self._error(f"{redact(uri)}: {why}"))
                held = sum(meta.row_group(g).column(j).total_uncompressed_size for g in range(meta.num_row_groups))
                self._charge(held + limits.STRING_BYTES * meta.num_rows, f"column {name!r} of {redact(uri)}")
                values: list[Any] = []
                for g in range(meta.num_row_groups):
                    column = parquet.read_row_group(g, columns=[name]).column(0)
                    self._charge(_expanded_bytes(column), f"the values of column {name!r} of {redact(uri)}")
                    values.extend(column.to_pylist())
                columns[name] = values
        except (pa.ArrowException, OSError, ValueError, TypeError) as exc:
            if isinstance(exc, CFAError):
                raise
            raise self._error(f"{redact(uri)} is not a readable Parquet reference file ({exc})") from None
        if "raw" not in columns:
            columns["raw"] = [None] * meta.num_rows
        for name in ("path", "offset", "size"):
            columns.setdefault(name, [None] * meta.num_rows)
        return columns


def _check_column_type(name: str, arrow_type: Any, error: Any) -> None:
    """Refuse a column whose values are not what fsspec writes there (a ``raw`` column of
    integers would become that many zero bytes: a chunk of zeros, silently)."""
    import pyarrow as pa

    value_type = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    strings = pa.types.is_string(value_type) or pa.types.is_large_string(value_type)
    binary = pa.types.is_binary(value_type) or pa.types.is_large_binary(value_type)
    allowed = {"path": strings, "raw": strings or binary}.get(name, pa.types.is_integer(value_type))
    if not (allowed or pa.types.is_null(value_type)):
        raise error(f"column {name!r} holds {arrow_type}, not what a reference set stores there")


def _expanded_bytes(column: Any) -> int:
    """The bytes a column's dictionary-encoded strings take once each row holds its own: a few
    kB of Parquet may repeat a megabyte-long string a million times."""
    import pyarrow as pa
    import pyarrow.compute as pc

    total = 0
    for chunk in column.chunks:
        if pa.types.is_dictionary(chunk.type) and len(chunk.dictionary):
            lengths = pc.binary_length(chunk.dictionary).take(chunk.indices)
            total += int(pc.sum(lengths).as_py() or 0)
    return total


def open_reference_set(uri: str, profile: ProfileRef = storage.NO_PROFILE, *,
                       policy: LocationPolicy | None = None) -> ReferenceSet:
    """The reference set at ``uri`` (JSON, or a Parquet directory ``*.parq``/``*.parquet``), parsed."""
    if uri.rstrip("/").endswith((".parq", ".parquet")):
        return _ParquetSet(uri, profile, policy)
    return _JSONSet(uri, profile, policy)
