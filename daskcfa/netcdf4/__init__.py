"""netCDF4-python's ``Dataset``, writing and reading aggregations: S3netCDF4's API, in daskcfa.

Code written for S3netCDF4 moves by changing one import::

    from daskcfa.netcdf4 import Dataset   # was: from S3netCDF4._s3netCDF4 import s3Dataset as Dataset

``Dataset(url, "w", format="CFA4")`` then ``createDimension``,
``createVariable(..., subarray_shape=... | max_subarray_size=...)``,
attributes, ``var[index] = values`` and ``close()``, on local disk or S3.

The modules: :mod:`.factory` (``Dataset(url, mode)``: which reader or
writer), :mod:`.aggregation` (:class:`AggregationWriter`: buffered
fragments, committed at ``close()``), :mod:`.plain` (:class:`PlainWriter`:
plain netCDF files, by netCDF4-python itself), :mod:`.groups` and
:mod:`.definitions` (the definition tree and netCDF's rules for it),
:mod:`.variables` (:class:`WritableVariable`, and the
:class:`VariableState` its writer keeps), :mod:`.layout` (fragment layout
and buffers), :mod:`.indexing` (netCDF4-python's index rules for
assignments), :mod:`.existing` (what an update takes over, read once).

Reading (``mode="r"``) is :func:`daskcfa.open_cfa`: aggregated and ordinary
variables, ``var[index]`` giving numpy (masked like netCDF4-python), fragments
read concurrently; a result larger than ``daskcfa.io.cache-memory`` goes to a
``numpy.memmap`` in the cache directory (S3netCDF4's ``cache_location``).
"""

from ..dataset import Dimension
from .aggregation import AggregationWriter
from .definitions import GrowingDimension
from .factory import AGGREGATION_FORMATS, Dataset
from .groups import WritableGroup
from .plain import PLAIN_FORMATS, PlainWriter
from .variables import VariableState, WritableVariable

__all__ = ["Dataset", "AggregationWriter", "PlainWriter", "WritableGroup", "WritableVariable", "VariableState",
           "Dimension", "GrowingDimension", "AGGREGATION_FORMATS", "PLAIN_FORMATS"]
