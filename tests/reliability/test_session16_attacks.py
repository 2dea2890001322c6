"""Attacks on the doors session 16 added (attack16c): the body deadline of S3 GETs (storage/deadline.py)
on the ways it was not put on, xarray's lazy decoding tried at open (xarray_backend), the redaction of
logins (errors._USERINFO), and attack16a's refusals of targets named through a linked directory.

Real parts only: a real HTTP server on 127.0.0.1 answering as S3 (a byte at a time), netCDF-4 files
written by netCDF4-python, xarray. Each test of a fix failed on main as it was (35c8285)
(docs/reliability.md, "Session 16's doors attacked (attack16c)").
"""

from __future__ import annotations


import dask
import netCDF4
import numpy as np
import pytest

import daskcfa
from daskcfa import storage

from remote_helpers import failure_within, trickling_server

from .test_direct_s3_attacks import KEY, SECRET

_URI = "s3://bucket/f/0.nc"


@pytest.mark.parametrize("door", ["large object in parts", "indexed ranges"])
def test_a_ranged_get_trickled_a_byte_at_a_time_ends_within_its_deadline(door):
    """Session 16 put the body deadline on the GETs of whole S3 objects only: a large object read as
    concurrent ranged GETs (``read_whole`` with a ``known_size`` above two parts) and the ranged GETs
    of indexed reads (``read_ranges_unchanged``) still read a trickled body for as long as its declared
    length lasted (main, 35c8285: 400 bytes at a byte every 0.05 s, 20 s; a 16 MiB part: days). Now the
    same deadline: a ``StorageError`` naming the object, within a few seconds."""
    endpoint, stop, listener = trickling_server(length=1200)
    profile = storage.profiles.register({"key": KEY, "secret": SECRET, "config_kwargs": {"read_timeout": 2},
                                         "client_kwargs": {"endpoint_url": endpoint}}, protocol="s3")

    def read() -> None:
        with dask.config.set({"daskcfa.storage.retries": 0, "daskcfa.storage.part-size": 400}):
            if door == "large object in parts":
                storage.read_whole(_URI, profile, known_size=1200)
            else:
                storage.objects.read_ranges_unchanged(_URI, [(0, 400), (400, 400)], (1200, '"e"'), profile)

    failure = failure_within(read, stop, listener, 10)
    assert isinstance(failure, daskcfa.errors.StorageError), \
        f"after 10 s (read_timeout 2 s): {failure!r} (None: still receiving)"
    assert "too slowly" in str(failure) and failure.file == _URI
    assert SECRET not in str(failure) and KEY not in str(failure)


def _with_a_label(tmp_path, encoding: str) -> list:
    """Two netCDF-4 files of ``x(n)``, each with the same ``char`` variable ``label`` whose
    ``_Encoding`` is ``encoding``."""
    paths = []
    for k in range(2):
        paths.append(tmp_path / f"f{k}.nc")
        with netCDF4.Dataset(paths[-1], "w") as nc:
            for dimension, length in (("n", 2), ("m", 4)):
                nc.createDimension(dimension, length)
            nc.createVariable("n", "i4", ("n",))[:] = [2 * k, 2 * k + 1]
            nc.createVariable("x", "f4", ("n",))[:] = [k, k]
            label = nc.createVariable("label", "S1", ("m",))  # (the same in each file: stored, not aggregated)
            label._Encoding = encoding
            label.set_auto_chartostring(False)
            label[:] = np.frombuffer(b"abcd", "S1")
    return paths


@pytest.mark.parametrize("encoding", ["no-such-codec", "rot13"])
def test_characters_with_an_encoding_that_is_no_text_codec_are_refused_at_open(tmp_path, encoding):
    """A ``char`` variable whose ``_Encoding`` names no text codec: the check at open tried it on one
    stored zero -- an empty string, which every codec name decodes without looking it up -- so on main
    (35c8285) the open said nothing and ``.load()`` raised a bare ``LookupError``. Now the open is a
    ``CFAFormatError`` naming the file and the variable; "utf-8", "utf-16" and "idna" still open."""
    import xarray as xr

    aggregation = daskcfa.aggregate([str(p) for p in _with_a_label(tmp_path, "utf-8")], str(tmp_path / "agg.nc"))
    assert xr.open_dataset(aggregation, engine="daskcfa")["label"].values[()] == "abcd"
    for text_codec, text in (("idna", "abcd"), ("utf-16", b"abcd".decode("utf-16"))):  # (idna: "strict" only)
        with netCDF4.Dataset(aggregation, "a") as nc:
            nc["label"]._Encoding = text_codec
        assert xr.open_dataset(aggregation, engine="daskcfa")["label"].values[()] == text
    with netCDF4.Dataset(aggregation, "a") as nc:
        nc["label"]._Encoding = encoding
    with pytest.raises(daskcfa.errors.CFAFormatError) as caught:
        xr.open_dataset(aggregation, engine="daskcfa").load()
    assert caught.value.file == str(aggregation) and "variable 'label'" in str(caught.value)


