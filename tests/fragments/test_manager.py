"""The fragment file manager: LRU eviction, reference counts, budgets, back-pressure."""

import os
import threading
import time

import dask
import numpy as np
import pytest

import daskcfa
from daskcfa.fragments.manager import Budget, FileManager


class Resource:
    """A stand-in handle that records whether it is open (the manager is generic)."""

    open_now: set = set()

    def __init__(self, key):
        self.key = key
        Resource.open_now.add(key)

    def close(self):
        Resource.open_now.discard(self.key)


@pytest.fixture(autouse=True)
def clean():
    Resource.open_now = set()


def use(m, key, nbytes=0):
    with m.open(key, lambda: Resource(key), nbytes=nbytes) as (res, memo):
        return res


def test_cached_handles_are_reused():
    m = FileManager(Budget(4, 1000))
    first = use(m, "a")
    assert use(m, "a") is first
    stats = m.stats()
    assert (stats["hits"], stats["misses"]) == (1, 1)


def test_least_recently_used_idle_handle_is_evicted():
    m = FileManager(Budget(2, 1000))
    for key in "abac":
        use(m, key)
    assert Resource.open_now == {"a", "c"}
    assert m.stats()["evictions"] == 1 and m.stats()["peak_files"] == 2


def test_handles_in_use_are_never_closed_and_callers_wait():
    m = FileManager(Budget(1, 1000))
    order = []
    with m.open("a", lambda: Resource("a")):
        def other():
            with m.open("b", lambda: Resource("b")):
                order.append(("b opened", set(Resource.open_now)))

        t = threading.Thread(target=other)
        t.start()
        time.sleep(0.2)
        assert order == [] and Resource.open_now == {"a"}  # b waits: the budget is one file
        order.append("a released")
    t.join(5)
    assert order == ["a released", ("b opened", {"b"})]
    assert m.stats()["waits"] >= 1


def test_a_caller_waiting_for_room_takes_a_budget_raised_meanwhile():
    """The budget is looked up once a pass (not at every fit test), and again after each wait: a
    waiter sees a budget ``configure`` raised while it waited, and opens beside the handle in use."""
    m = FileManager(Budget(1, 1000))
    opened = threading.Event()
    with m.open("a", lambda: Resource("a")):
        def other():
            with m.open("b", lambda: Resource("b")):
                opened.set()

        t = threading.Thread(target=other, daemon=True)
        t.start()
        time.sleep(0.2)
        assert not opened.is_set()  # b waits: the budget is one file
        m.configure(Budget(2, 1000))
        assert opened.wait(5), "the waiter kept the budget it saw before waiting"
        assert Resource.open_now >= {"a"}
    t.join(5)


def test_memory_budget_counts_bytes_and_refuses_oversized_fragments():
    m = FileManager(Budget(10, 100))
    use(m, "a", nbytes=60)
    use(m, "b", nbytes=60)  # evicts a
    assert Resource.open_now == {"b"} and m.stats()["peak_bytes"] <= 100
    with pytest.raises(daskcfa.BudgetError, match="memory budget"):
        m.open("huge", lambda: Resource("huge"), nbytes=101, label="s3://b/huge.nc").__enter__()
    assert "huge" not in Resource.open_now


def test_failed_open_is_not_cached():
    m = FileManager(Budget(2, 100))

    def boom():
        raise OSError("corrupt")

    with pytest.raises(OSError):
        with m.open("x", boom):
            pass
    assert m.stats()["files"] == 0
    assert use(m, "x").key == "x"


def test_concurrent_openers_of_one_key_share_one_handle():
    m = FileManager(Budget(4, 100))
    opened = []

    def slow():
        opened.append(1)
        time.sleep(0.1)
        return Resource("k")

    results = []

    def work():
        with m.open("k", slow) as (res, _):
            results.append(res)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(opened) == 1 and len({id(r) for r in results}) == 1


def test_shrinking_the_budget_closes_idle_handles():
    m = FileManager(Budget(4, 1000))
    for key in "abcd":
        use(m, key)
    m.configure(Budget(1, 1000))
    assert len(Resource.open_now) == 1
    m.close_all()
    assert Resource.open_now == set()


def test_budget_from_config_and_s3nc(tmp_path, monkeypatch):
    config = tmp_path / "s3nc.json"
    config.write_text('{"resource_allocation": {"memory": "50MB", "filehandles": 7}}')
    monkeypatch.setenv("S3_NC_CONFIG", str(config))
    assert Budget.from_config() == Budget(7, 50_000_000)
    with dask.config.set({"daskcfa.budget.filehandles": 3, "daskcfa.budget.memory": "1MiB"}):
        assert Budget.from_config() == Budget(3, 1 << 20)
    with dask.config.set({"daskcfa.budget.memory": "1EB"}):  # S3netCDF4's units up to YB (dask's stop at PB)
        assert Budget.from_config() == Budget(7, 10**18)
    with dask.config.set({"daskcfa.budget.memory": "2 YB"}):
        assert Budget.from_config() == Budget(7, 2 * 10**24)


