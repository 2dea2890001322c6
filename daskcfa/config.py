"""daskcfa's dask configuration: defaults, schema, registration and checks.

``daskcfa.yaml`` (beside this module) holds the defaults of every
``daskcfa.*`` key, registered with :func:`dask.config.update_defaults` when
daskcfa is imported, as distributed registers its own: so
``dask.config.get("daskcfa")`` shows them, and a user's files in
``~/.config/dask/`` and ``DASK_DASKCFA__...`` variables override them.
``daskcfa-schema.yaml`` describes every key in the JSON Schema vocabulary of
dask's ``dask-schema.yaml``.

:func:`check` validates the current configuration against the schema, when
an operation starts (opening, writing, re-fragmenting...), so that mistakes
surface there and not inside a task at compute time: a key under
``daskcfa.`` that the schema does not know is a :class:`~daskcfa.CFAWarning`
naming the nearest valid key; a value of the wrong type or outside its
choices, NaN, or outside its range, is a :class:`~daskcfa.errors.ConfigError`
naming the key and the values it takes. Only the subset of JSON
Schema the schema file uses is implemented (``type``, ``enum``, ``minimum``,
``maximum``, ``items``, ``properties``, ``additionalProperties``), plus ``format: bytes``
for sizes (an integer, or a string :func:`dask.utils.parse_bytes` reads) and
``format: size`` for sizes that also take S3netCDF4's units (``"2 YB"``).
"""

from __future__ import annotations

import difflib
import math
import os
import re
import sys
import threading
import warnings
from typing import Any, Iterator, Mapping

import dask.config
import yaml

from .errors import ArgumentError, CFAWarning, ConfigError

__all__ = ["DEFAULTS", "SCHEMA", "register", "check", "keys", "size", "number", "maximum", "parse_size", "to_bytes"]

_HERE = os.path.dirname(__file__)


#: libyaml's safe loader where PyYAML has it: the same documents, about 6x less CPU than the pure-Python
#: one (16 ms of every process's ``import daskcfa``: issue #31)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load(name: str) -> dict[str, Any]:
    with open(os.path.join(_HERE, name)) as fh:
        return yaml.load(fh, Loader=_LOADER)


#: The defaults, as in ``daskcfa.yaml``.
DEFAULTS: dict[str, Any] = _load("daskcfa.yaml")
#: The schema of the ``daskcfa`` tree (``daskcfa-schema.yaml``'s ``properties.daskcfa``).
SCHEMA: dict[str, Any] = _load("daskcfa-schema.yaml")["properties"]["daskcfa"]


def register() -> None:
    """Add daskcfa's defaults to dask's (keeping values the user has already set)."""
    dask.config.update_defaults(DEFAULTS)


register()  # on import, as distributed registers its own (``import daskcfa`` imports this module)


def keys(schema: Mapping[str, Any] = SCHEMA, prefix: str = "daskcfa") -> Iterator[str]:
    """Every dotted key the schema knows (sections and leaves)."""
    for name, sub in schema.get("properties", {}).items():
        key = f"{prefix}.{name}"
        yield key
        yield from keys(sub, key)


_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,), "number": (int, float), "string": (str,), "boolean": (bool,), "array": (list, tuple),
    "object": (dict,), "null": (type(None),),
}

_checked_lock = threading.Lock()
_checked: str | None = None  #: repr of the last configuration found valid


def check() -> None:
    """Check ``dask.config.get("daskcfa")`` against the schema (see the module's description).

    Quick when nothing changed since the last check (the configuration's repr
    is compared); a warning is given once per unknown key and configuration.
    """
    global _checked
    tree = dask.config.get("daskcfa", {})
    snapshot = repr(tree)
    if snapshot == _checked:
        return
    unknown: list[str] = []
    _walk(tree, SCHEMA, "daskcfa", unknown)
    for key in unknown:
        warnings.warn(f"unknown dask config key {key!r} is ignored; {_hint(key)}", CFAWarning,
                      stacklevel=_caller_level())
    with _checked_lock:
        _checked = snapshot


