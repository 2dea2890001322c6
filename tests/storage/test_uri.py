"""One URI convention: schemes, local paths, normalisation and resolving references."""

from __future__ import annotations

import os

import pytest

from daskcfa.storage.uri import absolute, check_uri_style, is_local, normalise, resolve, scheme_of, to_local_path


@pytest.mark.parametrize("uri, scheme", [("/a/b.nc", "file"), ("b.nc", "file"), ("file:///a/b.nc", "file"),
                                         ("S3://bucket/k.nc", "s3"), ("https://h/x.nc", "https"),
                                         ("dap2://h/x.nc", "dap2")])
def test_scheme_of(uri, scheme):
    assert scheme_of(uri) == scheme
    assert is_local(uri) == (scheme == "file")


def test_local_path_of_a_file_uri_is_unquoted():
    assert to_local_path("file:///a%20b/c.nc") == "/a b/c.nc"
    assert to_local_path("file://localhost/a.nc") == "/a.nc"
    assert to_local_path("/plain/path.nc") == "/plain/path.nc"


def test_file_uri_with_a_remote_host_is_refused():
    with pytest.raises(ValueError, match="remote host"):
        to_local_path("file://elsewhere/a.nc")


def test_normalise_folds_dots_and_lowercases_the_scheme():
    assert normalise("/a/./b/../c.nc") == "/a/c.nc"
    assert normalise("rel/x.nc") == os.path.join(os.getcwd(), "rel", "x.nc")
    assert normalise("S3://bucket/a/../b/x.nc") == "s3://bucket/b/x.nc"
    assert normalise("s3://bucket/../../x.nc") == "s3://bucket/x.nc"  # never above the root
    assert normalise("https://h/dir/") == "https://h/dir/"
    assert normalise("https://h") == "https://h/"


def test_absolute_gives_file_uris_for_local_paths():
    assert absolute("/a b/c.nc") == "file:///a%20b/c.nc"
    assert absolute("s3://bucket/k.nc") == "s3://bucket/k.nc"


@pytest.mark.parametrize("reference, base, expected", [
    ("f/0.nc", "/data/agg.nc", "/data/f/0.nc"),
    ("../f/0.nc", "/data/agg/agg.nc", "/data/f/0.nc"),
    ("f%20x/0.nc", "/data/agg.nc", "/data/f x/0.nc"),
    ("/abs/0.nc", "s3://bucket/agg.nc", "/abs/0.nc"),
    ("f/0.nc", "s3://bucket/dir/agg.nc", "s3://bucket/dir/f/0.nc"),
    ("../0.nc", "https://h/a/b/agg.nc", "https://h/a/0.nc"),
    ("s3://other/0.nc", "/data/agg.nc", "s3://other/0.nc"),
    ("  f/0.nc ", "/data/agg.nc", "/data/f/0.nc"),
])
def test_references_resolve_against_the_aggregation_file(reference, base, expected):
    assert resolve(reference, base) == expected


def test_uri_styles():
    assert check_uri_style("relative") == "relative"
    with pytest.raises(ValueError, match="uris must be one of"):
        check_uri_style("whatever")
