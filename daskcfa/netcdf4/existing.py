"""The dataset an update (``mode="a"`` or ``"r+"``) takes over, read in one open of its file: the
format that keeps it as it is written, its structure and fragments, and its ordinary values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import dataset, storage
from ..errors import NotFoundError
from ..formats import aggregated_variables
from ..formats.encode import common_format
from ..model import AggregatedVariable
from ..storage.access import Access

__all__ = ["Existing", "read_existing"]


@dataclass
class Existing:
    """An existing dataset as one read of its file found it."""

    #: the file's version when it was read: a writer whose commit finds another has a conflict
    expected: tuple[int, str]
    #: its netCDF data model (``"NETCDF4"``, ``"NETCDF3_CLASSIC"``...)
    data_model: str
    aggregated: list[AggregatedVariable]
    #: the dataset read (None: a plain file, read only for its format)
    dataset: dataset.OpenedDataset | None
    #: the ordinary variables' values, by path
    values: dict[str, Any]

    def format(self) -> tuple[str, str | None]:
        """``(format, cfa_version)`` that keep the dataset as it is written: a plain file stays plain,
        an aggregation keeps its dialect and its aggregation file's format."""
        if not self.aggregated:
            return self.data_model, None
        dialect = common_format(self.aggregated, self.dataset.url if self.dataset else "", "update it")
        if dialect == "CFA-0.4":
            return ("CFA3" if self.data_model.startswith("NETCDF3") else "CFA4"), "0.4"
        return ("CFA4", "0.5") if dialect == "CFA-0.5" else (dialect, None)


def read_existing(url: str, access: Access, *, plain_too: bool = False) -> Existing | None:
    """The dataset at ``url`` (None when there is none); a plain file's structure and values only with
    ``plain_too`` (an aggregation format asked for: the file is taken over)."""
    try:
        expected = storage.stat(url, access.profile)  # (first: a change after it is found at the commit)
        with storage.netcdf_file(url, profile=access.profile, whole=True) as nc:
            found = list(aggregated_variables(nc, url).values())
            if not found and not plain_too:
                return Existing(expected, nc.data_model, found, None, {})
            read = dataset.OpenedDataset.from_netcdf(nc, url, access)
            values = {var.path: dataset.ordinary_values(var, nc) for group in read.walk()
                      for var in group.variables.values() if not var.is_aggregated}
            return Existing(expected, nc.data_model, found, read, values)
    except NotFoundError:
        return None
