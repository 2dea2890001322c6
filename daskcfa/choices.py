"""The fixed sets of names the API and the command line accept, and the defaults they share.

Kept apart from the modules that use them, with no imports, so that building
the command line's parser (``daskcfa --help``) does not import netCDF4,
h5py or dask.array; one home for each default, so that a function of the API
and the subcommand over it cannot drift apart.
"""

__all__ = ["WRITE_FORMATS", "FRAGMENT_FORMATS", "ZARR_FRAGMENTS", "URI_STYLES", "REFERENCE_FORMATS", "ICECHUNK_FALLBACKS",
           "DEFAULT_FORMAT", "DEFAULT_FRAGMENT_FORMAT", "DEFAULT_URIS", "MAX_FRAGMENT_SIZE", "MAX_MEM"]

#: Aggregation dialects daskcfa writes.
WRITE_FORMATS = ("CF-1.13", "CFA-0.6.2", "CFA-0.5", "CFA-0.4")

#: The fragment format of fragments written as Zarr stores (Zarr v2, read by xarray and netCDF-C's NCZarr).
ZARR_FRAGMENTS = "zarr"

#: Formats a fragment can be written in: netCDF file formats, or a Zarr store.
FRAGMENT_FORMATS = ("NETCDF4", "NETCDF4_CLASSIC", "NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET", "NETCDF3_64BIT_DATA",
                    ZARR_FRAGMENTS)

#: How an aggregation file refers to its fragments: ``"relative"`` to the aggregation file where both are on
#: the same storage (the default: the archive moves as a whole), or always ``"absolute"`` URIs, for readers that
#: resolve relative references against their working directory (cfdm, CFAPyX, S3netCDF4).
URI_STYLES = ("relative", "absolute")

#: Reference-set formats ``to_references`` writes: fsspec's JSON (version 1, with templates) and its Parquet directory.
REFERENCE_FORMATS = ("json", "parquet")

#: What ``to_icechunk`` does with a variable references cannot present exactly: refuse it (naming why), or
#: write its values into the repository as data.
ICECHUNK_FALLBACKS = ("raise", "copy")

#: The dialect of new aggregation files.
DEFAULT_FORMAT = WRITE_FORMATS[0]

#: The format of new fragments.
DEFAULT_FRAGMENT_FORMAT = FRAGMENT_FORMATS[0]

#: How new aggregation files refer to their fragments.
DEFAULT_URIS = URI_STYLES[0]

#: The default bound on a new fragment's bytes (S3netCDF4's ``max_subarray_size`` default), where no
#: fragment shape is given.
MAX_FRAGMENT_SIZE = "50MB"

#: The default memory budget of each task re-fragmenting (``refragment``, ``daskcfa split``).
MAX_MEM = "1GiB"
