"""The process-wide lock around the netCDF-C/HDF5 libraries.

netCDF-C and HDF5 are not thread-safe: every call into them in a process goes
through this one lock. Code holding it does as little as possible (open,
locate, read bytes); decoding, unit conversion and assembly run outside.
"""

import threading

HDF5_LOCK = threading.RLock()