def size(key: str, given: Any = None, argument: str = "") -> int:
    """The size (or count) setting ``key`` in bytes, checked against its schema: ``given`` (the value of the
    keyword ``argument`` that overrides it, an :class:`~daskcfa.ArgumentError` if bad) or the
    configured value (a :class:`~daskcfa.errors.ConfigError` if bad)."""
    schema = _schema_of(key)
    value = dask.config.get(key) if given is None else given
    try:
        _check_value(value, schema, key)
    except ConfigError as exc:
        if given is None:
            raise
        raise ArgumentError(f"{argument}: {exc.reason.replace(f'dask config {key!r}', 'the value')}") from None
    number = to_bytes(value, s3nc=schema.get("format") == "size") if isinstance(value, str) else value
    return int(number)


def number(key: str) -> float:
    """The number setting ``key``, checked against its schema (a :class:`~daskcfa.errors.ConfigError`
    naming it if bad): a value set after the dataset was opened was never checked."""
    value = dask.config.get(key)
    _check_value(value, _schema_of(key), key)
    return float(value)


def maximum(key: str) -> float:
    """The largest value the schema allows for the number setting ``key``."""
    return float(_bound(_schema_of(key), "maximum"))  # type: ignore[arg-type]


def _schema_of(key: str) -> Mapping[str, Any]:
    schema: Mapping[str, Any] = SCHEMA
    for part in key.split(".")[1:]:
        schema = schema["properties"][part]
    return schema


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside daskcfa (the user's call)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_HERE + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def _walk(value: Any, schema: Mapping[str, Any], key: str, unknown: list[str]) -> None:
    _check_value(value, schema, key)
    if not isinstance(value, dict):
        return
    known = schema.get("properties", {})
    extra = schema.get("additionalProperties", False if known else True)
    for name, sub in value.items():
        canonical = str(name).replace("_", "-")  # (dask treats the two spellings alike)
        if canonical in known:
            _walk(sub, known[canonical], f"{key}.{canonical}", unknown)
        elif isinstance(extra, Mapping):
            _walk(sub, extra, f"{key}.{name}", unknown)
        elif not extra:
            unknown.append(f"{key}.{name}")


def _hint(key: str) -> str:
    """The nearest valid key (compared without the common ``daskcfa.``), else the valid keys beside it."""
    valid = {k.split(".", 1)[1]: k for k in keys()}
    near = difflib.get_close_matches(key.split(".", 1)[1].replace("_", "-"), list(valid), n=1, cutoff=0.6)
    if near:
        return f"did you mean {valid[near[0]]!r}?"
    section = key.rsplit(".", 1)[0]
    siblings = [k for k in valid.values() if k.rsplit(".", 1)[0] == section]
    return f"valid keys: {', '.join(siblings or sorted(valid.values()))}"


def _check_value(value: Any, schema: Mapping[str, Any], key: str) -> None:
    types = schema.get("type")
    if "enum" in schema and value not in schema["enum"]:
        raise ConfigError(f"dask config {key!r} must be one of {', '.join(map(repr, schema['enum']))}, "
                          f"not {_shown(value, key)}")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        allowed = tuple(t for name in types for t in _TYPES[name])
        if not isinstance(value, allowed) or (isinstance(value, bool) and "boolean" not in types):
            raise ConfigError(f"dask config {key!r} must be {' or '.join(_describe(t) for t in types)}, "
                              f"not {_shown(value, key)}")
    number = value
    if schema.get("format") in ("bytes", "size") and isinstance(value, str):
        number = to_bytes(value, s3nc=schema["format"] == "size")
        if number is None:
            units = "'16MiB', '2GB'" + (" or S3netCDF4's '2 YB'" if schema["format"] == "size" else "")
            raise ConfigError(f"dask config {key!r} must be a size such as {units}, or an integer, "
                              f"not {_shown(value, key)}")
    if isinstance(number, (int, float)) and not isinstance(number, bool):
        _check_range(number, value, schema, key)
    if "items" in schema and isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_value(item, schema["items"], f"{key}[{i}]")


def _check_range(number: float, value: Any, schema: Mapping[str, Any], key: str) -> None:
    """NaN, infinities and numbers outside ``minimum``..``maximum`` are refused (a NaN compares
    false with everything: unchecked, a NaN lease would never expire)."""
    low, high = (_bound(schema, name) for name in ("minimum", "maximum"))
    finite = not isinstance(number, float) or math.isfinite(number)  # (an int too large for a float is finite)
    if finite and (low is None or number >= low) and (high is None or number <= high):
        return
    allowed = " and ".join(f"{word} {schema[name]}" for word, name in (("at least", "minimum"),
                                                                       ("at most", "maximum")) if name in schema)
    raise ConfigError(f"dask config {key!r} must be a finite number, {allowed}, not {_shown(value, key)}")


#: the sections whose values hold credentials (keys, secrets, tokens, passwords)
_SECRET_SECTIONS = ("daskcfa.storage.options", "daskcfa.storage.profiles")


def _shown(value: Any, key: str) -> str:
    """A refused value as an error shows it: in the sections holding credentials only its type (a
    careless ``"key=...,secret=..."`` string or a list of options would be echoed whole), elsewhere
    its repr, cut at 40 characters."""
    if key.split("[", 1)[0].startswith(_SECRET_SECTIONS):
        return f"a value of type {type(value).__name__}"
    text = repr(value)
    return text if len(text) <= 40 else text[:30] + "..."


def _bound(schema: Mapping[str, Any], name: str) -> float | None:
    """A schema's ``minimum`` or ``maximum``, which a size key may write as a size (``5GiB``)."""
    bound = schema.get(name)
    if isinstance(bound, str):
        return to_bytes(bound)
    return bound


def to_bytes(text: str, s3nc: bool = True) -> int | None:
    """Bytes in dask's units (``16MiB``), or also S3netCDF4's (``2 YB``) if ``s3nc``; None if neither
    (nor if the number overflows a float: ``parse_bytes("1e400")`` raises OverflowError).

    The one reading of a size string: the schema's ``bytes`` and ``size`` formats, and budgets."""
    from dask.utils import parse_bytes

    try:
        return parse_bytes(text)
    except OverflowError:
        return None
    except ValueError:
        if not s3nc:
            return None
    try:
        return parse_size(text)
    except ConfigError:
        return None


#: S3netCDF4's size suffixes: decimal units, up to yottabytes.
_SIZE_UNITS = {"": 1, "B": 1, **{f"{p}B": 1000 ** (i + 1) for i, p in enumerate("KMGTPEZY")}}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")


def parse_size(value: Any) -> int:
    """Bytes in an S3netCDF4 size: a number, or one suffixed ``B``, ``kB``, ``MB`` ... ``YB`` (decimal).

    Exact integer arithmetic (no float rounding), as S3netCDF4's configuration files mean them."""
    if isinstance(value, bool):
        raise ConfigError(f"{value!r} is not a size")
    if isinstance(value, int):
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    unit = match.group(2).upper() if match else None
    if unit not in _SIZE_UNITS:
        raise ConfigError(f"{value!r} is not a size (a number with B, kB, MB, GB, TB, PB, EB, ZB or YB)")
    number = match.group(1)
    whole, _, fraction = number.partition(".")
    return (int(whole or 0) * 10 ** len(fraction) + int(fraction or 0)) * _SIZE_UNITS[unit] // 10 ** len(fraction)


def _describe(name: str) -> str:
    return {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "true or false",
            "array": "a list", "object": "a mapping", "null": "null (None)"}[name]
