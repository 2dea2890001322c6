"""A distributed worker's first read sets the process up for reading (daskcfa/fragments/worker.py)."""

from __future__ import annotations

import resource

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

import daskcfa
from builders import Frag, build_cf113, make_truth


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@pytest.mark.parametrize("keep", [None, 0])
def test_a_worker_reuses_freed_memory_for_what_it_decodes(tmp_path, monkeypatch, keep):
    """distributed's nanny starts workers with MALLOC_TRIM_THRESHOLD_ set, which makes every allocation of
    128 KiB or more fresh memory the kernel faults in page by page: each decoded chunk and each fragment's
    values (before: a sum after a mean of 10 MB of zlib fragments on the warm worker faulted in about twice
    its bytes). Now the worker reuses what it freed: a small share of the pages. With
    ``daskcfa.io.worker-malloc-keep: 0`` malloc stays as the worker started."""
    if keep is not None:  # (a LocalCluster's workers start with the client's dask config)
        monkeypatch.setitem(dask.config.config["daskcfa"]["io"], "worker-malloc-keep", keep)
    truth = make_truth((40, 256, 256), "f4", seed=31)
    built = build_cf113(tmp_path / "agg", truth, ("time", "lat", "lon"), ((10,) * 4, (256,), (256,)),
                        frags=lambda i: Frag(storage={"zlib": True, "complevel": 1, "chunksizes": (1, 256, 256)}))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                      worker_dashboard_address=None) as cluster, Client(cluster) as client:
        (trim,) = client.run(lambda: __import__("os").environ.get("MALLOC_TRIM_THRESHOLD_")).values()
        assert trim is not None  # (what the nanny does by default, the case at hand)
        x = daskcfa.from_cfa(str(built.path), built.variable)
        first = x.mean(dtype="f8").compute()
        (before,) = client.run(_minor_faults).values()
        second = x.sum(dtype="f8").compute()  # (other keys: a result still held is not taken again)
        (after,) = client.run(_minor_faults).values()
    assert np.isclose(first, truth.astype("f8").mean(), rtol=1e-12)
    assert np.isclose(second, truth.astype("f8").sum(), rtol=1e-12)
    pages = truth.nbytes // resource.getpagesize()
    if keep is None:
        assert after - before < pages // 4, (after - before, pages)
    else:
        assert after - before > pages, (after - before, pages)
