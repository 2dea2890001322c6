"""Property-based fuzzing of the aggregation parsers (hypothesis).

Start from a valid aggregation file of every dialect; apply random mutations
to its attributes, its instruction variables (maps, URIs, identifiers,
unique values, partition groups) and, for CFA-0.4 and NCA, its JSON, both
structurally (random JSON values in random places) and as text (characters
inserted, deleted, replaced). Then open it, confined to its own directory,
and read it all.

Property: the reader succeeds, or raises a :class:`daskcfa.CFAError` -- never
another exception, never a crash -- within a per-example deadline, and the
process's peak resident memory (sampled every 10 ms) stays bounded.

Examples per dialect come from the hypothesis profile: ``ci`` (default,
derandomized so CI is repeatable) or ``thorough`` (``HYPOTHESIS_PROFILE=thorough``:
3,000 per dialect, random). docs/reliability.md reports the counts.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import threading
import time
import warnings
from datetime import timedelta
from pathlib import Path

import netCDF4
import numpy as np
import psutil
import pytest
from hypothesis import HealthCheck, given, note, reject, settings
from hypothesis import strategies as st

import daskcfa
from builders import build

from .conftest import DIMS, SIZES, forget_open_files, replace_file, truth

settings.register_profile("ci", max_examples=150, deadline=timedelta(seconds=20), derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                                 HealthCheck.data_too_large])
settings.register_profile("thorough", parent=settings.get_profile("ci"), max_examples=3000, derandomize=False)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if PROFILE not in ("ci", "thorough"):
    PROFILE = "ci"
#: Peak RSS growth allowed over the whole run of one dialect.
RSS_BOUND = 512 << 20

CASES = {
    "CF-1.13": ("CF-1.13", {}),
    "CF-1.13-unique-values": ("CF-1.13", {"unique": True}),
    "cfdm-interim": ("cfdm-interim", {}),
    "CFAPyX-interim": ("cfapyx-interim", {}),
    "CFA-0.6": ("CFA-0.6", {}),
    "CFA-0.6-alternatives-substitutions": ("CFA-0.6", {"alternatives": True, "substitutions": True}),
    "CFA-0.5": ("CFA-0.5", {}),
    "CFA-0.4": ("CFA-0.4", {}),
    "NCA": ("NCA", {}),
}
#: Examples run and outcomes, per case (printed at the end of each test).
OUTCOMES: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

# -- what mutations are made of ----------------------------------------------
HOSTILE_URIS = ["", " ", "/", "..", "../../../../etc/passwd", "/etc/passwd", "file:///etc/passwd", "s3://other/x.nc",
                "http://127.0.0.1:1/x.nc", "%2e%2e/%2e%2e/x.nc", "%252e%252e/x.nc", "..\\..\\x.nc", "x.nc\x00.txt",
                "fragments/../../x.nc", "dap2://127.0.0.1:1/x", "memory://x", "s3://", "file://host/x.nc",
                "${BASE}/x.nc", "a" * 300]
INSTRUCTION_ATTRS = ["aggregated_dimensions", "aggregated_data", "cf_role", "cfa_dimensions", "cfa_array", "cfa_group",
                     "nca_dimensions", "nca_array", "substitutions", "units", "calendar", "_FillValue",
                     "scale_factor", "add_offset", "missing_value", "valid_range", "base"]
TOKENS = ["map:", "uris:", "identifiers:", "unique_values:", "location:", "file:", "format:", "address:",
          "variable:", "unique_value:", "shape:", "value:", "fragment_map", "fragment_uris", "fragment_identifiers",
          "time", "lat", "lon", "tas", "cfa_variable", "nca_variable", "cfa_tas", "${BASE}:", "/", ":", " ", "\n",
          "0", "-1", "99999999999999999999", "nan"]

small_ints = st.one_of(st.integers(-3, 8), st.sampled_from([0, -1, 2**31 - 1, -(2**31), 2**62, 10**12, 10**15]))
texts = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40),
    st.lists(st.sampled_from(TOKENS), max_size=12).map(" ".join),
    st.sampled_from(HOSTILE_URIS).filter(lambda s: "\x00" not in s),
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), small_ints, st.floats(allow_nan=False), st.text(max_size=12),
              st.sampled_from(HOSTILE_URIS[:12])),
    lambda children: st.one_of(st.lists(children, max_size=5),
                               st.dictionaries(st.sampled_from(["index", "location", "subarray", "file", "ncvar",
                                                                "shape", "format", "pmshape", "pmdimensions",
                                                                "Partitions", "base", "units", "dimensions",
                                                                "directions", "part", "x"]), children, max_size=5)),
    max_leaves=20,
)


def _variables(ds: netCDF4.Dataset) -> list[netCDF4.Variable]:
    found = []

    def walk(group):
        found.extend(group.variables.values())
        for child in group.groups.values():
            walk(child)

    walk(ds)
    return [v for v in found if v.name not in DIMS]


def _mutate_attribute(var: netCDF4.Variable, data: st.DataObject) -> str:
    names = sorted(set(var.ncattrs()) | set(INSTRUCTION_ATTRS))
    name = data.draw(st.sampled_from(names), label="attribute")
    if data.draw(st.integers(0, 9)) == 0:
        if name in var.ncattrs():
            var.delncattr(name)
        return f"delete {var.name}:{name}"
    value = data.draw(st.one_of(texts, small_ints, st.floats(allow_nan=True, width=32),
                                st.lists(small_ints, min_size=1, max_size=4).map(lambda v: np.array(v, "i8"))),
                      label="value")
    var.setncattr(name, value)
    return f"set {var.name}:{name}"


def _mutate_values(var: netCDF4.Variable, data: st.DataObject) -> str:
    if var.size == 0 or var.dtype is not str and np.dtype(var.dtype).kind not in "iuf":
        return _mutate_attribute(var, data)
    var.set_auto_maskandscale(False)
    values = np.array(var[...], dtype=object if var.dtype is str else var.dtype, copy=True)
    flat = values.reshape(-1)
    for _ in range(data.draw(st.integers(1, 3), label="cells")):
        i = data.draw(st.integers(0, flat.size - 1), label="cell")
        if var.dtype is str:
            flat[i] = data.draw(texts, label="string")
        else:
            info = np.iinfo(var.dtype) if np.dtype(var.dtype).kind in "iu" else None
            value = data.draw(small_ints, label="number")
            flat[i] = value if info is None or info.min <= value <= info.max else info.max
    if values.ndim == 0:
        var.assignValue(values[()])
    else:
        var[...] = values
    return f"values of {var.name}"


def _mutate_json(var: netCDF4.Variable, attr: str, data: st.DataObject) -> str:
    text = var.getncattr(attr)
    if data.draw(st.booleans(), label="structural"):
        doc = json.loads(text)
        path, node = [], doc
        while isinstance(node, (dict, list)) and node and data.draw(st.integers(0, 3)) > 0:
            key = data.draw(st.sampled_from(sorted(node) if isinstance(node, dict) else list(range(len(node)))))
            path.append(key)
            parent, node = node, node[key]
        if not path:
            doc = data.draw(json_values, label="document")
        elif data.draw(st.integers(0, 4)) == 0:
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(json_values, label="json value")
        text = json.dumps(doc)
    else:
        for _ in range(data.draw(st.integers(1, 4), label="edits")):
            i = data.draw(st.integers(0, len(text)), label="at")
            insert = data.draw(st.sampled_from(["", "[", "]", "{", "}", ",", ":", '"', "0", "-", "9" * 25, "null",
                                                "1e400", "\\u0000", " "]), label="insert")
            cut = data.draw(st.integers(0, 3), label="cut")
            text = text[:i] + insert + text[i + cut:]
    var.setncattr(attr, text)
    return f"json {attr}"


def _mutate(path: Path, data: st.DataObject) -> list[str]:
    done = []
    with netCDF4.Dataset(path, "a") as ds:
        variables = _variables(ds)
        for _ in range(data.draw(st.integers(1, 3), label="mutations")):
            var = data.draw(st.sampled_from(variables), label="variable")
            json_attrs = [a for a in ("cfa_array", "nca_array") if a in var.ncattrs()]
            kind = data.draw(st.sampled_from(["attribute", "values"] + ["json"] * 2 * bool(json_attrs)), label="kind")
            if kind == "json":
                done.append(_mutate_json(var, json_attrs[0], data))
            elif kind == "values":
                done.append(_mutate_values(var, data))
            else:
                done.append(_mutate_attribute(var, data))
    return done


class PeakRSS:
    """The process's peak resident memory while inside the block, sampled every 10 ms."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.baseline = self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> "PeakRSS":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.baseline


