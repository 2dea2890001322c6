"""The ``daskcfa`` command line: a thin shell over the archive operations.

Every subcommand parses its arguments, calls one function of the API
(:mod:`daskcfa.archive`, or :func:`daskcfa.index`) and prints what it
returns; nothing else happens here but choosing the dask scheduler and
showing progress. argparse (the
standard library) rather than click: the interface is a handful of
subcommands with plain options, which argparse covers without adding a
dependency to every installation.

Exit status: 0 on success, 1 when an operation fails or ``verify`` finds
problems, 2 for usage errors. Errors are one line on stderr (``--debug``
shows the traceback); credentials given with ``--storage-options`` are
never printed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import sys
import traceback
import warnings
from typing import Any, Callable, Iterator, Sequence

from .errors import printable

__all__ = ["main", "build_parser"]

PROG = "daskcfa"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the command's own parser: its usage, not the top level's
        getattr(args, "parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.command == "relocate" and not args.map and args.uris != "absolute":
        parser.exit(2, f"{PROG} relocate: error: --map OLD=NEW is required (unless --uris absolute)\n")
    try:
        with warnings.catch_warnings(), _scheduler(args.scheduler), _progress(args):
            warnings.showwarning = _one_line_warning
            return args.run(args)
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`daskcfa info ... | head`): stop quietly
        _silence_stdout()
        return 141  # (128 + SIGPIPE, as a command the signal ended)
    except Exception as exc:  # every failure ends as one line (or a traceback with --debug)
        if args.debug:
            traceback.print_exc()
        print(f"{PROG} {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 1


# --------------------------------------------------------------------------
# The subcommands: each one call to the API, then printing
# --------------------------------------------------------------------------


def _info(args: argparse.Namespace) -> int:
    from .archive.info import describe, plot_layout

    summary = describe(args.url, storage_options=args.storage_options, storage_size=args.storage_size)
    _print(_as_json(summary) if args.json else str(summary))
    if args.plot:
        plot_layout(args.url, args.plot, variable=args.variable, dims=args.dims,
                    storage_options=args.storage_options)
        print(f"fragment layout drawn in {args.plot}", file=sys.stderr)
    return 0


def _split(args: argparse.Namespace) -> int:
    from .archive.refragment import plan_refragment, refragment

    source = args.sources[0] if len(args.sources) == 1 else list(args.sources)
    options = dict(variables=args.variables, fragment_shape=args.fragment_shape,
                   max_fragment_size=args.max_fragment_size, max_mem=args.max_mem, format=args.format,
                   fragment_format=args.fragment_format, compression=args.compression,
                   storage_options=args.storage_options)
    if args.plan_only:
        _print(str(plan_refragment(source, **options)))
        return 0
    delayed = refragment(source, args.target, mode=args.mode, compute=False, uris=args.uris, **options)
    _print(_compute(delayed))
    return 0


def _aggregate(args: argparse.Namespace) -> int:
    from .archive.aggregate import aggregate

    _print(aggregate(list(args.sources), args.target, concat_dims=args.concat_dims, variables=args.variables,
                     format=args.format, uris=args.uris, storage_options=args.storage_options,
                     mode=args.mode))
    return 0


def _rebuild(args: argparse.Namespace) -> int:
    from .archive.aggregate import rebuild

    fragments = args.fragments[0] if len(args.fragments) == 1 else list(args.fragments)
    _print(rebuild(fragments, args.target, format=args.format, uris=args.uris, storage_options=args.storage_options,
                   mode=args.mode))
    return 0


def _verify(args: argparse.Namespace) -> int:
    from .archive.verify import record_fixity, verify, verify_fixity

    if args.record:
        _print(record_fixity(args.url, storage_options=args.storage_options))
        return 0
    if args.fixity:
        report = _compute(verify_fixity(args.url, variables=args.variables, storage_options=args.storage_options,
                                        compute=False))
    else:
        report = _compute(verify(args.url, deep=args.deep, variables=args.variables,
                                 storage_options=args.storage_options, compute=False))
    _print(_as_json(report, ok=report.ok) if args.json else str(report))
    return 0 if report.ok else 1


def _relocate(args: argparse.Namespace) -> int:
    from .archive.relocate import relocate

    _print(relocate(args.url, dict(args.map or ()), target=args.target, format=args.format, mode=args.mode,
                    storage_options=args.storage_options, uris=args.uris))
    return 0


def _log(args: argparse.Namespace) -> int:
    from .archive.versions import history

    versions = history(args.url, storage_options=args.storage_options)
    if args.json:
        _print(json.dumps([v.as_json() for v in versions], indent=1))
    elif not versions:
        _print(f"no versions recorded for {_flat(args.url)}: written before daskcfa recorded versions, or by "
               "another tool (the next write records it)")
    else:
        for v in versions:  # (records are hostile input: their text shown escaped, never as terminal controls)
            arguments = " ".join(f"{printable(k)}={json.dumps(value)}" for k, value in v.arguments.items())
            _print(f"{v.id}  {v.time.isoformat(timespec='seconds').replace('+00:00', 'Z')}  {printable(v.operation)}"
                   f"{'  ' + arguments if arguments else ''}")
    return 0


def _rollback(args: argparse.Namespace) -> int:
    from .archive.versions import rollback

    _print(rollback(args.url, args.version, storage_options=args.storage_options).id)
    return 0


def _prune(args: argparse.Namespace) -> int:
    from .archive.versions import prune

    dropped = prune(args.url, keep=args.keep, storage_options=args.storage_options)
    _print(f"dropped {len(dropped)} versions" + "".join(f"\n{i}" for i in dropped))
    return 0


def _references(args: argparse.Namespace) -> int:
    from .archive.references import to_references

    written = to_references(args.url, args.variables, output=args.output, format=args.format,
                            storage_options=args.storage_options, mode=args.mode, inline=args.inline)
    _print(written if args.output else json.dumps(written))
    return 0


def _icechunk(args: argparse.Namespace) -> int:
    from .archive.icechunk_export import to_icechunk

    _print(to_icechunk(args.url, args.repo, args.variables, branch=args.branch, message=args.message,
                       fallback=args.fallback, storage_options=args.storage_options, versions=args.versions))
    return 0


def _index(args: argparse.Namespace) -> int:
    from .index_writer import index

    _print(str(index(args.url, args.variables, storage_options=args.storage_options)))
    return 0


# --------------------------------------------------------------------------
# The parser
# --------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .choices import (DEFAULT_FRAGMENT_FORMAT, FRAGMENT_FORMATS, ICECHUNK_FALLBACKS, MAX_FRAGMENT_SIZE, MAX_MEM,
                          REFERENCE_FORMATS, WRITE_FORMATS)

    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("common options")
    group.add_argument("--scheduler", metavar="ADDRESS",
                       help="a running dask.distributed scheduler (tcp://host:8786), or a local scheduler: "
                            "threads (default), processes, synchronous")
    group.add_argument("--storage-options", metavar="JSON", type=_storage_options,
                       help="fsspec/s3fs options as JSON, or @FILE.json (keeps secrets out of the process "
                            "list); flat, or keyed by protocol")
    group.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                       help="show a progress bar on stderr (default: when stderr is a terminal)")
    group.add_argument("--debug", action="store_true", help="show the traceback of an error")

    parser = argparse.ArgumentParser(
        prog=PROG, description="Build, re-fragment, check and move CFA-netCDF aggregated datasets.",
        epilog=f"'{PROG} COMMAND --help' describes each command.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.set_defaults(command=None)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    def command(name: str, run: Callable[[argparse.Namespace], int], help: str, description: str,
                aliases: Sequence[str] = ()):
        sub = commands.add_parser(name, parents=[common], help=help, description=description, aliases=aliases)
        sub.set_defaults(command=name, run=run, parser=sub)
        return sub

    formats = ", ".join(WRITE_FORMATS)

    info = command("info", _info, "describe an aggregation: variables, fragment grids, sizes, locations",
                   "Describe an aggregation file: its variables, shapes, dtypes, fragment grids, total size, "
                   "dialect and where the fragments live. Only the aggregation file is read (unless "
                   "--storage-size).")
    info.add_argument("url", metavar="URL", help="the aggregation file (path or URL)")
    info.add_argument("--storage-size", action="store_true",
                      help="also ask storage for the size of every fragment file")
    info.add_argument("--json", action="store_true", help="print the summary as JSON")
    info.add_argument("--plot", metavar="OUT.png", help="draw the fragment layout of a variable (needs matplotlib)")
    info.add_argument("--variable", metavar="NAME", help="the variable to plot (default: the only one)")
    info.add_argument("--dims", metavar="DIM,DIM", type=_names,
                      help="the two dimensions to plot (default: the two cut into the most fragments)")

    split = command("split", _split, "re-fragment files or an aggregation into a new aggregation",
                    "Re-fragment one or many netCDF files (or a glob), or an aggregation, into a new CFA "
                    "dataset with a new fragment layout, in parallel, keeping every task under --max-mem. "
                    f"'{PROG} refragment' is the same command, named as the API's daskcfa.refragment.",
                    aliases=["refragment"])
    split.add_argument("sources", metavar="SOURCE", nargs="+",
                       help="an aggregation file, netCDF files or a glob (quote it)")
    split.add_argument("target", metavar="TARGET", help="the new aggregation file")
    split.add_argument("--fragment-shape", metavar="SHAPE", type=_fragment_shape,
                       help="target fragment shape: DIM=N,... (e.g. time=1000,lat=45) or N,N,...")
    split.add_argument("--max-fragment-size", default=MAX_FRAGMENT_SIZE, metavar="SIZE",
                       help="largest fragment when --fragment-shape is not given (default: %(default)s)")
    split.add_argument("--max-mem", default=MAX_MEM, metavar="SIZE",
                       help="memory budget of every task (default: %(default)s)")
    split.add_argument("--plan-only", action="store_true",
                       help="print the plan (stages, tasks, memory, read amplification) and write nothing")
    _variables_option(split)
    _format_option(split, formats)
    split.add_argument("--fragment-format", default=DEFAULT_FRAGMENT_FORMAT, choices=FRAGMENT_FORMATS,
                       help="netCDF format of the new fragments (default: %(default)s)")
    split.add_argument("--compression", type=_compression, metavar="zlib|JSON",
                       help='compression of the new fragments (default: as the source\'s): none, a name (zlib) or '
                            'JSON createVariable keywords ({"zlib": true, "complevel": 1})')
    _uris_option(split)
    _mode_option(split)

    aggregate = command("aggregate", _aggregate, "build an aggregation over existing netCDF files (no copying)",
                        "Build an aggregation file over existing netCDF files without copying data: the "
                        "concatenation dimensions and order come from the coordinate values, and the files "
                        "are checked for consistency.")
    aggregate.add_argument("sources", metavar="SOURCE", nargs="+", help="netCDF files, a directory or a glob")
    aggregate.add_argument("target", metavar="TARGET", help="the aggregation file to write")
    aggregate.add_argument("--concat-dims", metavar="DIM,DIM", type=_names,
                           help="the dimensions to concatenate along (default: inferred)")
    _uris_option(aggregate)
    _variables_option(aggregate)
    _format_option(aggregate, formats)
    _mode_option(aggregate)

    rebuild = command("rebuild", _rebuild, "reconstruct a lost aggregation file from its fragments",
                      "Reconstruct an aggregation file from self-describing fragments: a directory, a glob, "
                      "an S3 prefix or a list of files.")
    rebuild.add_argument("fragments", metavar="FRAGMENTS", nargs="+", help="a directory, glob, prefix or files")
    rebuild.add_argument("target", metavar="TARGET", help="the aggregation file to write")
    _format_option(rebuild, formats)
    _uris_option(rebuild)
    _mode_option(rebuild)

    verify = command("verify", _verify, "check every fragment exists, opens and fits (--deep: reads all data)",
                     "Check that every fragment exists, is readable and matches its expected variable, shape, "
                     "dtype and units; --deep also reads all data. Lists every problem; exit status 1 when "
                     "there are any.")
    verify.add_argument("url", metavar="URL", help="the aggregation file (path or URL)")
    how = verify.add_mutually_exclusive_group()
    how.add_argument("--deep", action="store_true", help="also read all data (finds corrupt chunks)")
    how.add_argument("--fixity", action="store_true",
                     help="instead, check every stored object against the checksum recorded when it was written "
                          "(finds changed, truncated, missing and extra objects)")
    how.add_argument("--record", action="store_true",
                     help="record checksums of the fragments (of an archive daskcfa did not write) beside the "
                          "aggregation file, for later --fixity checks")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    _variables_option(verify)

    references = command("references", _references, "export an aggregation as an fsspec reference set",
                         "Write an fsspec reference set (kerchunk's format) presenting every aggregated variable "
                         "as a Zarr array whose chunks are its fragments' own HDF5 chunks, with the aggregation "
                         "file's coordinates and attributes: any Zarr reader opens it without daskcfa. Only "
                         "fragment metadata is read. Refused, naming the fragments, where the fragments do not "
                         "fit one regular chunk grid with one encoding.")
    references.add_argument("url", metavar="URL", help="the aggregation file (path or URL)")
    references.add_argument("-o", "--output", metavar="OUT",
                            help="where to write the references (default: JSON on stdout); OUT.parq: Parquet")
    references.add_argument("--format", choices=REFERENCE_FORMATS,
                            help="json (version 1, with templates) or parquet (default: from OUT's suffix)")
    references.add_argument("--no-inline", dest="inline", action="store_false",
                            help="coordinates by reference to the aggregation file's bytes too, not inline "
                                 "(for tools that ingest references only: VirtualiZarr, Icechunk)")
    _variables_option(references)
    _mode_option(references)

    icechunk = command("icechunk", _icechunk, "export an aggregation into an Icechunk repository (virtual chunks)",
                       "Write every aggregated variable into the Icechunk repository REPO (a local directory, "
                       "created if absent) as virtual chunk references to its fragments' own chunks, with the "
                       "aggregation file's coordinates and attributes as data, and commit: xarray.open_zarr "
                       "reads it without daskcfa. A variable references cannot present exactly is refused, "
                       "naming why, or with --fallback copy written as data. Prints the snapshot id. Needs "
                       "the icechunk extra (pip install 'daskcfa[icechunk]').")
    icechunk.add_argument("url", metavar="URL", help="the aggregation file (path or URL)")
    icechunk.add_argument("repo", metavar="REPO", help="the Icechunk repository (a local directory)")
    icechunk.add_argument("--branch", default="main", help="the branch to commit to (default: main)")
    icechunk.add_argument("--message", help="the commit message (default: names the source)")
    icechunk.add_argument("--fallback", choices=ICECHUNK_FALLBACKS, default=ICECHUNK_FALLBACKS[0],
                          help="a variable that cannot be presented by reference: raise (default) or copy its "
                               "values into the repository")
    icechunk.add_argument("--versions", action="store_true",
                          help="one commit per kept version of the dataset (daskcfa log), oldest first")
    _variables_option(icechunk)

    index = command("index", _index, "write the chunk index that lets reads skip HDF5 metadata",
                    "Write, beside the aggregation file t.nc, its chunk index .t.nc.chunks.json: every "
                    "fragment's size and version and where each of its HDF5 chunks lies, with which filters. "
                    "Reads (daskcfa.from_cfa, open_cfa) then fetch the chunks by byte range with no HDF5 "
                    "metadata; a fragment changed since is read without it, with a warning. Fragments the "
                    "direct readers cannot locate are left out (listed in a warning).")
    index.add_argument("url", metavar="URL", help="the aggregation file (path or URL)")
    _variables_option(index)

    relocate = command("relocate", _relocate, "rewrite fragment URIs after an archive moved",
                       "Rewrite the fragment URIs of an aggregation file by prefix (disk to S3, bucket rename), "
                       "without touching the fragments; in place, or to --target.")
    relocate.add_argument("url", metavar="URL", help="the aggregation file (path or URL)")
    relocate.add_argument("--map", metavar="OLD=NEW", type=_mapping, action="append",
                          help="replace the URI prefix OLD by NEW (repeat for several; may be left out with "
                               "--uris absolute)")
    relocate.add_argument("--target", metavar="URL", help="write the relocated file here instead of in place")
    relocate.add_argument("--format", choices=WRITE_FORMATS,
                          help="convert to this dialect (default: keep the file's own)")
    _uris_option(relocate)
    _mode_option(relocate)

    log = command("log", _log, "list the versions of an aggregation, newest first",
                  "List the versions of an aggregation (every committed write records one): id, time (UTC), "
                  "operation and arguments, newest first.")
    log.add_argument("url", metavar="URL", help="the aggregation file (path or URL)")
    log.add_argument("--json", action="store_true", help="print the version records as JSON")
    rollback = command("rollback", _rollback, "make an earlier version current again",
                       "Make an earlier version of an aggregation current again, as a new version; prints its id.")
    rollback.add_argument("url", metavar="URL", help="the aggregation file (path or URL)")
    rollback.add_argument("version", metavar="VERSION",
                          help="a version id (see 'daskcfa log'), or a time (ISO 8601, UTC unless it says): the "
                               "version current then")
    prune = command("prune", _prune, "drop old versions and the fragments only they use",
                    "Keep the newest versions of an aggregation, drop the others and delete the fragments only "
                    "they referenced (of the dataset's own generations only).")
    prune.add_argument("url", metavar="URL", help="the aggregation file (path or URL)")
    prune.add_argument("--keep", metavar="N", type=int,
                       help="versions to keep (default: dask config daskcfa.write.keep-versions; 0 or 1: the "
                            "current one only)")
    return parser


def _variables_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variables", metavar="NAME,NAME", type=_names, help="only these variables")


def _format_option(parser: argparse.ArgumentParser, formats: str) -> None:
    from .choices import DEFAULT_FORMAT

    parser.add_argument("--format", default=DEFAULT_FORMAT, metavar="DIALECT",
                        help=f"aggregation dialect: {formats} (default: %(default)s)")


def _uris_option(parser: argparse.ArgumentParser) -> None:
    from .choices import DEFAULT_URIS, URI_STYLES

    parser.add_argument("--uris", choices=URI_STYLES, default=DEFAULT_URIS,
                        help="fragment URIs relative to the aggregation file (default) or absolute, for tools that "
                             "resolve relative ones against their working directory (cfdm, CFAPyX, S3netCDF4)")


def _mode_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--overwrite", dest="mode", action="store_const", const="w", default="w-",
                        help="overwrite an existing target (default: refuse)")


# --------------------------------------------------------------------------
# Argument types
# --------------------------------------------------------------------------


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected comma-separated names")
    return names


def _fragment_shape(text: str) -> dict[str, int] | list[int]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        if parts and all("=" in p for p in parts):
            return {k.strip(): int(v) for k, v in (p.split("=", 1) for p in parts)}
        if parts and not any("=" in p for p in parts):
            return [int(p) for p in parts]
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected DIM=N,... or N,N,..., not {text!r}")


def _compression(text: str) -> Any:
    if text.strip().startswith("{"):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    return "none" if text.lower() == "none" else text


def _mapping(text: str) -> tuple[str, str]:
    old, sep, new = text.partition("=")
    if not sep or not old or not new:
        raise argparse.ArgumentTypeError("expected OLD=NEW")
    return old, new


def _storage_options(text: str) -> dict[str, Any]:
    """JSON, or @FILE holding JSON. Messages never quote the text (it may hold secrets)."""
    if text.startswith("@"):
        try:
            with open(os.path.expanduser(text[1:])) as fh:
                text = fh.read()
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"cannot read {text[1:]!r}: {exc.strerror}") from None
    try:
        options = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") \
            from None
    if not isinstance(options, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return options


# --------------------------------------------------------------------------
# Scheduler, progress and printing
# --------------------------------------------------------------------------

_LOCAL_SCHEDULERS = {"threads", "threading", "processes", "multiprocessing", "synchronous", "sync", "single-threaded"}


@contextlib.contextmanager
def _scheduler(address: str | None) -> Iterator[None]:
    """A distributed client on ``address`` (the default scheduler while it lives), or a local scheduler."""
    import dask

    if address is None:
        yield
        return
    if address in _LOCAL_SCHEDULERS:
        with dask.config.set(scheduler=address):
            yield
        return
    from distributed import Client

    client = Client(address, timeout="30s")
    try:
        yield
    finally:
        client.close()


@contextlib.contextmanager
def _progress(args: argparse.Namespace) -> Iterator[None]:
    """Progress bars on stderr for every dask computation the command runs.

    Locally, dask's diagnostics callbacks. On a cluster, each computation is
    submitted through a scheduler function that shows
    :func:`distributed.progress` before gathering the results. Unless asked
    for with ``--progress``, bars appear only on a terminal and only for
    computations lasting over a second. Where stderr is not a terminal (a
    batch job's log), a line every few percent replaces the bar
    (:mod:`daskcfa.progress`).
    """
    terminal = sys.stderr.isatty()
    show = args.progress if args.progress is not None else terminal
    if not show:
        yield
        return
    delay = 0.0 if args.progress else 1.0
    import dask

    client = None
    if "distributed" in sys.modules:  # (otherwise no client can exist: distributed stays unimported)
        from distributed import default_client

        try:
            client = default_client()
        except ValueError:
            pass
    if client is None:
        from dask.diagnostics import ProgressBar

        from .progress import LineProgress

        with ProgressBar(minimum=delay, out=sys.stderr) if terminal else LineProgress(sys.stderr, minimum=delay):
            yield
        return

    def get(dsk: Any, keys: Any, **kwargs: Any) -> Any:
        from distributed import progress, wait
        from distributed.client import futures_of

        futures = client.get(dsk, keys, sync=False, **kwargs)
        pending = futures_of(futures)
        try:
            wait(pending, timeout=delay or 0.001)  # quick computations go without a bar
        except TimeoutError:
            if not terminal:
                from .progress import cluster_line_progress

                cluster_line_progress(pending, sys.stderr)
            else:
                with contextlib.redirect_stdout(sys.stderr):  # (distributed's bar writes to stdout)
                    progress(pending)
                print(file=sys.stderr)
        return client.gather(futures)

    with dask.config.set(scheduler=get):
        yield


def _compute(delayed: Any) -> Any:
    """Compute a delayed result of the API with the current scheduler (and progress bar)."""
    import dask

    (result,) = dask.compute(delayed)
    return result


def _print(text: Any) -> None:
    """Print a result line by line, every character a terminal would act on escaped (names, URIs and
    attributes come from the files read: hostile input)."""
    print(printable(str(text)), flush=True)


def _as_json(obj: Any, **extra: Any) -> str:
    data = {**dataclasses.asdict(obj), **extra}
    return json.dumps(data, indent=1, default=_json_default)


def _json_default(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.dtype):
        return value.str if value.names else str(value)
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def _one_line(exc: BaseException) -> str:
    """The error as one line: its message, prefixed by its type where the message alone is cryptic,
    with the API's argument names replaced by the command line's options."""
    from .errors import CFAError

    text = str(exc) or type(exc).__name__
    if not isinstance(exc, (CFAError, OSError, ValueError, ImportError)):
        text = f"{type(exc).__name__}: {text}"
    for api, option in _CLI_WORDING:
        text = api.sub(option, text)
    return _flat(text)


#: What the API's messages say -> what the command line's user types instead.
_CLI_WORDING = [(re.compile(pattern), option) for pattern, option in (
    (r"(?:use |relocate with )mode='w' to overwrite it(?: or mode='r\+' to update it)?",
     "use --overwrite to overwrite it"),
    (r"\bfragment_shape\b", "--fragment-shape"),
    (r"\bmax_fragment_size\b", "--max-fragment-size"),
    (r"\bmax_mem=", "--max-mem "),
    (r"\bconcat_dims=?", "--concat-dims"),
    (r"\bvariables=", "--variables "),
    (r"\bdims=", "--dims "),
    (r"\bdims names\b", "--dims names"),
    (r"allowed_locations=\[\.\.\.\] or dask config", "dask config"),
    (r"\bstorage_options\b", "--storage-options"),
)]


def _flat(text: str) -> str:
    from .errors import redact

    return printable(redact(" ".join(text.split())))


def _one_line_warning(message: Any, category: type, filename: str, lineno: int, file: Any = None,
                      line: str | None = None) -> None:
    print(f"{PROG}: warning: {_flat(str(message))}", file=sys.stderr)
