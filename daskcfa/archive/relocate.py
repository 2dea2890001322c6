"""Rewrite fragment URIs after an archive moves: :func:`relocate`.

Moving an archive (disk to S3, one bucket to another) moves the fragments;
only the aggregation file has to learn where they went. :func:`relocate`
maps URI prefixes, old to new, and writes the aggregation file again in its
own dialect. Fragments are never opened.

How: the aggregation file is parsed into the model
(:class:`~daskcfa.model.AggregationDataset`), the URI column of every
aggregated variable is rewritten, and the model is encoded again by
:mod:`daskcfa.formats.encode`, then put in place under a temporary name and
moved (an interrupted relocation leaves the old file intact). So the
dialect is kept for the dialects daskcfa writes -- CF-1.13, CFA-0.6, CFA-0.5
and CFA-0.4 -- and so is the netCDF format of the file; instruction
variables get the encoder's names. For the dialects it reads but does not
write (cfdm and CFAPyX interim, NCA) relocation refuses unless ``format=``
names a dialect to convert to: rewriting those files by hand would mean a
second writer for formats that are on their way out.

URIs:

* Each fragment URI is resolved against the aggregation file's *old*
  location, then the longest matching prefix of ``mapping`` is replaced
  (prefixes match whole path segments: ``s3://old`` does not match
  ``s3://older/``).
* A URI that was relative stays relative -- to the *new* location of the
  aggregation file -- when both are on the same storage (the same local
  tree, bucket or host), as :func:`daskcfa.aggregate` writes references;
  otherwise it becomes absolute. Absolute URIs stay absolute.
* CFA-0.6 ``substitutions`` are expanded when the file is read, so the
  relocated file names every fragment in full.
* A CFA-0.6 fragment stored inside the aggregation file itself becomes a
  reference to the relocated aggregation file (which still holds it).

Checksums travel: those recorded for the fragments (the writer's manifest or
a fixity record, :mod:`daskcfa.storage.fixity`) are written, under the
relocated URIs, to the fixity record beside the relocated file, so that
``daskcfa verify --fixity`` checks the moved fragments against the bytes
first written.
"""

from __future__ import annotations

import os
import pathlib
import posixpath
import tempfile
import warnings
from dataclasses import replace
from contextlib import contextmanager
from typing import Any, Iterator, Mapping
from urllib.parse import quote

import dask.config
import numpy as np

from .. import storage
from ..choices import DEFAULT_URIS
from ..dataset import OpenedDataset
from ..errors import ArgumentError, CFAError, CFAFormatError, CFAWarning, redact
from ..formats.encode import FILE_FORMATS, absolute_reference, common_format, encode_aggregation
from ..write.request import dataset_model
from ..storage.history import Change
from ..storage.publish import WHOLE_FILE_MODES, check_mode
from ..write.commit import publish
from ..write.target import WriteTarget
from ..model import AggregatedVariable
from ..storage import fixity
from ..storage.access import Access, open_aggregation
from ..storage.fixity import Fixity
from ..storage.policy import LocationPolicy
from ..storage.profiles import take_login
from ..storage.uri import check_uri_style
from .aggregate import reference

__all__ = ["relocate"]