def _unique_truth() -> np.ma.MaskedArray:
    """One value per fragment (what a unique-values aggregation describes)."""
    values = np.ma.MaskedArray(np.zeros(tuple(sum(row) for row in SIZES), "f4"))
    offsets = [np.cumsum((0,) + row) for row in SIZES]
    for n, index in enumerate(np.ndindex(*(len(row) for row in SIZES))):
        values[tuple(slice(o[i], o[i + 1]) for o, i in zip(offsets, index))] = 250.0 + n
    return values


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """case -> (directory, aggregation file name, its bytes): one valid dataset per case."""
    out = {}
    for case, (dialect, kw) in CASES.items():
        directory = tmp_path_factory.mktemp(case.lower())
        built = build(dialect, directory / "ds", _unique_truth() if kw.get("unique") else truth(), DIMS, SIZES, **kw)
        out[case] = (directory / "ds", built.path.name, built.path.read_bytes())
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_mutated_aggregations_fail_only_with_daskcfa_errors(pristine, case):
    directory, name, original = pristine[case]
    work = directory / f"fuzzed-{name}"
    outcomes = OUTCOMES[case]

    @settings(settings.get_profile(PROFILE))
    @given(data=st.data())
    def check(data):
        forget_open_files()  # CFA-0.6 in-file fragments keep the aggregation file itself open
        replace_file(work, original)
        try:
            mutations = _mutate(work, data)
        except (RuntimeError, OSError, UnicodeError, ValueError, TypeError, OverflowError, IndexError,
                AttributeError):
            reject()  # netCDF could not store this mutation: nothing to read
        note(f"mutations: {mutations}")
        started = time.monotonic()
        try:
            with warnings.catch_warnings():  # CFAWarnings, and netCDF4's about nonsense packing attributes
                warnings.simplefilter("ignore")
                x = daskcfa.from_cfa(str(work), chunks="fragments", allowed_locations=[str(directory)])
                x.compute(scheduler="synchronous")
                daskcfa.open_cfa(str(work), allowed_locations=[str(directory)]).close()
            outcomes["read"] += 1
        except daskcfa.CFAError as exc:
            outcomes[type(exc).__name__] += 1
        outcomes["seconds"] = max(outcomes["seconds"], time.monotonic() - started)

    with PeakRSS() as rss:
        check()
    outcomes["examples"] = sum(v for k, v in outcomes.items() if k not in ("seconds", "examples", "rss"))
    outcomes["rss"] = rss.growth
    print(f"\nfuzz {case}: {dict(outcomes)}")
    assert outcomes["examples"] >= settings.get_profile(PROFILE).max_examples // 2  # most examples really ran
    assert rss.growth < RSS_BOUND, f"peak RSS grew by {rss.growth / 2**20:.0f} MiB"


