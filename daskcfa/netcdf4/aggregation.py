"""Aggregations written netCDF4-python style: what ``Dataset(url, "w" | "a", format="CF-1.13" | ...)``
returns.

How a write works (:class:`AggregationWriter`): each aggregated variable has
a fragment grid planned when it is created (along an unlimited dimension the
grid grows as the dimension does). An assignment lands in per-fragment
buffers, encoded as stored (packed, masked elements as the fill value); a
fragment whose every element has been assigned is written (and
uploaded) at once, by a pool of threads, into the write's own *generation*
(:mod:`daskcfa.storage.lease`), so nothing a reader can see changes. Buffers
are bounded (``buffer_size``): past it, the fullest incomplete fragment is
written as it is and read back when it is assigned again. ``close()`` writes
what is left (elements never assigned are missing values, or, with
``mode="a"``, what the previous aggregation stores there, bit for bit, as
``to_cfa(mode="r+")`` merges an update) and then commits the
aggregation file atomically under the write lease, with the commit of
:func:`daskcfa.to_cfa`. A process killed before ``close()`` leaves the
previous aggregation (or none) in place.
"""

from __future__ import annotations

import posixpath
import uuid
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import Any, Mapping

import numpy as np

from .. import config, dataset, storage
from ..index_writer import index as write_chunk_index
from ..choices import DEFAULT_URIS
from ..errors import ArgumentError, CFAError, FragmentError, redact
from ..fragments.write import FragmentRecord, FragmentTarget, encode_values, shared_chunks, write_fragment
from ..formats.capabilities import dialects_that
from ..storage.history import Change
from ..write.commit import commit_aggregation, plan_commit, run_write
from ..write.request import WriteSource
from ..write.spec import DEFAULT_FRAGMENT_NAME, check_fragment_dtype, fragment_columns, fragment_name, fragment_spec, settle_unlimited
from ..write.target import WriteTarget, nothing_to_update
from ..inputs import stored_values
from ..lazy import dask_array as da
from ..model import AggregatedVariable, AggregationDataset, Dimension, FragmentGrid, Fragments, PlainVariable
from ..storage.lease import Lease, generation_name, in_generation
from .existing import Existing, read_existing
from .groups import Definitions
from .indexing import as_numpy, orthogonal_index, storable, take
from .layout import Buffer, FragmentLayout
from .variables import PreviousVariable, VariableState, WritableVariable

__all__ = ["AggregationWriter"]

#: dialects that can record a fragment as missing (never written: it reads as missing values)
_SPARSE_DIALECTS = dialects_that("missing_fragments")


def _end_writing(lease: Lease, pool: ThreadPoolExecutor) -> None:
    """Stop a writer's threads and give its lease back (at close, or when it is dropped unclosed); a
    write that did not commit leaves its generation to the next commit to delete (it never resumes)."""
    pool.shutdown(wait=True, cancel_futures=True)
    lease.abandon()