def relocate(
    url: str,
    mapping: Mapping[str, str],
    *,
    target: str | None = None,
    format: str | None = None,
    mode: str = "w-",
    storage_options: Mapping[str, Any] | None = None,
    uris: str = DEFAULT_URIS,
) -> str:
    """Rewrite the fragment URIs of the aggregation file ``url`` by prefix ``mapping``.

    ``mapping`` maps old prefixes to new ones, e.g. ``{"/data/archive/":
    "s3://bucket/archive/"}`` or ``{"s3://old-bucket/": "s3://new-bucket/"}``.
    The file is rewritten in place, or written to ``target`` (then ``mode``
    ``"w-"``, the default, refuses an existing target and ``"w"`` overwrites
    it); relative URIs are made relative to where the file ends up.
    ``format`` converts to another dialect (default: keep the file's own).
    Returns the URL of the relocated aggregation file. Fragments are not
    touched or checked: run :func:`daskcfa.verify` on the result for that.
    A prefix that matches no fragment URI is warned about
    (:class:`~daskcfa.CFAWarning`); when none matches, a file relocated in
    place is left untouched. ``uris="absolute"`` stores every fragment URI
    absolute (for readers that resolve relative ones against their working
    directory); ``mapping`` may then be empty, to convert an archive in place.
    """
    check_mode(mode, WHOLE_FILE_MODES)
    absolute = check_uri_style(uris) == "absolute"
    rules = _PrefixRules(mapping, empty_ok=absolute)
    url, access = open_aggregation(url, storage_options)
    in_place = not target or open_aggregation(target, storage_options)[0] == url
    # (in place, the file is rewritten whatever the mode: it is the source)
    out = WriteTarget.open(url if in_place else target, storage_options, "w" if in_place else mode,
                           modes=WHOLE_FILE_MODES, hint="relocate with mode='w' to overwrite it")
    new_url, out_profile = out.url, out.profile
    with _local_copy(url, access) as local:
        with storage.netcdf_file(local) as nc:
            data_model = nc.data_model
        with dask.config.set(scheduler="sync"):  # (a local temporary file: no cluster can read it)
            model, aggregated = dataset_model(OpenedDataset.open(local, access=Access.default(local)))
    variables = [var.aggregation for var in aggregated]
    if not variables:
        raise CFAFormatError("the file holds no aggregated variable: nothing to relocate", file=url)
    format = format or common_format(variables, url, "relocate it")
    model.aggregated = [_relocated(av, rules, url, new_url, local, format if absolute else None) for av in variables]
    rules.warn_unused(url)
    if in_place and not rules.used and not absolute:
        return url  # nothing matched: the file is left as it is
    _warn_unsafe(model.aggregated, new_url)
    file_format = data_model if data_model in FILE_FORMATS else "NETCDF4"
    payload = encode_aggregation(model, format=format, file_format=file_format)
    carried = _carried_fixity(url, access, variables, model.aggregated, local, new_url, rules)
    publish(new_url, payload, out.mode, out_profile,
            Change.of("relocate", source=url, mapping=dict(mapping),
                      format=format, uris=uris), detail=f"{model.nfragments} fragments referenced")
    if carried:
        fixity.write_record(new_url, carried, out_profile)
    return new_url


def _carried_fixity(url: str, access: Access, old: list[AggregatedVariable], new: list[AggregatedVariable],
                    local: str, new_url: str, rules: _PrefixRules) -> dict[str, Fixity]:
    """The checksums recorded for the fragments of ``url`` (manifest or fixity record), by the URIs
    the relocated file gives them: what the fixity record beside it holds, so that
    ``verify --fixity`` checks the moved fragments against the bytes first written. The manifest
    is looked for where it was, else where the mapping says it went with the fragments."""
    manifest = storage.manifest_uri(url)
    if not storage.exists(manifest, access.profile):
        manifest = rules.apply(storage.normalise(manifest)) or manifest
    try:
        references = {storage.resolve(u, url) for av in old for u in av.fragments.locations() if u != local}
        recorded = fixity.recorded(url, access.profile, references, manifest)
    except CFAError as exc:
        warnings.warn(f"the fragments' checksums are not carried to the relocated file: {exc}", CFAWarning,
                      stacklevel=3)
        return {}
    carried = {}
    for before, after in zip(old, new):
        if before.fragments.uris is None:
            continue
        for raw, moved in zip(before.fragments.uris.ravel(), after.fragments.uris.ravel()):
            source = "" if raw is None else str(raw)
            if source and source != local and storage.resolve(source, url) in recorded:
                carried[storage.resolve(str(moved), new_url)] = recorded[storage.resolve(source, url)]
    return carried


class _PrefixRules:
    """Old prefix -> new prefix, longest first, matched on whole path segments."""

    def __init__(self, mapping: Mapping[str, str], empty_ok: bool = False) -> None:
        if not mapping and not empty_ok:
            raise ArgumentError("relocate needs a mapping of old URI prefixes to new ones")
        rules = []
        for old, new in mapping.items():
            if not str(old).strip() or not str(new).strip():
                raise ArgumentError(f"empty prefix in mapping {redact(str(old))!r} -> {redact(str(new))!r}")
            rules.append((_bare(storage.normalise(str(old).strip())), _new_prefix(str(new).strip())))
        self.rules = sorted(rules, key=lambda rule: len(rule[0]), reverse=True)
        self.used: set[str] = set()

    def apply(self, uri: str) -> str | None:
        """``uri`` (absolute, normalised) with its prefix replaced, or None when no rule matches."""
        for old, new in self.rules:
            if uri == old or uri.startswith(old + "/"):
                self.used.add(old)
                return new + uri[len(old):]
        return None

    def warn_unused(self, url: str) -> None:
        unused = [old for old, _ in self.rules if old not in self.used]
        if unused:
            warnings.warn(f"{redact(url)}: no fragment URI starts with {', '.join(map(redact, unused))}", CFAWarning,
                          stacklevel=3)


