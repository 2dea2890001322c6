"""The format layer: find aggregated variables and parse their instructions.

Pure parsing: no I/O policy, no fragment access. Each dialect is detected from
the attributes of the variable itself, never from the global ``Conventions``
attribute (real files carry wrong or stale ones).
"""

from .dialects import aggregated_variables, dialect_of, parse_variable, walk

__all__ = ["dialect_of", "parse_variable", "aggregated_variables", "walk"]
