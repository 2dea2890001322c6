"""The commit: what it puts in place and what it tidies (write/commit.py)."""

import numpy as np

import daskcfa


def test_temporaries_of_killed_writers_in_the_bookkeeping_directory_are_removed(tmp_path):
    """A writer killed while putting the manifest or the retired record in place leaves
    ``.manifest.json.<hex>.part`` / ``.retired.json.<hex>.part`` in ``<stem>/.daskcfa``: the
    next commit (holding the lease) removes them, as it removes the fragments' temporaries."""
    url = str(tmp_path / "t.nca")
    data = np.arange(24, dtype="f4").reshape(4, 2, 3)
    daskcfa.to_cfa(data, url, variable="x", dims=("t", "y", "z"), fragment_shape=(1, 2, 3))
    bookkeeping = tmp_path / "t" / ".daskcfa"
    planted = [bookkeeping / f".{name}.{'ab' * 16}.part" for name in ("manifest.json", "retired.json")]
    for path in planted:
        path.write_bytes(b"{half a rec")
    other = bookkeeping / f".notes.txt.{'cd' * 16}.part"  # not one of the commit's own objects: kept
    other.write_bytes(b"x")
    daskcfa.to_cfa(data + 1, url, variable="x", dims=("t", "y", "z"), fragment_shape=(1, 2, 3), mode="w")
    assert [p for p in planted if p.exists()] == []
    assert other.exists()
    np.testing.assert_array_equal(daskcfa.from_cfa(url, "x").compute(), data + 1)