def test_wait_timeout_raises_budget_error():
    m = FileManager(Budget(1, 100))
    with dask.config.set({"daskcfa.budget.wait-timeout": 0.2}):
        with m.open("a", lambda: Resource("a")):
            with pytest.raises(daskcfa.BudgetError, match="every handle is in use"):
                use(m, "b")


def test_process_reading_remote_fragments_exits_cleanly(s3_server, s3_bucket):
    """Remote fragments h5py reads through Python file objects are closed before the interpreter
    finalises: before, such a process crashed at exit (SIGSEGV) after its results were printed."""
    import json
    import subprocess
    import sys

    x = np.random.default_rng(0).normal(size=(20, 100, 100)).astype("f4")
    url = f"s3://{s3_bucket}/exit/tas.nc"
    daskcfa.to_cfa(x, url, variable="tas", dims=("t", "y", "x"), fragment_shape=(10, 100, 100),
                   compression={"zlib": True, "complevel": 1, "chunksizes": (10, 10, 10)},
                   storage_options=s3_server.storage_options)
    code = (f"import daskcfa, json, sys\n"
            f"x = daskcfa.from_cfa({url!r}, storage_options=json.loads(sys.argv[1]), chunk_index=False)\n"
            f"print(x[:, 12, 34].compute().tolist())\n")
    env = {**os.environ, "DASK_DASKCFA__IO__SMALL_OBJECT": "0", "DASK_DASKCFA__IO__ENGINE": "direct"}
    done = subprocess.run([sys.executable, "-c", code, json.dumps(s3_server.storage_options)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    np.testing.assert_array_equal(json.loads(done.stdout), x[:, 12, 34])


def test_the_budget_is_the_config_in_force_now(tmp_path):
    """A ``dask.config.set`` block changes the budget of what runs inside it only, whatever ran
    first in the process (the budget used to be read once, at the first use, and kept)."""
    fresh = FileManager()
    with dask.config.set({"daskcfa.budget.memory": "16KiB", "daskcfa.budget.filehandles": 3}):
        assert (fresh.budget.memory, fresh.budget.filehandles) == (16384, 3)
    with dask.config.set({"daskcfa.budget.memory": "1MiB"}):
        assert fresh.budget.memory == 1 << 20
        with pytest.raises(daskcfa.BudgetError):
            with fresh.reserve(2 << 20, "x"):
                pass
    with fresh.reserve(2 << 20, "x"):  # the default budget again
        pass
    fresh.configure(Budget(2, 4096))  # a worker plugin's budget: kept, whatever the config
    with dask.config.set({"daskcfa.budget.memory": "1GiB"}):
        assert fresh.budget == Budget(2, 4096)
    fresh.configure(None)  # (a plugin torn down, a test's fixture undone): the config's budgets again
    with dask.config.set({"daskcfa.budget.memory": "1MiB"}):
        assert fresh.budget.memory == 1 << 20


@pytest.mark.parametrize("setting", [
    {"daskcfa.budget.memory": "x"}, {"daskcfa.budget.memory": -1}, {"daskcfa.budget.memory": float("nan")},
    {"daskcfa.budget.memory": float("inf")}, {"daskcfa.budget.memory": 10**30}, {"daskcfa.budget.memory": [1]},
    {"daskcfa.budget.memory": True}, {"daskcfa.budget.filehandles": "x"}, {"daskcfa.budget.filehandles": 1.5},
    {"daskcfa.budget.filehandles": float("nan")}, {"daskcfa.budget.filehandles": 0},
], ids=repr)
def test_a_garbage_budget_set_mid_session_is_a_config_error_at_the_next_read(tmp_path, setting):
    """A budget set after the dataset was opened is checked at the next read (where it is looked up):
    a ConfigError naming the key, never a bare ValueError/TypeError/OverflowError, a truncated
    1.5 file handles, or a budget beyond the schema's 1000 YB."""
    truth = np.arange(24, dtype="f8").reshape(4, 6)
    daskcfa.to_cfa(truth, str(tmp_path / "a.nc"), variable="x", dims=("y", "x"), fragment_shape=(2, 3))
    x = daskcfa.from_cfa(str(tmp_path / "a.nc"), "x")
    key = next(iter(setting))
    with dask.config.set(setting), dask.config.set(scheduler="sync"):
        with pytest.raises(daskcfa.ConfigError, match=key.rsplit(".", 1)[1]):
            x.compute()
    np.testing.assert_array_equal(x.compute(), truth)  # and the good budget again once the block ends


@pytest.mark.parametrize("timeout", ["x", float("nan"), -1, 10**30])
def test_a_garbage_wait_timeout_set_mid_session_is_a_config_error_when_a_task_waits(timeout):
    """``daskcfa.budget.wait-timeout`` is read only when a task has to wait for the budget: a bad
    value set after the dataset was opened is a ConfigError naming the key there (before: a bare
    ValueError for "x", an OverflowError for NaN and 10**30, and -1 failed the task at once)."""
    fresh = FileManager(Budget(1, 1 << 20))
    with fresh.open("held", lambda: object(), files=1):
        with dask.config.set({"daskcfa.budget.wait-timeout": timeout}):
            with pytest.raises(daskcfa.errors.ConfigError, match="wait-timeout"):
                with fresh.open("waiting", lambda: object(), files=1):
                    pass
