"""The daskcfa exception hierarchy.

Every error says *where* things went wrong: the file (aggregation file or
fragment URI, with any embedded credentials removed), the aggregated variable
and the fragment index, so that a user facing a 10,000-fragment archive knows
which file to look at.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

__all__ = [
    "CFAError",
    "CFAFormatError",
    "VariableNotFoundError",
    "FragmentError",
    "MissingFragmentError",
    "FragmentReadError",
    "FragmentShapeError",
    "UnitsError",
    "StorageError",
    "NotFoundError",
    "VersionNotFoundError",
    "UnsafeURIError",
    "BudgetError",
    "AggregationError",
    "WriteConflictError",
    "ConfigError",
    "ArgumentError",
    "ReferencesError",
    "TargetExistsError",
    "IndexingError",
    "ClosedError",
    "CFAWarning",
    "redact",
    "uri_secrets",
    "printable",
]

#: a URI's ``user:password@``, up to the authority's last ``@`` (a password may hold one, as URL parsers take it);
#: also after a scheme typed with one or three slashes (``http:/user:pw@host``: read as a local path, then named);
#: and a password holding a ``/`` not percent-encoded (``http://user:123/pw@host``: URL parsers take
#: ``user:123`` for the host and port and the rest for the path; AWS secret keys hold ``/`` after letters),
#: up to the path's first ``@`` within 128 characters (a path of that form holding an ``@`` is redacted
#: too: what it hides cannot be told from a password)
#: (matched from the start of a run of scheme characters only: tried from each letter of a long run, the
#: search took time quadratic in the text, 40 s for a 100,000-letter file name; each part after the scheme
#: stops at a character the next part needs, so no part is tried at more than one length per start, and
#: no possessive quantifier is needed, which Python 3.10's ``re`` lacks)
_USERINFO = re.compile(r"(?<![A-Za-z0-9+.-])(?P<scheme>(?=[0-9+.-]*[A-Za-z])[A-Za-z0-9+.-]+:/{1,3})"
                       r"(?:[^/?#\s:]*:[^/?#\s@]*/[^?#\s@]{0,128}|[^/?#\s]*)@")
#: a query (or fragment) parameter whose name ends in a word that holds secrets (``X-Amz-Signature``,
#: ``AWSAccessKeyId``, ``sig``, ``access_token``, ``api_key``, ``client_secret``, ``auth``, an OAuth ``code``,
#: a ``session``...), its name percent-encoded or not, in brackets or not (``auth[token]``), after ``?``, ``&``,
#: ``;`` or ``#``: its value is redacted
_SECRET_QUERY = re.compile(
    r"(?i)([?&;#][\w.%\[\]-]*?(?:signature|credential|token|secret|password|passwd|pwd|sig|key|keyid|accessid|auth"
    r"|authorization|code|session|jwt)(?:\[?\]|(?:%5B)?%5D)?=)[^&;#\s]*"
)


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on (escape sequences, control and format
    characters: a bell, a screen clear, a right-to-left override in a hostile file's names) shown as
    its Python escape; line breaks kept."""
    if text.isprintable():  # (the usual case, at C speed: a text printed may be megabytes)
        return text
    return "\n".join("".join(c if c.isprintable() else ascii(c)[1:-1] for c in line) for line in text.split("\n"))


def redact(text: str) -> str:
    """Remove credentials that may be embedded in a URI (``user:pw@`` or signed queries)."""
    text = _USERINFO.sub(r"\g<scheme>***@", text)
    return _SECRET_QUERY.sub(r"\1***", text) if "=" in text else text  # (a plain path: no query to look at)


def uri_secrets(text: str) -> set[str]:
    """The credentials :func:`redact` removes from ``text`` (the values of signed queries and the
    ``user:pw`` before an ``@``): what log records, which other libraries write, must not show."""
    found = {m.group(0)[len(m.group(1)):] for m in _SECRET_QUERY.finditer(text)}
    for m in _USERINFO.finditer(text):
        login = m.group(0)[len(m.group("scheme")):-1]
        found |= {login, login.partition(":")[2], login.partition("/")[2]}  # (the last: what parsers take for a path)
    return {s for s in found if s}


