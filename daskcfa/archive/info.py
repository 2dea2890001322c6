"""What an aggregation holds and where its fragments live: :func:`describe`, :func:`plot_layout`.

The summary comes from the aggregation file alone (fragments are not
opened), so it is quick even for a million fragments: variables, shapes,
dtypes, fragment grids, the size of the data, the dialect, and where the
fragments live (schemes, hosts or buckets, directories) with counts.
``storage_size=True`` also asks storage for the size of every fragment file
(in parallel, as a dask graph), to report the bytes stored and the files
missing: under the safe-URI policy that reading obeys, as a hostile
aggregation file must not make a summary stat local files or send requests
(with the user's credentials) elsewhere.
"""

from __future__ import annotations

import posixpath
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping, Sequence

import dask
import numpy as np
from dask.utils import format_bytes

from ..arguments import check_names
from .. import storage
from ..dataset import OpenedDataset, select_aggregated
from ..errors import ArgumentError, CFAError, NotFoundError, VariableNotFoundError, redact
from ..fragments.canonical import allowed_uris
from ..fragments.zarr import is_zarr, stored_size
from ..model import AggregatedVariable
from ..storage.access import Access, open_aggregation

__all__ = ["VariableSummary", "DatasetSummary", "describe", "plot_layout"]

#: Directories listed in a summary's text before the rest are counted together.
SHOWN_DIRECTORIES = 12
#: Files whose sizes one task asks for (storage_size=True).
STAT_BATCH = 64