def _bare(prefix: str) -> str:
    """A prefix without its trailing slash (``s3://b/`` -> ``s3://b``; ``/`` stays)."""
    return prefix.rstrip("/") or prefix


def _new_prefix(prefix: str) -> str:
    """The replacement prefix as it will be written: local ones made absolute, in the form given;
    without a login (a file is shared: whoever reads it gives the login again, as for ``aggregate``)."""
    if storage.is_local(prefix):
        path = _bare(storage.normalise(prefix))
        return pathlib.Path(path).as_uri() if prefix.startswith("file:") else path
    return _bare(take_login(prefix)[0])


@contextmanager
def _local_copy(url: str, access: Access) -> Iterator[str]:
    """The aggregation file as a local path (a remote file is fetched once, into a temporary directory)."""
    if storage.is_local(url):
        storage.local_stat(url)  # (it exists, and is a regular file: a FIFO would block netCDF-C)
        yield storage.local_path(url)
        return
    data = storage.read_bytes(url, access.profile)
    with tempfile.TemporaryDirectory(prefix="daskcfa-relocate-") as directory:
        path = os.path.join(directory, "aggregation.nc")
        with open(path, "wb") as out:
            out.write(data)
        yield path


def _relocated(av: AggregatedVariable, rules: _PrefixRules, old_url: str, new_url: str,
               local: str, absolute_in: str | None) -> AggregatedVariable:
    """``av`` with every fragment URI mapped (each distinct URI worked out once)."""
    uris = av.fragments.uris
    if uris is None:
        return av
    flat = np.array(["" if u is None else str(u) for u in uris.ravel()], dtype=object)
    distinct, inverse = np.unique(flat, return_inverse=True)
    moved = np.array([_moved(u, rules, old_url, new_url, local, absolute_in) for u in distinct], dtype=object)
    new = moved[inverse].reshape(uris.shape)
    return replace(av, fragments=replace(av.fragments, uris=new), source=new_url)


def _moved(raw: str, rules: _PrefixRules, old_url: str, new_url: str, local: str, absolute_in: str | None) -> str:
    """Where fragment reference ``raw`` (as written in the file at ``old_url``) points from ``new_url``;
    ``absolute_in``: the dialect whose absolute form to give it (None: relative stays relative)."""
    if raw == "":
        return raw
    if absolute_in is not None:
        if raw == local:  # a CFA-0.6 fragment inside the aggregation file
            return absolute_reference(new_url, absolute_in)
        resolved = storage.resolve(raw, old_url)
        return absolute_reference(rules.apply(resolved) or resolved, absolute_in)
    if raw == local:  # a CFA-0.6 fragment inside the aggregation file: it moves with the file
        name = new_url.rpartition("/")[2]
        return quote(name) if storage.is_local(new_url) else name
    absolute = storage.resolve(raw, old_url)
    mapped = rules.apply(absolute)
    relative = storage.is_local(raw) and not raw.startswith("file:") and not os.path.isabs(raw)
    if mapped is None:
        if not relative or posixpath.dirname(old_url) == posixpath.dirname(new_url):
            return raw
        mapped = absolute
    return reference(storage.normalise(mapped), new_url) if relative else mapped


def _warn_unsafe(variables: list[AggregatedVariable], new_url: str) -> None:
    """Warn when readers' default safe-URI policy will refuse relocated fragments."""
    policy = LocationPolicy.for_aggregation(new_url)
    resolved = {storage.resolve(u, new_url) for av in variables for u in av.fragments.locations()}
    refused = sorted(uri for uri in resolved if not policy.allows(uri))
    if refused:
        warnings.warn(
            f"{len(refused)} fragment location(s), e.g. {redact(refused[0])}, are outside what readers of "
            f"{redact(new_url)} may open by default; read it with allowed_locations=[...]", CFAWarning, stacklevel=3)