@pytest.mark.parametrize("encoding", ["no-such-codec", "rot13"])
def test_aggregating_files_whose_characters_name_no_text_codec_is_a_daskcfa_error(tmp_path, encoding):
    """``daskcfa.aggregate`` over sources holding such a variable: netCDF4-python's own decoding of it
    raised a bare ``LookupError`` out of ``aggregate`` on main (35c8285; the scan turned a
    ``KeyError`` or ``IndexError`` into "cannot read", not their parent). Now an ``AggregationError``
    naming a source."""
    paths = _with_a_label(tmp_path, encoding)
    with pytest.raises(daskcfa.errors.AggregationError) as caught:
        daskcfa.aggregate([str(p) for p in paths], str(tmp_path / "agg.nc"))
    assert caught.value.file in {str(p) for p in paths} and "LookupError" in str(caught.value)


@pytest.mark.parametrize("url", ["s3://AKIDEXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY@bucket/f.nc",
                                 "https://reader:pw/0123456789@example.org/a.nc",
                                 "https://reader:a1/b:c/0123456789@example.org:8443/a.nc"])
def test_a_password_holding_a_slash_after_letters_is_redacted(url):
    """A password holding a ``/`` not percent-encoded (AWS secret keys hold ``/`` and ``+``): session 16
    redacted it only when digits came before the ``/`` (what URL parsers take for a port); after a
    letter, main (35c8285) showed the login whole in every error naming the URI."""
    from daskcfa.errors import FragmentReadError, redact, uri_secrets

    secret = url.split("@")[0].rpartition("/")[2]
    assert secret not in redact(url), redact(url)
    assert any(secret in found for found in uri_secrets(url))
    message = str(FragmentReadError("cannot read", file=url, variable="tas", fragment=(0,)))
    assert secret not in message and "K7MDENG" not in message, message


def _linked_sources(tmp_path) -> tuple:
    """``data/f0.nc`` and ``data/f1.nc`` (``v(n)``), and ``linked``: a symbolic link to ``data``."""
    home = tmp_path / "data"
    home.mkdir()
    paths = []
    for k in range(2):
        paths.append(home / f"f{k}.nc")
        with netCDF4.Dataset(paths[-1], "w") as nc:
            nc.createDimension("n", 2)
            nc.createVariable("v", "f4", ("n",))[:] = [k, -k]
            nc.createVariable("n", "i4", ("n",))[:] = [2 * k, 2 * k + 1]
    (tmp_path / "linked").symlink_to(home, target_is_directory=True)
    return home, paths


def test_an_aggregation_written_over_its_own_source_through_a_linked_directory_is_refused(tmp_path):
    """attack16a refused ``aggregate(sources, target)`` where the target is one of the sources, comparing
    their URIs: the same file named through a symbolically linked directory passed, and on main (35c8285)
    ``mode="w"`` replaced the source's data by an aggregation referring to itself. Now an
    ``ArgumentError`` naming the target; the source is untouched."""
    import hashlib

    home, paths = _linked_sources(tmp_path)
    before = hashlib.sha256(paths[0].read_bytes()).hexdigest()
    target = str(tmp_path / "linked" / "f0.nc")
    with pytest.raises(daskcfa.errors.ArgumentError) as caught:
        daskcfa.aggregate([str(p) for p in paths], target, mode="w")
    assert caught.value.file == target
    assert hashlib.sha256(paths[0].read_bytes()).hexdigest() == before


def test_a_write_into_a_generation_directory_through_a_link_is_refused(tmp_path):
    """attack16a refused a write whose target lies in a generation directory (``g-<16 hex>/``, another
    dataset's fragments), reading the directory's name from the URI: a link to that directory, named
    otherwise, passed, and on main (35c8285) ``mode="w"`` replaced the other dataset's fragment by an
    aggregation file. Now refused as through the directory's own name; the other dataset intact."""
    from .test_session16_write_attacks import read, values, write

    other = str(tmp_path / "other" / "t.nc")
    write(other, values(2))
    fragment = sorted((tmp_path / "other" / "t").rglob("*.nc"))[0]
    (tmp_path / "shortcut").symlink_to(fragment.parent, target_is_directory=True)
    files = {p: p.read_bytes() for p in (tmp_path / "other").rglob("*") if p.is_file()}
    with pytest.raises(daskcfa.ArgumentError, match="generation directory"):
        write(str(tmp_path / "shortcut" / fragment.name), values(1), mode="w")
    assert {p: p.read_bytes() for p in (tmp_path / "other").rglob("*") if p.is_file()} == files
    assert np.array_equal(read(other), values(2))


def test_references_written_over_their_aggregation_through_a_linked_directory_are_refused(tmp_path):
    """attack16a refused ``to_references(agg, output=agg)`` comparing URIs: the aggregation file named
    through a symbolically linked directory passed, and on main (35c8285) ``mode="w"`` replaced the
    aggregation file by the JSON references. Now an ``ArgumentError``; the aggregation file untouched."""
    home, paths = _linked_sources(tmp_path)
    aggregation = daskcfa.aggregate([str(p) for p in paths], str(home / "agg.nc"))
    before = (home / "agg.nc").read_bytes()
    with pytest.raises(daskcfa.errors.ArgumentError):
        daskcfa.to_references(aggregation, output=str(tmp_path / "linked" / "agg.nc"), format="json", mode="w")
    assert (home / "agg.nc").read_bytes() == before