@dataclass(frozen=True)
class VariableSummary:
    """One variable: aggregated ones have a dialect and a fragment grid."""

    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    dialect: str | None = None
    #: fragments along each dimension
    grid: tuple[int, ...] = ()
    #: smallest and largest fragment size along each dimension
    fragment_sizes: tuple[tuple[int, int], ...] = ()
    in_files: int = 0  #: fragments stored in files
    unique_valued: int = 0  #: fragments described by one value
    missing: int = 0  #: fragments wholly missing (read as missing data)
    #: fragment files per directory (``file:///dir``, ``s3://bucket/prefix``)
    locations: Mapping[str, int] = field(default_factory=dict)

    @property
    def aggregated(self) -> bool:
        return self.dialect is not None

    @property
    def nfragments(self) -> int:
        return int(np.prod(self.grid, dtype=np.int64)) if self.aggregated else 0

    @property
    def nbytes(self) -> int:
        """Size of the data in memory (decoded values aside: the stored dtype)."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def __str__(self) -> str:
        dims = ", ".join(f"{d}={n}" for d, n in zip(self.dims, self.shape)) or "scalar"
        text = f"{self.name} ({dims}) {np.dtype(self.dtype)}"
        if not self.aggregated:
            return text
        grid = " x ".join(map(str, self.grid)) or "1"
        sizes = ", ".join(f"{d} {lo}" if lo == hi else f"{d} {lo}-{hi}"
                          for d, (lo, hi) in zip(self.dims, self.fragment_sizes))
        kinds = [f"{self.in_files} in files"]
        if self.unique_valued:
            kinds.append(f"{self.unique_valued} unique-valued")
        if self.missing:
            kinds.append(f"{self.missing} missing")
        text += f", {format_bytes(self.nbytes)} [{self.dialect}]\n"
        text += f"    {self.nfragments} fragment(s) in a {grid} grid ({'; '.join(kinds)})"
        return text + (f"; fragment sizes: {sizes}" if sizes else "")


@dataclass(frozen=True)
class DatasetSummary:
    """What :func:`describe` found; ``str()`` is the report ``daskcfa info`` prints."""

    url: str
    dimensions: Mapping[str, int]
    variables: tuple[VariableSummary, ...]
    #: bytes of the fragment files on storage, and files not found (storage_size=True only)
    stored_bytes: int | None = None
    missing_files: tuple[str, ...] = ()

    def __repr__(self) -> str:
        """The fields, any credential in a URI taken out (a summary is printed and pasted)."""
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))
        return redact(f"{type(self).__name__}({shown})")

    @property
    def aggregated(self) -> tuple[VariableSummary, ...]:
        return tuple(v for v in self.variables if v.aggregated)

    @property
    def dialects(self) -> tuple[str, ...]:
        return tuple(sorted({v.dialect for v in self.aggregated if v.dialect}))

    @property
    def nbytes(self) -> int:
        """Size of the aggregated data (in memory, stored dtype)."""
        return sum(v.nbytes for v in self.aggregated)

    @property
    def nfragments(self) -> int:
        return sum(v.nfragments for v in self.aggregated)

    @property
    def locations(self) -> dict[str, int]:
        """Fragment files per directory, over all aggregated variables."""
        total: Counter[str] = Counter()
        for v in self.aggregated:
            total.update(v.locations)
        return dict(total.most_common())

    @property
    def storages(self) -> dict[str, int]:
        """Fragment files per scheme and host or bucket (``file://``, ``s3://bucket``)."""
        total: Counter[str] = Counter()
        for directory, n in self.locations.items():
            total[_storage_of(directory)] += n
        return dict(total.most_common())

    def __str__(self) -> str:
        lines = [f"{redact(self.url)}",
                 f"  dialect: {', '.join(self.dialects) or 'none (no aggregated variable)'}",
                 "  dimensions: " + (", ".join(f"{d}={n}" for d, n in self.dimensions.items()) or "none"),
                 f"  aggregated data: {format_bytes(self.nbytes)} in {self.nfragments} fragment(s)"]
        if self.stored_bytes is not None:
            missing = f"; {len(self.missing_files)} file(s) not found" if self.missing_files else ""
            lines.append(f"  stored: {format_bytes(self.stored_bytes)} in fragment files{missing}")
        lines.append("  aggregated variables:")
        lines += [f"    {v}" for v in self.aggregated] or ["    none"]
        others = [v for v in self.variables if not v.aggregated]
        if others:
            lines.append("  other variables: " + ", ".join(str(v) for v in others))
        if self.locations:
            lines.append("  fragment files by storage: "
                         + ", ".join(f"{redact(s)} {n}" for s, n in self.storages.items()))
            lines.append("  fragment files by directory:")
            shown = list(self.locations.items())
            lines += [f"    {n:>8}  {redact(d)}" for d, n in shown[:SHOWN_DIRECTORIES]]
            if len(shown) > SHOWN_DIRECTORIES:
                rest = sum(n for _, n in shown[SHOWN_DIRECTORIES:])
                lines.append(f"    {rest:>8}  in {len(shown) - SHOWN_DIRECTORIES} more directories")
        return "\n".join(lines)


def describe(url: str, *, storage_options: Mapping[str, Any] | None = None, storage_size: bool = False,
             allowed_locations: Iterable[str] | None = None) -> DatasetSummary:
    """Summarise the aggregation file at ``url`` (see :class:`DatasetSummary`).

    Only the aggregation file is read, unless ``storage_size`` asks for the
    size of every fragment file too; then fragment files are sized under the
    safe-URI policy that reading obeys (``allowed_locations``, as for
    :func:`daskcfa.open_cfa`): a fragment it refuses raises
    :class:`~daskcfa.errors.UnsafeURIError`, before any request.
    """
    url, access = open_aggregation(url, storage_options, allowed_locations)
    ds = OpenedDataset.open(url, access=access)
    dimensions: dict[str, int] = {}
    variables = []
    for group in ds.walk():
        for dim in group.dimensions.values():
            dimensions[posixpath.join(group.path, dim.name)] = dim.size
        for var in group.variables.values():
            if var.aggregation is not None:
                variables.append(_aggregated_summary(var.aggregation))
            else:
                variables.append(VariableSummary(var.path, tuple(var.dims), tuple(var.shape), var.dtype))
    summary = DatasetSummary(url, dimensions, tuple(variables))
    if not storage_size:
        return summary
    for var in ds.aggregated_variables.values():  # (the logins taken out of fragment URIs)
        access = access.with_logins(var.aggregation.logins)
    found = _fragment_files(ds.aggregated_variables.values(), access)
    files = sorted(found)
    batches = [dask.delayed(_sizes, pure=True)([(f, *found[f]) for f in files[i:i + STAT_BATCH]], access)
               for i in range(0, len(files), STAT_BATCH)]
    sizes = [s for batch in dask.compute(*batches) for s in batch]
    missing = tuple(redact(f) for f, s in zip(files, sizes) if s is None)
    return DatasetSummary(url, dimensions, tuple(variables), sum(s for s in sizes if s is not None), missing)


def _fragment_files(variables: Iterable[Any], access: Access) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every fragment file named, resolved and allowed by the policy, with a
    variable and fragment naming it (for errors)."""
    found: dict[str, tuple[str, tuple[int, ...]]] = {}
    for var in variables:
        av = var.aggregation
        uris = av.fragments.uris
        if uris is None:
            continue
        names = np.array([str(u) if u is not None else "" for u in uris.ravel()], dtype=object)
        references, first = np.unique(names, return_index=True)  # (one pass, however many fragments)
        for reference, position in zip(references, first):
            if not reference:
                continue
            fragment = tuple(int(i) for i in np.unravel_index(position // uris.shape[-1], uris.shape[:-1]))
            uri, = allowed_uris([reference], av.source, access.policy,
                                {"file": av.source, "variable": av.name, "fragment": fragment})
            found.setdefault(uri, (av.name, fragment))
    return found


def _sizes(files: Sequence[tuple[str, str, tuple[int, ...]]], access: Access) -> list[int | None]:
    sizes: list[int | None] = []
    for uri, variable, fragment in files:
        try:
            size = stored_size if is_zarr(uri) else storage.size  # (a store: every object under it)
            sizes.append(size(uri, access.profile, policy=access.policy))
        except NotFoundError:
            sizes.append(None)
        except CFAError as exc:
            raise exc.located(file=uri, variable=variable, fragment=fragment)
    return sizes


def _aggregated_summary(av: AggregatedVariable) -> VariableSummary:
    frags = av.fragments
    grid = frags.grid
    in_files = np.zeros(grid.grid_shape, dtype=bool)
    if frags.uris is not None:
        named = np.frompyfunc(lambda u: u is not None and str(u) != "", 1, 1)(frags.uris)
        in_files = named.astype(bool).any(axis=-1)
    unique = np.zeros(grid.grid_shape, dtype=bool)
    if frags.unique_values is not None:
        unique = ~np.ma.getmaskarray(frags.unique_values).reshape(grid.grid_shape) & ~in_files
    return VariableSummary(
        name=av.name, dims=av.dims, shape=av.shape, dtype=np.dtype(av.dtype), dialect=av.dialect,
        grid=grid.grid_shape,
        fragment_sizes=tuple((min(row, default=0), max(row, default=0)) for row in grid.sizes),
        in_files=int(in_files.sum()), unique_valued=int(unique.sum()),
        missing=int(grid.nfragments - in_files.sum() - unique.sum()),
        locations=_directories(av),
    )


def _directories(av: AggregatedVariable) -> dict[str, int]:
    """Fragment files per directory (the first URI of each fragment; each distinct directory resolved once)."""
    uris = av.fragments.uris
    if uris is None:
        return {}
    first = np.array([str(u) if u is not None else "" for u in uris[..., 0].ravel()], dtype=object)
    first = first[first != ""]
    heads, counts = np.unique(np.array([u.rpartition("/")[0] + "/" if "/" in u else "" for u in first],
                                       dtype=object), return_counts=True)
    found: Counter[str] = Counter()
    for head, n in zip(heads, counts):  # resolve a name in each directory, then take its directory
        found[_display_directory(storage.resolve(head + "f", av.source))] += int(n)
    return dict(found.most_common())


def _display_directory(uri: str) -> str:
    """The directory of a resolved fragment URI, as a URI (local ones as ``file://``)."""
    if storage.is_local(uri):
        return "file://" + posixpath.dirname(uri)
    return uri.rpartition("/")[0]


def _storage_of(directory: str) -> str:
    """``s3://bucket/a/b`` -> ``s3://bucket``; ``file:///x`` -> ``file://`` (the local filesystem)."""
    scheme, _, rest = directory.partition("://")
    return f"{scheme}://" + ("" if scheme == "file" else rest.split("/", 1)[0])


def plot_layout(url: str, output: str, *, variable: str | None = None, dims: Sequence[str] | None = None,
                storage_options: Mapping[str, Any] | None = None) -> str:
    """Draw the fragment layout of one aggregated variable into the image file ``output``.

    Fragments are drawn over two dimensions (``dims``; by default the two
    cut into the most fragments), coloured by the directory holding them; the
    fragments shown are those at the first fragment position along the
    other dimensions. Needs matplotlib (``pip install "daskcfa[plot]"``).
    Returns ``output``.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import ListedColormap
    except ImportError:
        raise ImportError('plotting needs matplotlib: pip install "daskcfa[plot]"') from None
    url, access = open_aggregation(url, storage_options)
    ds = OpenedDataset.open(url, access=access)
    av = _one_variable(ds, variable, url)
    rows, cols = _plot_axes(av, dims)
    grid = av.fragments.grid
    index = [0] * grid.ndim
    labels = np.zeros((grid.grid_shape[rows] if rows is not None else 1, grid.grid_shape[cols]), dtype=int)
    names = ["missing", "unique value"]
    for i in range(labels.shape[0]):
        for j in range(labels.shape[1]):
            if rows is not None:
                index[rows] = i
            index[cols] = j
            ref = av.fragments[tuple(index)]
            if ref.is_missing:
                labels[i, j] = 0
            elif not ref.uris:
                labels[i, j] = 1
            else:
                where = _display_directory(storage.resolve(ref.uris[0], av.source))
                if where not in names:
                    names.append(where)
                labels[i, j] = names.index(where)
    colours = ["#dddddd", "#999999", *(plt.get_cmap("tab20")(k % 20) for k in range(len(names) - 2))]
    y_edges = np.asarray(grid.offsets[rows]) if rows is not None else np.array([0, 1])
    x_edges = np.asarray(grid.offsets[cols])
    many = max(labels.shape) > 200
    fig, ax = plt.subplots(figsize=(8, 6))
    ax.pcolormesh(x_edges, y_edges, labels, cmap=ListedColormap(colours), vmin=-0.5, vmax=len(colours) - 0.5,
                  edgecolors="none" if many else "black", linewidth=0 if many else 0.5)
    ax.set_xlabel(f"{av.dims[cols]} ({grid.grid_shape[cols]} fragments)")
    if rows is not None:
        ax.set_ylabel(f"{av.dims[rows]} ({grid.grid_shape[rows]} fragments)")
        ax.invert_yaxis()
    others = [f"{av.dims[d]}: 1 of {n}" for d, n in enumerate(grid.grid_shape) if d not in (rows, cols)]
    title = f"{av.name} {av.shape}, {grid.nfragments} fragments"
    ax.set_title(title + (f"\n(fragments shown: {', '.join(others)})" if others else ""), fontsize=10)
    used = sorted(set(labels.ravel().tolist()))
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[k]) for k in used]
    ax.legend(handles, [redact(names[k]) for k in used], loc="upper center", bbox_to_anchor=(0.5, -0.12),
              fontsize=8, ncol=1 if len(used) < 4 else 2, frameon=False)
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    plt.close(fig)
    return output


def _one_variable(ds: OpenedDataset, variable: str | None, url: str) -> AggregatedVariable:
    found = select_aggregated(ds, None if variable is None else [variable], url)
    if len(found) != 1:
        names = ", ".join(av.name for av in found) or "none"
        raise VariableNotFoundError(f"choose the variable to plot: {names}", file=url)
    return found[0]


def _plot_axes(av: AggregatedVariable, dims: Sequence[str] | None) -> tuple[int | None, int]:
    """Positions of the row and column dimensions (rows None: 1-d data)."""
    if dims is None:
        if not av.dims:
            raise ArgumentError(f"{av.name} is scalar: there is no layout to plot")
        if len(av.dims) == 1:
            return None, 0
        # the two dimensions cut into the most fragments (the first ones on a tie), in the data's order
        counts = av.fragments.grid.grid_shape
        rows, cols = sorted(sorted(range(len(counts)), key=lambda d: -counts[d])[:2])
        return rows, cols
    dims = list(dims)
    check_names("dims", dims, av.dims, file=av.source)
    if len(dims) not in (1, 2) or len(set(dims)) != len(dims):
        raise ArgumentError(f"choose one or two distinct dimensions of {av.name} to plot from {list(av.dims)}, "
                         f"not {dims}")
    if len(dims) == 1:
        return None, av.dims.index(dims[0])
    return av.dims.index(dims[0]), av.dims.index(dims[1])

