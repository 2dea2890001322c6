"""Storage: where bytes live, behind one URI convention (fsspec's).

A facade over the modules that do the work, so that callers write
``storage.read_whole(...)`` wherever a file is: :mod:`.uri` (URIs),
:mod:`.objects` (fsspec I/O), :mod:`.local` (regular local files only),
:mod:`.identity` (what tells one version of a file from another),
:mod:`.history` (a dataset's versions: imported as ``storage.history``),
:mod:`.retry` (errors translated, transient faults retried), :mod:`.atomic`
(temporaries and the move into place), :mod:`.publish` (putting an
aggregation file in place), :mod:`.netcdf` (opening netCDF files under the
lock), :mod:`.profiles` (credentials by reference), :mod:`.s3nc` (S3netCDF4's
configuration file: ``cache_location``).
"""

from __future__ import annotations

from .atomic import commit, put_atomic, remove_stale_temporaries, temporary_name, temporary_of
from .blocks import Blocks
from .identity import local_token
from .local import free_space, irregular, local_path, local_stat, open_local, real_location
from .manifest import abandoned_uri, checked_manifest, listed_fragments, manifest_uri, retired_uri, missing_directory, other_owner, read_manifest, replacing_generation
from .netcdf import netcdf_file
from .objects import (
    BLOCKS_CACHED,
    GLOB_CHARS,
    NO_PROFILE,
    block_size,
    config_bytes,
    delete,
    delete_all,
    exists,
    fetch_range_soon,
    fetch_soon,
    filesystem,
    glob,
    is_directory,
    listdir,
    memory_label,
    netcdf_memory,
    open_file,
    part_size,
    probe_opendap,
    put_bytes,
    put_file,
    put_files,
    put_stream,
    read_bytes,
    read_json,
    read_ranges,
    read_ranges_unchanged,
    read_whole,
    remove_tree,
    size,
    stat,
    tree_size,
    tree_sizes,
    version,
)
from .profiles import ProfileRef, register
from .s3nc import cache_location
from .uri import is_local, is_opendap, normalise, opendap_url, resolve, scheme_of, split_mode, to_local_path

__all__ = [
    "ProfileRef",
    "NO_PROFILE",
    "manifest_uri",
    "other_owner",
    "retired_uri",
    "abandoned_uri",
    "read_manifest",
    "checked_manifest",
    "listed_fragments",
    "missing_directory",
    "replacing_generation",
    "register",
    "cache_location",
    "normalise",
    "resolve",
    "scheme_of",
    "is_local",
    "is_opendap",
    "opendap_url",
    "to_local_path",
    "split_mode",
    "local_path",
    "real_location",
    "irregular",
    "local_stat",
    "local_token",
    "open_local",
    "filesystem",
    "exists",
    "size",
    "stat",
    "tree_size",
    "tree_sizes",
    "version",
    "part_size",
    "read_bytes",
    "read_json",
    "read_whole",
    "Blocks",
    "read_ranges",
    "read_ranges_unchanged",
    "fetch_soon",
    "fetch_range_soon",
    "open_file",
    "BLOCKS_CACHED",
    "block_size",
    "probe_opendap",
    "put_bytes",
    "put_file",
    "put_files",
    "put_stream",
    "is_directory",
    "remove_tree",
    "glob",
    "GLOB_CHARS",
    "listdir",
    "delete",
    "delete_all",
    "commit",
    "temporary_name",
    "put_atomic",
    "remove_stale_temporaries",
    "temporary_of",
    "free_space",
    "netcdf_file",
    "netcdf_memory",
    "memory_label",
    "config_bytes",
]