class AggregationWriter(Definitions, dataset.Group):
    """An aggregation being written (or updated): what ``Dataset(url, "w", format="CF-1.13")`` returns.

    Options beyond netCDF4-python's: ``buffer_size`` (bytes of incomplete
    fragments held before the fullest is written as it is; default
    ``daskcfa.write.buffer-memory``), ``fragment_name`` and ``uris`` (as in
    :func:`daskcfa.to_cfa`), ``max_concurrent_uploads`` (fragment writes in
    flight, default 4 remote, 2 local), ``keep_previous`` (seconds the
    replaced fragments of an update are kept), ``chunk_index`` (``True``: the
    chunk index written beside the aggregation after the commit, as
    :func:`daskcfa.index` writes it).
    """

    @classmethod
    def create(cls, url: str, mode: str, clobber: bool, kinds: tuple[str, str, str],
               storage_options: Mapping[str, Any] | None, *, buffer_size: int | str | None = None,
               fragment_name: str = DEFAULT_FRAGMENT_NAME, uris: str = DEFAULT_URIS,
               max_concurrent_uploads: int | None = None, keep_previous: float = 0.0,
               chunk_index: bool = False, existing: Existing | None = None) -> "AggregationWriter":
        """``existing``: an update's dataset as the constructor read it (read again if it has changed
        since, once this writer holds the lease)."""
        target = WriteTarget.for_netcdf4(url, storage_options, mode, clobber)
        url, profile = target.url, target.profile
        self = object.__new__(cls)
        d = self.__dict__
        dataset.Group.__init__(self, name="/", path="/")
        d.update(url=url, _writer=self, _mode=mode, _profile=profile, _closed=False, _failed=None,
                 _dialect=kinds[0], _file_format=kinds[1], _fragment_format=kinds[2], _template=fragment_name,
                 _uris=uris, _keep_previous=float(keep_previous), _records={}, _inflight={}, _sizes={}, _expected=None,
                 _states={})
        d["_budget"] = config.size("daskcfa.write.buffer-memory", buffer_size, "buffer_size")
        d["_stem"] = posixpath.splitext(posixpath.basename(url.rstrip("/")))[0]
        d["_index_options"] = dict(storage_options or {}) if chunk_index else None  # (never shown: no repr has it)
        lease = target.lease(generation_name(uuid.uuid4().hex), acquire=True)
        workers = max_concurrent_uploads or (2 if storage.is_local(url) else 4)
        d["_lease"] = lease
        d["_pool"] = ThreadPoolExecutor(max_workers=int(workers), thread_name_prefix="daskcfa-dataset")
        # at close(), when abandoned, and when dropped unclosed: the threads stop, the lease goes
        d["_end"] = weakref.finalize(self, _end_writing, lease, d["_pool"])
        try:
            if mode in ("a", "r+"):
                if existing is None or existing.dataset is None or storage.stat(url, profile) != existing.expected:
                    existing = read_existing(url, target.access, plain_too=True)
                if existing is None:  # (removed before the lease was held)
                    raise nothing_to_update(mode, url)
                d["_expected"] = existing.expected
                self._load(existing)
        except BaseException:
            self._end()
            raise
        return self

    @property
    def parent(self) -> None:
        return None

    @parent.setter
    def parent(self, value: Any) -> None:  # (the Group initialiser sets it)
        pass

    def keep(self, var: WritableVariable, state: VariableState) -> None:
        """Take the state of a variable just defined into this writer's keeping."""
        self._states[var.path] = state

    def check_fragment_dtype(self, path: str, dtype: np.dtype) -> None:
        """Refuse, when it is defined, a variable this writer's fragments cannot hold (to_cfa's refusal)."""
        check_fragment_dtype(path, dtype, self._fragment_format)

    def state_of(self, var: WritableVariable) -> VariableState:
        """Where the values of ``var`` (a variable of this dataset) are until they are written."""
        return self._states[var.path]

    def filepath(self) -> str:
        return self.url

    def isopen(self) -> bool:
        return not self._closed

    def __enter__(self) -> "AggregationWriter":
        return self

    def __repr__(self) -> str:
        lines = [f"<daskcfa.netcdf4.AggregationWriter {redact(self.url)} ({self._dialect}, being written)>"]
        lines += [f"  {var!r}" for group in self.walk() for var in group.variables.values()]
        return "\n".join(lines)

    @property
    def data_model(self) -> str:
        return self._file_format

    @property
    def file_format(self) -> str:
        return self._file_format

    def check_open(self) -> None:
        if self._closed:
            raise ArgumentError("the dataset is closed", file=self.url)
        if self._failed is not None:
            raise self._failed

    # -- assignments -----------------------------------------------------------------------------

    def assign(self, var: WritableVariable, selection: list[np.ndarray], values: Any) -> None:
        """Put ``values`` (shaped as ``selection``) into the fragments they touch; write those now complete."""
        self._lease.confirm()
        layout = self.state_of(var).layout
        per_dim = []
        for d, positions in enumerate(selection):
            owners = layout.which(d, positions)
            groups = []
            for i in np.unique(owners):
                at = np.flatnonzero(owners == i)
                start, _ = layout.span(d, int(i))
                groups.append((int(i), positions[at] - start, at))
            per_dim.append(groups)
        for combo in (np.ndindex(*[len(g) for g in per_dim]) if per_dim else [()]):
            parts = [per_dim[d][c] for d, c in enumerate(combo)]
            index = tuple(p[0] for p in parts)
            local = tuple(p[1] for p in parts)
            source = tuple(p[2] for p in parts)
            piece = as_numpy(take(values, source))
            if isinstance(values, da.Array):
                piece = storable(piece, var.value_dtype, var.path)
            buffer = self._buffer(var, index)
            buffer.put(orthogonal_index(local), self._encoded(var, index, piece))
            if buffer.complete():
                self._write(var, index, buffer.values)
        self._within_budget()

    def _encoded(self, var: WritableVariable, index: tuple[int, ...], values: Any) -> np.ndarray:
        """``values`` as the variable stores them (packed, masked elements as the fill value). What
        cannot be stored fails the write, as a fragment that cannot be written does."""
        try:
            return encode_values(values, var.attrs, var.dtype)
        except CFAError as exc:
            self.__dict__["_failed"] = exc.located(file=self.url, variable=var.path, fragment=index)
            raise self._failed from None

    def _missing(self, var: WritableVariable, index: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
        """Stored values of ``shape`` never assigned: the variable's fill value (strings: ``""``)."""
        return self._encoded(var, index, _unassigned(np.ma.masked_all(shape, var.value_dtype)))

    def _capacity(self, var: WritableVariable, index: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(b - a for a, b in (self.state_of(var).layout.span(d, i) for d, i in enumerate(index)))

    def _buffer(self, var: WritableVariable, index: tuple[int, ...]) -> Buffer:
        state = self.state_of(var)
        buffer = state.buffers.get(index)
        if buffer is None:
            buffer = state.buffers[index] = Buffer(self._capacity(var, index), var.dtype)
            if index in state.stored:  # written earlier: what was assigned then is in the file
                bits = state.stored.pop(index)
                stored = self._read_back(var, index)
                cut = tuple(slice(0, n) for n in stored.shape)
                buffer.put(cut, stored)
                shape = buffer.assigned.shape
                buffer.mark(True if bits is None else
                            np.unpackbits(bits, count=int(np.prod(shape))).astype(bool).reshape(shape))
        return buffer

    def _within_budget(self) -> None:
        """Write the fullest incomplete fragments, as they are, while the buffers exceed the budget."""
        buffers = [(var, index, b) for var in self._aggregated() for index, b in self.state_of(var).buffers.items()]
        total = sum(b.nbytes for *_, b in buffers)
        if total <= self._budget:
            return
        for var, index, buffer in sorted(buffers, key=lambda t: -t[2].fullness):
            if total <= self._budget:
                break
            total -= buffer.nbytes
            self._write(var, index, self._merged(var, index, buffer, buffer.values.shape), buffer.assigned)

    def _write(self, var: WritableVariable, index: tuple[int, ...], values: np.ndarray,
               assigned: np.ndarray | None = None) -> None:
        """Hand one fragment's stored values to the writing threads (after any earlier write of it
        finished); ``assigned``: the elements assigned when it is written incomplete."""
        state = self.state_of(var)
        state.buffers.pop(index, None)
        state.stored[index] = None if assigned is None else np.packbits(assigned)
        earlier = self._inflight.pop((var.path, index), None)
        if earlier is not None:
            self._collect((var.path, index), earlier)
        nbytes = values.nbytes
        self._bound_inflight(nbytes)
        spec, sliced = self._spec(var, index, values.shape)  # (here: the ordinary variables change in this thread)
        future = self._pool.submit(self._write_now, var, index, values, spec, sliced)
        self._inflight[(var.path, index)] = future
        self._sizes[(var.path, index)] = nbytes

    def _bound_inflight(self, nbytes: int) -> None:
        """Values handed to the writing threads count against a budget of their own (as large as the
        buffers'): wait for the oldest writes until ``nbytes`` more fit."""
        while self._inflight and sum(self._sizes.values()) + nbytes > self._budget:
            oldest = next(iter(self._inflight))
            self._collect(oldest, self._inflight.pop(oldest))

    def _collect(self, key: tuple[str, tuple[int, ...]], future: Future) -> None:
        self._sizes.pop(key, None)
        self._records[key] = future.result()

    def _write_now(self, var: WritableVariable, index: tuple[int, ...], values: np.ndarray, spec: Any,
                   sliced: list) -> FragmentRecord:
        try:
            reference = in_generation(fragment_name(self._template, stem=self._stem, variable=var.path, index=index),
                                      self._lease.generation)
            uri = storage.resolve(reference, self.url)
            stored = reference if self._uris == "relative" else uri
            # no marker: a Dataset write never resumes (a killed one is abandoned), and the marker would cost
            # a GET and a PUT per fragment
            target = FragmentTarget(index=index, shape=values.shape, uri=uri, reference=stored, marker="",
                                    token=uuid.uuid4().hex)
            return write_fragment(spec, target, values, sliced, lease=self._lease)
        except BaseException as exc:
            self.__dict__["_failed"] = exc.located(variable=var.path, fragment=index) if isinstance(exc, CFAError) \
                else FragmentError(
                f"cannot write fragment ({type(exc).__name__}: {exc})", file=self.url, variable=var.path,
                fragment=index)
            raise self._failed from exc

    def _spec(self, var: WritableVariable, index: tuple[int, ...], shape: tuple[int, ...]) -> tuple[Any, list]:
        """The fragment's description, with the coordinates known over its whole extent sliced into it."""
        state = self.state_of(var)
        where = tuple(slice(state.layout.span(d, i)[0], state.layout.span(d, i)[0] + n)
                      for d, (i, n) in enumerate(zip(index, shape)))
        model = AggregationDataset(attrs=dict(self.attrs))
        for group in self.walk():
            for name, dim in group.dimensions.items():
                model.dimensions.append(Dimension(posixpath.join(group.path, name), dim.size))
            for other in group.variables.values():
                if self.state_of(other).aggregated:
                    continue
                plain = self.state_of(other).plain_to(other.shape, other.value_dtype)  # (its dimensions may have grown)
                if not _known_over(other, plain, var, where):
                    continue
                model.variables.append(PlainVariable(other.path, other.dims, other.dtype, dict(other.attrs),
                                                     plain.array(other.shape)))
        spec, sliced, _, _ = fragment_spec(self._source(var, state.compression or None), model, self.url,
                                           format=self._dialect, fragment_format=self._fragment_format,
                                           compression={}, profile=self._profile)
        spec = shared_chunks(spec, [b - a for a, b in (state.layout.span(d, 0) for d in range(len(var.dims)))])
        values = []
        for plain, full in sliced:
            cut = tuple(where[var.dims.index(d)] if d in var.dims else slice(None) for d in plain.dims)
            values.append(encode_values(np.ma.asarray(full)[cut], plain.attrs, plain.dtype))
        return spec, values

    def _source(self, var: WritableVariable, compression: dict[str, Any] | None = None) -> WriteSource:
        """The variable as the write graph describes its fragments. An updated one keeps the previous
        aggregation's description (as ``to_cfa(mode="r+")`` does): its packing stays on the aggregation
        variable, whose fragments it has not rewritten hold their values packed without it."""
        previous = self.state_of(var).previous
        return WriteSource(var.path, None, var.dims, var.dtype, dict(var.attrs), compression=compression,
                           existing=None if previous is None else previous.variable.aggregation)

    def _read_back(self, var: WritableVariable, index: tuple[int, ...]) -> np.ndarray:
        """A fragment this write stored incomplete, as stored."""
        key = (var.path, index)
        if key in self._inflight:
            self._collect(key, self._inflight.pop(key))
        record = self._records.pop(key)
        group = "/" if self._dialect not in ("CFA-0.5", "CFA-0.4") else posixpath.dirname(var.path)
        with storage.netcdf_file(storage.resolve(record.uri, self.url), profile=self._profile) as nc:
            owner = nc if group in ("", "/") else nc[group.strip("/")]
            stored = owner.variables[var.name]
            stored.set_auto_maskandscale(False)
            return np.asarray(stored[...])

    def _aggregated(self) -> list[WritableVariable]:
        return [v for g in self.walk() for v in g.variables.values() if self.state_of(v).aggregated]

    # -- close: the rest written, then the commit ----------------------------------------------------

    def close(self) -> None:
        """Write the incomplete fragments (elements never assigned: missing, or with ``mode="a"``
        what the dataset held), then put the aggregation file in place atomically."""
        if self._closed:
            return
        try:
            self.check_open()
            for var in self._aggregated():
                self._finish(var)
            for key, future in list(self._inflight.items()):
                self._collect(key, future)
            self._inflight.clear()
            self._commit()
        finally:
            self._abandon()

    def _abandon(self) -> None:
        """Stop writing: nothing more is committed, the lease goes (what was written is never referenced)."""
        self.__dict__["_closed"] = True
        self._end()

    def __exit__(self, kind: Any, *exc: Any) -> None:
        """An exception inside the ``with`` block abandons the write: the previous dataset (or none) stays."""
        if kind is None:
            self.close()
        else:
            self._abandon()

    def _finish(self, var: WritableVariable) -> None:
        state = self.state_of(var)
        grid = state.layout.grid(var.shape)
        never = []
        for index in grid.indices():
            shape = grid.fragment_shape(index)
            buffer = state.buffers.get(index)
            if buffer is None and index in state.stored:
                if tuple(self._capacity(var, index)) == shape:
                    continue  # stored as it should be
                buffer = self._buffer(var, index)
            elif buffer is None and self._kept(var, index, shape):
                continue
            elif buffer is None and state.previous is not None and index in state.previous.kept:
                buffer = Buffer(self._capacity(var, index), var.dtype)  # grown: rewritten, merged
            elif buffer is None:
                never.append(index)
                continue
            self._write(var, index, self._merged(var, index, buffer, shape))
        for index in self._fill_needed(grid, never):
            self._write(var, index, self._missing(var, index, grid.fragment_shape(index)))

    def _fill_needed(self, grid: FragmentGrid, never: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """Of the fragments nothing was assigned to, those written full of missing values.

        CF-1.13 has no missing fragments: all of them. CFA-0.6.2 records them
        as missing: none. CFA-0.5 and CFA-0.4 list the fragments present, from
        which readers recover the grid: enough to cover every fragment position
        along every dimension.
        """
        if self._dialect not in _SPARSE_DIALECTS:
            return never
        if self._dialect == "CFA-0.6.2":
            return []
        missing = set(never)
        covered = [set() for _ in grid.grid_shape]
        for index in grid.indices():
            if index not in missing:
                for d, i in enumerate(index):
                    covered[d].add(i)
        needed = []
        diagonal = [tuple(min(k, n - 1) for n in grid.grid_shape) for k in range(max(grid.grid_shape, default=0))]
        for index in [*diagonal, *never]:  # (the diagonal first: each of its fragments covers a new row and column)
            if index in missing and any(i not in covered[d] for d, i in enumerate(index)):
                needed.append(index)
                for d, i in enumerate(index):
                    covered[d].add(i)
        return needed

    def _kept(self, var: WritableVariable, index: tuple[int, ...], shape: tuple[int, ...]) -> bool:
        """mode="a": a fragment of the previous aggregation nothing was assigned to, whose extent is
        unchanged (referenced as it is)."""
        previous = self.state_of(var).previous
        return previous is not None and index in previous.kept and \
            previous.variable.fragments.grid.fragment_shape(index) == shape

    def _merged(self, var: WritableVariable, index: tuple[int, ...], buffer: Buffer,
                shape: tuple[int, ...]) -> np.ndarray:
        """A fragment's stored values: those assigned, and elsewhere what the previous aggregation
        stores there, bit for bit (as ``to_cfa(mode="r+")`` merges), or missing values."""
        cut = tuple(slice(0, n) for n in shape)
        state = self.state_of(var)
        previous = state.previous
        if buffer.complete():
            return buffer.values[cut]
        if previous is None or index not in previous.kept:
            return np.ma.getdata(buffer.array(shape, self._missing(var, index, shape)))
        slices = tuple(slice(a, a + n) for a, n in
                       ((state.layout.span(d, i)[0], n) for d, (i, n) in enumerate(zip(index, shape))))
        inside = tuple(slice(s.start, min(s.stop, n)) for s, n in zip(slices, previous.variable.shape))
        held = tuple(slice(0, s.stop - s.start) for s in inside)
        underneath = np.empty(shape, var.dtype) if held == cut else self._missing(var, index, shape)
        underneath[held] = np.ma.getdata(previous.stored[inside].compute())
        return np.ma.getdata(buffer.array(shape, underneath))

    def _commit(self) -> None:
        model = AggregationDataset(attrs=dict(self.attrs))
        records: list[list[FragmentRecord]] = []
        paths = []
        for group in self.walk():
            if group is not self:
                model.group_attrs[group.path] = dict(group.attrs)
            for name, dim in group.dimensions.items():
                model.dimensions.append(Dimension(posixpath.join(group.path, name), dim.size, dim.unlimited))
            for var in group.variables.values():
                state = self.state_of(var)
                if not state.aggregated:
                    values = _unassigned(state.plain_to(var.shape, var.value_dtype).array(var.shape))
                    model.variables.append(PlainVariable(var.path, var.dims, var.dtype, dict(var.attrs),
                                                         encode_values(values, var.attrs, var.dtype)))
        for var in self._aggregated():
            written = {index: rec for (path, index), rec in self._records.items() if path == var.path}
            _, _, dtype, attrs = fragment_spec(self._source(var), model, self.url, format=self._dialect,
                                               fragment_format=self._fragment_format, compression={},
                                               profile=self._profile)
            model.aggregated.append(AggregatedVariable(
                name=var.path, dims=var.dims, dtype=dtype, attrs=attrs, dialect=self._dialect, source=self.url,
                fragments=self._fragments(var, {i: r.uri for i, r in written.items()})))
            records.append(list(written.values()))
            paths.append(var.path)
        settle_unlimited(model)
        mode = {"a": "r+", "r+": "r+"}.get(self._mode, "w" if storage.exists(self.url, self._profile) else "w-")
        commit = plan_commit(model, self.url, format=self._dialect, fragment_format=self._fragment_format,
                             file_format=self._file_format, generation=self._lease.generation, variables=paths,
                             mode=mode, profile=self._profile, keep_previous=self._keep_previous,
                             expected=self._expected, change=Change.of("Dataset.close", mode=self._mode))
        index = None if self._index_options is None else partial(write_chunk_index, storage_options=self._index_options)
        run_write(partial(commit_aggregation, commit, records, self._lease), self._lease, index)

    def _fragments(self, var: WritableVariable, written: dict[tuple[int, ...], str]) -> Fragments:
        """The fragment columns: those written now, those of the previous aggregation kept (as
        ``to_cfa(mode="r+")`` keeps them, unique values too), the rest missing."""
        state = self.state_of(var)
        grid, previous = state.layout.grid(var.shape), state.previous
        existing = None
        if previous is not None:  # the previous fragments on the grid grown since
            old = previous.variable.aggregation
            frags = old.fragments
            for axis, (n, m) in enumerate(zip(frags.grid.grid_shape, grid.grid_shape)):
                if m > n:
                    frags = frags.grown(axis, grid.sizes[axis][n:])
            existing = replace(old, fragments=replace(frags, grid=grid))
        return fragment_columns(WriteSource(var.path, None, var.dims, var.dtype, {}, existing=existing), grid,
                                written)

    # -- mode="a": the aggregation as it is --------------------------------------------------------

    def _load(self, existing: Existing) -> None:
        """Take over the dataset read: its structure, ordinary values and fragments."""
        ds = existing.dataset
        nodes: dict[str, Any] = {"/": self}
        self.attrs.update(ds.attrs)
        for group in ds.walk():
            node = nodes[group.path] if group.path in nodes else None
            if node is None:
                parent = nodes[posixpath.dirname(group.path.rstrip("/")) or "/"]
                node = parent.createGroup(group.name)
                node.attrs.update(group.attrs)
                nodes[group.path] = node
            for name, dim in group.dimensions.items():
                made = node.createDimension(name, None if dim.unlimited else dim.size)
                made.size = dim.size
            for name, old in group.variables.items():
                self._load_variable(node, old, existing.values.get(old.path))

    def _load_variable(self, node: Any, old: dataset.Variable, values: Any) -> None:
        dims = tuple(old.dims)
        found = [node._find_dimension(d) for d in dims]
        attrs = dict(old.attrs)
        if not old.is_aggregated:
            var = WritableVariable(old.name, old.path, dims, found, np.dtype(old.dtype), attrs, self,
                                   VariableState(False, {}))
            node.variables[old.name] = var
            plain = self.state_of(var).plain_to(var.shape, var.value_dtype)
            plain.put(tuple(slice(0, n) for n in var.shape), np.ma.asarray(values))
            return
        grid = old.fragments.grid
        offsets, steps = [list(o) for o in grid.offsets], []
        for i, row in enumerate(grid.sizes):
            step = max(row) if found[i].unlimited and row and max(row) else None
            if step is not None and len(row) and row[-1] < step:
                offsets[i].pop()  # the last fragment along an unlimited dimension grows to the others' length
            steps.append(step)
        previous = PreviousVariable(old, set(grid.indices()), stored_values(old))
        node.variables[old.name] = WritableVariable(old.name, old.path, dims, found, np.dtype(old.dtype), attrs, self,
                                                    VariableState(True, {}, FragmentLayout(offsets, steps),
                                                                  previous=previous))


def _unassigned(values: np.ma.MaskedArray) -> np.ma.MaskedArray:
    """Values whose unassigned elements are masked, as stored: strings never assigned are empty
    (netCDF has no missing string; netCDF4-python reads one never written as ``""``)."""
    return values.filled("") if values.dtype.kind in "OU" else values


def _known_over(other: WritableVariable, plain: Buffer, var: WritableVariable, where: tuple[slice, ...]) -> bool:
    """Whether every value of the ordinary variable ``other`` (its values ``plain``) that a fragment of
    ``var`` at ``where`` carries has been assigned (coordinates assigned after the data are in the
    aggregation file only)."""
    cut = []
    for d, n in zip(other.dims, other.shape):
        if d in var.dims:
            s = where[var.dims.index(d)]
            if s.stop > n:
                return False
            cut.append(s)
        else:
            cut.append(slice(0, n))
    return bool(plain.assigned[tuple(cut)].all())
