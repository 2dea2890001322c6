"""A variable of an aggregation being written, and the state its writer keeps for it.

:class:`WritableVariable` is what users hold (netCDF4-python's ``Variable``:
attributes, ``var[index] = values``); :class:`VariableState` is the
writer's: where the variable's values are until they are written. The
writer owns the states (``AggregationWriter.state_of``), so that neither
class reaches into the other's private fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .. import dataset
from ..decode import Encoding
from ..errors import ArgumentError
from ..lazy import dask_array as da
from .definitions import GrowingDimension, NetCDFAttributes, Writer, check_elements
from .indexing import as_numpy, conform, selection, storable
from .layout import Buffer, FragmentLayout

__all__ = ["PreviousVariable", "VariableOwner", "VariableState", "WritableVariable"]

#: attributes that say how assigned values are stored
_PACKING = ("scale_factor", "add_offset", "_Unsigned")


@dataclass
class PreviousVariable:
    """``mode="a"``: a variable as the previous aggregation holds it."""

    variable: dataset.Variable
    #: the previous fragments nothing rewrote yet (referenced as they are, or merged when partly assigned)
    kept: set[tuple[int, ...]]
    #: its stored values (dask, not decoded): what a partly assigned fragment is merged with, bit for bit
    stored: Any


@dataclass
class VariableState:
    """Where a variable's values are until ``close()``: an ordinary variable's in ``plain`` (it goes into
    the aggregation file), an aggregated one's in per-fragment ``buffers`` laid out by ``layout``."""

    aggregated: bool
    #: createVariable's compression keywords, for the fragments
    compression: dict[str, Any]
    layout: FragmentLayout | None = None
    #: an ordinary variable's values (grown as its dimensions grow)
    plain: Buffer | None = None
    #: fragment index -> the values assigned and not yet written
    buffers: dict[tuple[int, ...], Buffer] = field(default_factory=dict)
    #: fragments written (read back when assigned again): index -> packed bits of the elements assigned
    #: when written incomplete (the buffer budget), None when complete
    stored: dict[tuple[int, ...], np.ndarray | None] = field(default_factory=dict)
    previous: PreviousVariable | None = None

    def assigned_any(self) -> bool:
        if self.plain is not None:
            return bool(self.plain.assigned.any())
        return bool(self.buffers or self.stored or self.previous is not None)

    def plain_to(self, shape: tuple[int, ...], dtype: np.dtype) -> Buffer:
        """An ordinary variable's buffer grown to ``shape``, holding values of ``dtype`` (packing
        attributes set after the variable was created change it)."""
        old = self.plain if self.plain is not None else Buffer((0,) * len(shape), dtype)
        capacity = old.values.shape
        if all(n <= c for n, c in zip(shape, capacity)) and old.values.dtype == dtype:
            self.plain = old
            return old
        new = Buffer(tuple(c if n <= c else max(n, 2 * c) for n, c in zip(shape, capacity)), dtype)
        cut = tuple(slice(0, n) for n in old.values.shape)
        new.values[cut], new.masked[cut], new.assigned[cut] = old.values, old.masked, old.assigned
        self.plain = new
        return new


class VariableOwner(Writer, Protocol):
    """What a variable needs of the writer that keeps its state (an :class:`~.aggregation.AggregationWriter`)."""

    def keep(self, var: "WritableVariable", state: VariableState) -> None:
        """Take ``state`` into the writer's keeping."""

    def state_of(self, var: "WritableVariable") -> VariableState:
        """The state the writer keeps for ``var``."""

    def assign(self, var: "WritableVariable", selection: list[np.ndarray], values: Any) -> None:
        """Put the values assigned to an aggregated variable into its fragments."""

    def check_fragment_dtype(self, path: str, dtype: np.dtype) -> None:
        """Refuse to aggregate ``dtype`` into fragments whose format cannot hold it."""


