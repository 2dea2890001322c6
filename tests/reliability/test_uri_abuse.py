"""Hostile fragment URIs: the safe-URI policy refuses every escape.

Each hostile reference is planted in a real aggregation file whose victim
fragment it replaces, and a *readable* fragment with different values waits
at the place the escape would reach: a policy bypass would not fail, it
would return that data. So every case asserts the outcome (refused, or a
harmless name that does not exist) and that the planted values never come
back.

Covered: ``..`` escapes (plain, percent-encoded, double-encoded, mixed with
backslashes), absolute paths and ``file://`` URIs, other schemes, other
buckets and hosts (also hidden in userinfo or behind ``#``), symbolic links
out of the allowed tree (a link to a file, a linked directory, a chain of
links, a link planted after opening), NUL, CR and LF.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import daskcfa
from builders import assert_matches, build, write_fragment_file
from daskcfa.storage.policy import LocationPolicy
from remote_helpers import rewrite_uris, upload

from .conftest import DIMS, SIZES, VICTIM, truth

REFUSED, MISSING = "refused", "missing"
PLANTED = 12345.0  # the values of every fragment an escape could reach


def _plant(path: Path, shape=(3, 4, 3)) -> Path:
    """A valid fragment holding PLANTED everywhere (what a bypass would read)."""
    return write_fragment_file(path, "tas", DIMS, np.full(shape, PLANTED, "f4"), {"units": "K"})


def _victim_reference(built) -> str:
    return built.fragment_uris[VICTIM][0]


def _outcome(x) -> str:
    try:
        got = x.compute(scheduler="sync")
    except daskcfa.UnsafeURIError as exc:
        assert exc.fragment == VICTIM, exc
        return REFUSED
    except daskcfa.MissingFragmentError as exc:
        assert exc.fragment == VICTIM, exc
        return MISSING
    assert not np.any(np.ma.getdata(got) == PLANTED), "a hostile URI was followed"
    return "read"


# ---------------------------------------------------------------------------
# A local aggregation confined to its tree with allowed_locations
# ---------------------------------------------------------------------------
@pytest.fixture
def tree(tmp_path):
    """tmp/archive/ds (the aggregation, confined to tmp/archive) and tmp/secret.nc (outside)."""
    built = build("CF-1.13", tmp_path / "archive" / "ds", truth(), DIMS, SIZES)
    _plant(tmp_path / "secret.nc")
    _plant(tmp_path / "archive" / "ds" / "fragments" / "%2e%2e" / "secret.nc")  # a literal, harmless name
    return built, tmp_path


LOCAL_CASES = {
    # reference (relative to ds/, where the aggregation file is) -> expected outcome
    "dot-dot": ("../../secret.nc", REFUSED),
    "dot-dot-inside-then-out": ("fragments/../../../secret.nc", REFUSED),
    "absolute-path": ("{root}/secret.nc", REFUSED),
    "file-uri": ("file://{root}/secret.nc", REFUSED),
    "file-uri-encoded-dots": ("file://{root}/archive/ds/%2e%2e/%2e%2e/secret.nc", REFUSED),
    "file-uri-localhost": ("file://localhost{root}/secret.nc", REFUSED),
    "file-uri-one-slash": ("file:{root}/secret.nc", REFUSED),  # RFC 8089's form, what Java writes
    "file-uri-upper-case": ("FILE://{root}/secret.nc", REFUSED),  # schemes are case-insensitive
    "percent-encoded-dots": ("%2e%2e/%2e%2e/secret.nc", REFUSED),
    "percent-encoded-slashes": ("..%2f..%2fsecret.nc", REFUSED),
    "double-encoded-dots": ("fragments/%252e%252e/secret.nc", "read-literal"),
    "backslashes": ("..\\..\\secret.nc", MISSING),  # one odd file name on POSIX, inside the tree
    "nul-byte": ("../../secret.nc\x00.ok", REFUSED),
    # decoded and folded before anything is opened: "x<NUL>/.." and "x.nc<LF>.." vanish, inside the tree
    "encoded-nul-folded-away": ("fragments/x%00/../../../secret.nc", MISSING),
    "newline-folded-away": ("fragments/x.nc\n../../secret.nc", MISSING),
    "encoded-nul": ("fragments/x%00.nc", REFUSED),
    "newline": ("fragments/x\n.nc", REFUSED),
    "other-host-file-uri": ("file://otherhost/{root}/secret.nc", "format"),
}


@pytest.mark.parametrize("case", sorted(LOCAL_CASES))
def test_local_tree_refuses_escapes(tree, case):
    built, root = tree
    reference, expected = LOCAL_CASES[case]
    reference = reference.format(root=root)
    rewrite_uris(built.path, built.names["uris"], lambda u: reference if u == _victim_reference(built) else u)
    x = daskcfa.from_cfa(str(built.path), "tas", allowed_locations=[str(root / "archive")])
    if expected == "format":  # a URI no reader can use is a malformed aggregation
        with pytest.raises(daskcfa.CFAFormatError, match="unusable fragment URI"):
            x.compute(scheduler="sync")
    elif expected == "read-literal":  # %25 decodes once, to a directory literally named %2e%2e inside the tree
        with pytest.raises(AssertionError, match="hostile URI was followed"):
            _outcome(x)  # it read the harmless file planted at that literal name: inside the allowed tree
    else:
        assert _outcome(x) == expected


@pytest.mark.parametrize("how", ["file-link", "directory-link", "link-chain", "link-planted-after-opening"])
def test_symlinks_out_of_the_allowed_tree(tree, how):
    built, root = tree
    victim = built.fragment_files[VICTIM]
    kept = root / "archive" / "kept.nc"
    kept.write_bytes(victim.read_bytes())
    x = None
    if how == "link-planted-after-opening":
        x = daskcfa.from_cfa(str(built.path), "tas", allowed_locations=[str(root / "archive")])
        assert_matches(x.compute(scheduler="sync"), built.expected)
    victim.unlink()
    if how in ("file-link", "link-planted-after-opening"):
        victim.symlink_to(root / "secret.nc")
    elif how == "directory-link":
        (root / "outside").mkdir()
        os.replace(root / "secret.nc", root / "outside" / victim.name)
        fragments = victim.parent
        os.rename(fragments, root / "archive" / "moved")
        fragments.symlink_to(root / "outside", target_is_directory=True)
        (root / "outside" / "dummy").touch()
        for other in (root / "archive" / "moved").iterdir():  # keep the other fragments reachable
            (root / "outside" / other.name).symlink_to(other)
    else:  # inside -> inside -> outside
        (root / "archive" / "hop2").symlink_to(root / "secret.nc")
        (root / "archive" / "hop1").symlink_to(root / "archive" / "hop2")
        victim.symlink_to(root / "archive" / "hop1")
    if x is None:
        x = daskcfa.from_cfa(str(built.path), "tas", allowed_locations=[str(root / "archive")])
    with pytest.raises(daskcfa.UnsafeURIError, match="resolves to") as info:
        x.compute(scheduler="sync")
    assert info.value.fragment == VICTIM
    # a link that stays inside the tree is fine
    if how == "file-link":
        victim.unlink()
        victim.symlink_to(kept)
        assert_matches(daskcfa.from_cfa(str(built.path), "tas", allowed_locations=[str(root / "archive")])
                       .compute(scheduler="sync"), built.expected)


@pytest.mark.parametrize("how", ["chunk-link", "relative-chunk-link", "array-directory-link", "metadata-link",
                                 "device-link"])
def test_links_inside_a_zarr_store_out_of_the_allowed_tree(tmp_path, how):
    """A Zarr store is a tree of files: a link inside it (a chunk, the array's directory, its
    ``.zarray``) to a file outside ``allowed_locations`` is refused as a fragment file's link is,
    naming the fragment (before: the planted values were read, the policy checked the store's
    own path only); a link staying inside the tree reads."""
    zarr = pytest.importorskip("zarr")
    from remote_helpers import write_cf113

    values = np.arange(4, dtype="<f4") + 0.5
    archive, outside = tmp_path / "archive", tmp_path / "outside"
    outside.mkdir()
    array = zarr.create_array(str(archive / "f.zarr"), name="x", shape=(4,), dtype="<f4", zarr_format=2,
                              compressors=None, attributes={"_ARRAY_DIMENSIONS": ["n"]})
    array[...] = values
    path = write_cf113(archive / "agg.nc", "x", ("n",), [[4]], [["f.zarr"]])
    x_dir = archive / "f.zarr" / "x"
    planted = np.full(4, PLANTED, "<f4").tobytes()
    (outside / "chunk").write_bytes(planted)
    if how in ("chunk-link", "relative-chunk-link"):
        (archive / "kept").write_bytes((x_dir / "0").read_bytes())
        (x_dir / "0").unlink()
        (x_dir / "0").symlink_to("../../../outside/chunk" if how.startswith("relative") else outside / "chunk")
    elif how == "array-directory-link":
        os.rename(x_dir, outside / "x")
        (outside / "x" / "0").write_bytes(planted)
        x_dir.symlink_to(outside / "x", target_is_directory=True)
    elif how == "metadata-link":
        (outside / ".zarray").write_bytes((x_dir / ".zarray").read_bytes())
        (x_dir / ".zarray").unlink()
        (x_dir / ".zarray").symlink_to(outside / ".zarray")
    else:
        (x_dir / "0").unlink()
        (x_dir / "0").symlink_to("/dev/zero")
    with pytest.raises(daskcfa.UnsafeURIError, match="resolves to") as info:
        daskcfa.from_cfa(str(path), "x", allowed_locations=[str(archive)]).compute(scheduler="sync")
    assert info.value.fragment == (0,) and info.value.variable == "/x", info.value
    if how == "chunk-link":  # a link staying inside the tree is fine
        (x_dir / "0").unlink()
        (x_dir / "0").symlink_to(archive / "kept")
        got = daskcfa.from_cfa(str(path), "x", allowed_locations=[str(archive)]).compute(scheduler="sync")
        np.testing.assert_array_equal(got, values)


@pytest.mark.parametrize("identifier", ["..%2f..%2fvictim.zarr/x", "%2e%2e/%2e%2e/victim.zarr/x"])
def test_a_zarr_variable_name_climbing_out_of_its_store_over_http(tmp_path, make_http_server, identifier):
    """A fragment identifier is a path inside the Zarr store: with ``..`` percent-encoded (which
    zarr-python passes on, and an HTTP server decodes) it named a store outside the allowed
    prefix, whose planted values were read. Every key's URL now passes the policy: refused,
    and the server sees no request outside the prefix."""
    zarr = pytest.importorskip("zarr")
    from remote_helpers import write_cf113

    for name, value in (("archive/f.zarr", 0.5), ("victim.zarr", PLANTED)):
        array = zarr.create_array(str(tmp_path / name), name="x", shape=(4,), dtype="<f4", zarr_format=2,
                                  compressors=None, attributes={"_ARRAY_DIMENSIONS": ["n"]})
        array[...] = np.full(4, value, "<f4")
    write_cf113(tmp_path / "archive" / "agg.nc", "x", ("n",), [[4]], [["f.zarr"]], identifier=identifier)
    server = make_http_server(tmp_path)
    with pytest.raises(daskcfa.UnsafeURIError) as info:
        daskcfa.from_cfa(f"{server.url}/archive/agg.nc", "x",
                         allowed_locations=[f"{server.url}/archive/"]).compute(scheduler="sync")
    assert info.value.fragment == (0,), info.value
    assert all(r.path.startswith("/archive/") for r in server.log), server.log


# ---------------------------------------------------------------------------
# Remote aggregation files: confined to their bucket or host by default
# ---------------------------------------------------------------------------
def _policy_cases(bucket: str, other: str, http: str) -> dict[str, tuple[str, str]]:
    return {
        "other-bucket": (f"s3://{other}/planted.nc", REFUSED),
        "other-bucket-via-dot-dot": (f"s3://{bucket}/../{other}/planted.nc", MISSING),  # stays in the bucket
        "encoded-slash-in-bucket": (f"s3://{bucket}%2f..%2f{other}/planted.nc", REFUSED),
        "bucket-prefix-lookalike": (f"s3://{bucket}x/planted.nc", REFUSED),
        "relative-dot-dot": ("../../../../../../planted.nc", MISSING),  # resolves inside the bucket
        "absolute-path": ("/etc/passwd", REFUSED),
        "file-uri": ("file:///etc/passwd", REFUSED),
        "http": (f"{http}/planted.nc", REFUSED),
        "https": (http.replace("http://", "https://") + "/planted.nc", REFUSED),
        "userinfo-host-trick": (f"http://{bucket}@{http.split('://')[1]}/planted.nc", REFUSED),
        "fragment-host-trick": (f"{http}#@{bucket}/planted.nc", REFUSED),
        "memory-scheme": ("memory://planted.nc", REFUSED),
        "dap-scheme": (f"dap2://{http.split('://')[1]}/planted.nc", REFUSED),
        "encoded-nul": (f"s3://{bucket}/ds/x%00.nc", REFUSED),
        "crlf": (f"s3://{bucket}/ds/x.nc\r\nX-Amz-Header: 1", REFUSED),
    }


def test_s3_aggregation_refuses_every_trick(tmp_path, s3_server, s3_bucket, s3fs_fs, http_server):
    other = s3_server.new_bucket("planted")
    _plant(tmp_path / "planted.nc")
    s3fs_fs.put(str(tmp_path / "planted.nc"), f"{other}/planted.nc")
    s3fs_fs.put(str(tmp_path / "planted.nc"), f"{s3_bucket}x/planted.nc") if s3fs_fs.exists(f"{s3_bucket}x") else None
    os.link(tmp_path / "planted.nc", http_server.root / "planted.nc")
    cases = _policy_cases(s3_bucket, other, http_server.url)
    outcomes = {}
    for case, (reference, expected) in cases.items():
        directory = tmp_path / case
        built = build("CF-1.13", directory, truth(), DIMS, SIZES)
        rewrite_uris(built.path, built.names["uris"], lambda u: reference if u == _victim_reference(built) else u)
        url = upload(s3fs_fs, directory, s3_bucket, case) + "/" + built.path.name
        x = daskcfa.from_cfa(url, "tas", storage_options=s3_server.storage_options)
        http_server.reset()
        outcomes[case] = _outcome(x)
        assert http_server.requests == 0, case
    assert outcomes == {case: expected for case, (_, expected) in cases.items()}


def test_confined_s3_prefix_refuses_encoded_escapes(s3_server):
    """allowed_locations=["s3://b/archive/"]: every spelling of "go up" is refused."""
    policy = LocationPolicy.for_aggregation("s3://b/archive/ds/agg.nc", ["s3://b/archive/"])
    assert policy.allows("s3://b/archive/ds/f.nc")
    for uri in ["s3://b/archive/../private/f.nc", "s3://b/archive/%2e%2e/private/f.nc",
                "s3://b/archive/%2E%2E/private/f.nc", "s3://b/archive/%252e%252e/private/f.nc",
                "s3://b/archive/..%2fprivate/f.nc", "s3://b/archive/%2e%2e%2fprivate/f.nc",
                "s3://b/archivex/f.nc", "s3://b/archive", "s3://b/archive/f.nc%00", "s3://b/archive/\x00.nc"]:
        assert not policy.allows(uri), uri
        with pytest.raises(daskcfa.UnsafeURIError):
            policy.check(uri)


def test_http_aggregation_refuses_backslash_and_encoded_escapes():
    policy = LocationPolicy.for_aggregation("http://h:1/pub/ds/agg.nc", ["http://h:1/pub/"])
    assert policy.allows("http://h:1/pub/ds/f.nc")
    for uri in ["http://h:1/pub/..\\private/f.nc", "http://h:1/pub/%2e%2e%5cprivate/f.nc",
                "http://h:1/pub/%5c..%5cprivate/f.nc", "http://h:1/pub/ds/%252e%252e/%252e%252e/private/f.nc",
                "http://h:1@evil/pub/f.nc", "http://evil#@h:1/pub/f.nc", "http://h:1/pub/f.nc\r\nX: y"]:
        assert not policy.allows(uri), uri