class CFAError(Exception):
    """Base class of every daskcfa error.

    ``file``, ``variable`` and ``fragment`` are kept as attributes and appended
    to the message, so that both programs and people can tell what failed.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        variable: str | None = None,
        fragment: Sequence[int] | None = None,
    ) -> None:
        self.reason = printable(message)  # (it quotes names from files: a traceback prints it to a terminal)
        self.file = redact(str(file)) if file is not None else None
        self.variable = variable
        self.fragment = tuple(int(i) for i in fragment) if fragment is not None else None
        super().__init__(self._compose())

    def _compose(self) -> str:
        where = []
        if self.file is not None:
            where.append(f"file {self.file!r}")
        if self.variable is not None:
            where.append(f"variable {self.variable!r}")
        if self.fragment is not None:
            where.append(f"fragment {self.fragment}")
        return f"{self.reason} ({', '.join(where)})" if where else self.reason

    def located(self, **where: Any) -> "CFAError":
        """Fill in location fields not already known (used while an error propagates up)."""
        for name in ("file", "variable", "fragment"):
            if getattr(self, name) is None and where.get(name) is not None:
                value = where[name]
                if name == "file":
                    value = redact(str(value))
                elif name == "fragment":
                    value = tuple(int(i) for i in value)
                setattr(self, name, value)
        self.args = (self._compose(),)
        return self

    def __reduce__(self):  # keep the location fields across process boundaries
        return (_rebuild, (type(self), self.reason, self.file, self.variable, self.fragment))


def _rebuild(cls, reason, file, variable, fragment):
    return cls(reason, file=file, variable=variable, fragment=fragment)


class CFAFormatError(CFAError, ValueError):
    """The aggregation file breaks its dialect's rules (bad map, unknown dimension...)."""


class VariableNotFoundError(CFAError, KeyError):
    """A requested variable or group does not exist (or is ambiguous) in an aggregation file.

    A :class:`KeyError` (and so a :class:`LookupError`), as ``dataset[name]`` raises."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return self.args[0]


class FragmentError(CFAError):
    """A fragment could not be used."""


class MissingFragmentError(FragmentError, FileNotFoundError):
    """None of a fragment's URIs exists."""


class FragmentReadError(FragmentError, OSError):
    """A fragment exists but cannot be read (not netCDF, truncated, variable absent...)."""


class FragmentShapeError(FragmentError, ValueError):
    """A fragment's shape or dimensions do not match its place in the aggregation."""


class UnitsError(FragmentError, ValueError):
    """A fragment's units cannot be converted to the aggregated variable's units."""


class StorageError(CFAError, OSError):
    """A storage backend failed (access denied, unreachable endpoint...)."""


class NotFoundError(StorageError, FileNotFoundError):
    """An aggregation file (or other requested object) does not exist."""


class VersionNotFoundError(NotFoundError):
    """A version asked for is not in the dataset's history (unknown, or pruned)."""


class UnsafeURIError(CFAError, PermissionError):
    """A URI is outside the locations the reader is allowed to open."""


class BudgetError(CFAError, MemoryError):
    """A fragment cannot be held within the worker's memory or file-handle budget."""


class AggregationError(CFAError, ValueError):
    """Files cannot be aggregated together (different variables, coordinates or units; gaps, overlaps)."""


class WriteConflictError(CFAError, RuntimeError):
    """Another writer holds (or took over) the target's lease, or changed the target meanwhile."""


class ConfigError(CFAError, ValueError):
    """A dask config value under ``daskcfa.`` is not valid (checked when an operation starts)."""


class ArgumentError(CFAError, ValueError, TypeError):
    """An argument names what the data does not have (a dimension, a variable, a group) or is malformed.

    Also a :class:`ValueError` and a :class:`TypeError`, which such errors were before."""


class ReferencesError(CFAError, ValueError):
    """An aggregated variable cannot be presented exactly as a Zarr array of byte-range references
    (fragments stored unlike one another, or off one regular chunk grid): see
    :func:`daskcfa.to_references`."""


class TargetExistsError(CFAError, FileExistsError):
    """A write's target exists and the mode says not to replace it (``mode="w-"``, ``clobber=False``).

    Also a :class:`FileExistsError`, which such errors were before."""


class IndexingError(CFAError, IndexError):
    """An index that does not fit the array (out of bounds, too many indices, an unsupported kind).

    Also an :class:`IndexError`, as numpy and netCDF4-python raise."""


class ClosedError(CFAError, RuntimeError):
    """A read through a dataset that was closed (netCDF4-python raises a :class:`RuntimeError`)."""


class CFAWarning(UserWarning):
    """Something in an aggregation file was ignored or repaired while reading."""