class WritableVariable(NetCDFAttributes, dataset.Variable):
    """A variable of a dataset being written: ``var[index] = values``, netCDF4-python's rules.

    Indices: integers (negative count from the end), slices, integer and
    boolean sequences (one per dimension, orthogonal as in netCDF4-python),
    ``Ellipsis``; an index past the end of an unlimited dimension grows it.
    Values: numpy (masked: missing), dask (computed one fragment at a time),
    or anything numpy converts, broadcast to the selection.
    """

    def __init__(self, name: str, path: str, dims: tuple[str, ...], dimensions: list[GrowingDimension],
                 dtype: np.dtype, attrs: dict[str, Any], writer: VariableOwner, state: VariableState) -> None:
        """``state``: the writer's state of the variable, which the writer takes into its keeping."""
        self.__dict__.update(name=name, path=path, dims=dims, dtype=dtype, attrs=attrs, aggregation=None,
                             _writer=writer, _dimensions=dimensions, _data=None, _url=writer.url, _access=None)
        writer.keep(self, state)
        if not state.aggregated:
            state.plain_to(self.shape, self.value_dtype)

    @property
    def _state(self) -> VariableState:
        return self._writer.state_of(self)

    @property
    def shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return tuple(d.size for d in self._dimensions)

    @property
    def is_aggregated(self) -> bool:
        return self._state.aggregated

    @property
    def fragments(self) -> None:  # type: ignore[override]
        return None

    def _attribute(self, name: str, value: Any) -> Any:
        if name == "_FillValue":
            if self._state.assigned_any():
                raise ArgumentError(f"{self.path}: _FillValue cannot change once values are assigned (give it to "
                                    "createVariable(fill_value=...), as netCDF4-python asks)")
            value = np.array(value, dtype=self.dtype)[()] if self.dtype.kind in "iuf" else value
        elif name in _PACKING and self._state.assigned_any():
            raise ArgumentError(f"{self.path}: {name} cannot change once values are assigned (netCDF4-python would "
                                "read the values stored so far with it, daskcfa would pack them with it: set it "
                                "before assigning)")
        return value

    def set_auto_maskandscale(self, value: bool) -> None:
        if not value:
            raise ArgumentError("daskcfa always masks and scales (as netCDF4-python does by default)")

    set_auto_mask = set_auto_scale = set_auto_maskandscale

    def __getitem__(self, key: Any) -> np.ndarray:
        if self._state.aggregated:
            raise ArgumentError(f"{self.path} is aggregated: read it after close(), by opening the dataset again "
                                "(its fragments are not all written yet)", file=self._writer.url)
        chosen, _, drop = selection(key, self.shape, [False] * len(self.shape), None)
        plain = self._state.plain_to(self.shape, self.value_dtype)
        values = plain.array(self.shape)[np.ix_(*chosen)] if chosen else plain.array(())
        return values.reshape([len(s) for i, s in enumerate(chosen) if i not in drop])

    def __setitem__(self, key: Any, values: Any) -> None:
        writer = self._writer
        writer.check_open()
        unlimited = [d.unlimited for d in self._dimensions]
        value_shape = np.shape(values) if not isinstance(values, da.Array) else values.shape
        chosen, grown, drop = selection(key, self.shape, unlimited, value_shape)
        target = tuple(len(s) for i, s in enumerate(chosen) if i not in drop)
        values = conform(storable(values, self.value_dtype, self.path), target, tuple(len(s) for s in chosen),
                         self.path)
        check_elements(f"variable {self.path!r}", [max(d.size, n) for d, n in zip(self._dimensions, grown)],
                       writer.url)
        for dim, size in zip(self._dimensions, grown):
            if size > dim.size:
                dim.size = size
        state = self._state
        if not state.aggregated:
            plain = state.plain_to(self.shape, self.value_dtype)  # (also after packing attributes were set)
            plain.put(np.ix_(*chosen) if chosen else (), as_numpy(values))
            return
        writer.assign(self, chosen, values)

    def assignValue(self, value: Any) -> None:
        """netCDF4-python's way to set a scalar variable."""
        self[...] = value

    def getValue(self) -> Any:
        return self[...]

    @property
    def value_dtype(self) -> np.dtype:
        """The dtype of the values assigned (unpacked: netCDF4-python's rule)."""
        return Encoding.from_attrs(self.attrs, self.dtype).decoded_dtype if self.dtype.kind in "iuf" else self.dtype

    def __repr__(self) -> str:
        kind = "aggregated" if self._state.aggregated else "ordinary"
        dims = ", ".join(f"{d}: {n}" for d, n in zip(self.dims, self.shape))
        return f"<daskcfa.netcdf4.WritableVariable {self.path} ({dims}) {self.dtype} [{kind}, being written]>"