def test_absurd_claims_are_refused_before_anything_is_allocated(tmp_path):
    """10**12 fragments, a 10**15-element dimension, an instruction variable of 10**12 values
    declared but never written: refused up front (daskcfa/limits.py), quickly, small."""
    base = build("CF-1.13", tmp_path / "ds", truth(), DIMS, SIZES)

    def variant(name, edit):
        path = tmp_path / f"{name}.nc"
        shutil.copy(base.path, path)
        with netCDF4.Dataset(path, "a") as ds:
            edit(ds)
        return path

    def huge_dimension(ds):  # a new dimension of 10**15 elements, one fragment along it
        ds.createDimension("level", 10**15)
        ds["tas"].aggregated_dimensions = "time lat lon level"

    def undeclared_map(ds):  # a map variable declared over 10**12 columns, never written
        ds.createDimension("huge", 10**12)
        ds.createVariable("big_map", "i4", ("i", "huge"))
        ds["tas"].aggregated_data = "map: big_map uris: fragment_uris identifiers: fragment_identifiers"

    def trillion_fragments(ds):  # map rows of 10**4 fragments each along 3 dims: 10**12 fragments
        for d in ("time", "lat", "lon"):
            ds.createDimension(f"big_{d}", 10**4)
        ds.createDimension("j4", 10**4)
        m = ds.createVariable("trillion_map", "i4", ("i", "j4"))
        m[...] = np.ones((3, 10**4), "i4")
        ds["tas"].aggregated_dimensions = "big_time big_lat big_lon"
        ds["tas"].aggregated_data = "map: trillion_map uris: fragment_uris identifiers: fragment_identifiers"

    cases = {"huge-dimension": (huge_dimension, "elements"), "undeclared-map": (undeclared_map, "values"),
             "trillion-fragments": (trillion_fragments, "fragments")}
    with PeakRSS() as rss:
        for name, (edit, word) in cases.items():
            path = variant(name, edit)
            started = time.monotonic()
            with pytest.raises(daskcfa.CFAFormatError, match=word) as info:
                daskcfa.from_cfa(str(path), "tas")
            assert info.value.file == str(path) and info.value.variable == "/tas"
            assert time.monotonic() - started < 30
    assert rss.growth < 256 << 20
