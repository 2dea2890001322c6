"""The read front door attacked as a hostile archive would (attack16b): fragment units and calendars
that cannot be what they say. Each must be a daskcfa error naming file, variable and fragment, never
values read as if they meant something else. Results reported in docs/reliability.md (attack16b)."""

from __future__ import annotations

import netCDF4
import numpy as np
import pytest

import daskcfa
from builders import Frag, build_cf113, build_cfa06
from remote_helpers import rewrite_uris

pytestmark = pytest.mark.usefixtures("other_cwd")

DAYS = "days since 2000-01-01"
VICTIM = (1,)


def _times(tmp_path, units: str, calendar, aggregation_calendar: str = "360_day"):
    """A time series of 3 fragments in ``DAYS`` and ``aggregation_calendar``, except the middle one
    (VICTIM), stored in ``units`` and ``calendar`` (values written unconverted)."""
    built = build_cf113(tmp_path, np.ma.MaskedArray(np.arange(40.0, 52.0)), ("time",), ((4, 5, 3),), units=DAYS,
                        frags={VICTIM: Frag(units=units, raw_units=True)})
    with netCDF4.Dataset(str(built.path), "a") as ds:
        ds[built.variable].calendar = aggregation_calendar
    for index, path in built.fragment_files.items():
        with netCDF4.Dataset(str(path), "a") as ds:
            ds[built.variable].calendar = calendar if index == VICTIM else aggregation_calendar
    return built


def _refused(built, match: str) -> None:
    x = daskcfa.from_cfa(str(built.path), built.variable)
    with pytest.raises(daskcfa.UnitsError, match=match) as info:
        x.compute()
    assert info.value.fragment == VICTIM and info.value.variable == f"/{built.variable}"
    assert info.value.file == str(built.fragment_files[VICTIM])


@pytest.mark.parametrize("calendar", ["noleap", "all_leap", "julian"])
def test_fragment_in_another_calendar_is_refused(tmp_path, calendar):
    """The same units text in another calendar is another time axis (day 59 is 1 March in ``noleap``,
    30 February in ``360_day``); before, equal units text skipped the calendar and the values came back
    as if they were in the aggregation's calendar."""
    _refused(_times(tmp_path, DAYS, calendar), "cannot be converted")


@pytest.mark.parametrize("calendar", ["bogus_calendar", ""])
def test_fragment_in_an_unknown_calendar_is_refused(tmp_path, calendar):
    """Before: read as the aggregation's calendar when the units text was the same."""
    _refused(_times(tmp_path, DAYS, calendar), "unsupported calendar")


@pytest.mark.parametrize("units", ["days since 2000-13-45", "days since 2000-02-30", "hours since 1999-04-31 06:00"])
def test_fragment_reference_date_no_calendar_holds_is_refused(tmp_path, units):
    """UDUNITS takes month 13 or 30 February and converts from a date that cftime, netCDF4-python and
    xarray all refuse; before, the values came back converted from that non-date."""
    _refused(_times(tmp_path, units, "standard", aggregation_calendar="standard"), "cannot interpret units")


def test_reference_date_of_its_own_calendar_is_converted(tmp_path):
    """30 February exists in the 360-day calendar: the check uses the fragment's calendar."""
    built = _times(tmp_path, "days since 2000-02-30", "360_day")
    with netCDF4.Dataset(str(built.fragment_files[VICTIM]), "a") as ds:
        ds[built.variable][:] = np.arange(44.0, 49.0) - 59.0  # day 59 of 2000 in 360_day is 30 February
    got = daskcfa.from_cfa(str(built.path), built.variable).compute()
    np.testing.assert_array_equal(np.ma.getdata(got), np.arange(40.0, 52.0))


@pytest.mark.parametrize("calendar", [np.int32(5), np.array([1.5, 2.0])], ids=["integer", "array"])
def test_fragment_calendar_that_is_no_string_is_a_units_error(tmp_path, calendar):
    """Before: a FragmentReadError wrapping cf-units' TypeError ("cannot read the fragment")."""
    _refused(_times(tmp_path, "hours since 2000-01-01", calendar), "cannot interpret units")


# ---------------------------------------------------------------------------
# Terminal control sequences in what the command line prints
# ---------------------------------------------------------------------------
ESCAPES = ("\x1b", "\x07", "\u202e")


def test_command_line_shows_hostile_names_escaped(tmp_path):
    """Fragment URIs are the aggregation file's text: ``daskcfa info`` printed a planted directory
    name's escape sequences raw (the terminal cleared, colours, a right-to-left override) and so did
    ``verify`` and every one-line error naming such a fragment; now shown as Python escapes."""
    from test_cli import run

    built = build_cf113(tmp_path / "ds", np.ma.MaskedArray(np.arange(40.0, 52.0)), ("time",), ((4, 5, 3),))
    hostile = "x\x1b[2J\x1b]0;owned\x07\u202egnp"
    moved = built.path.parent / hostile
    moved.mkdir()
    kept, lost = built.fragment_files[(0,)], built.fragment_files[(1,)]
    kept.rename(moved / kept.name)
    lost.unlink()
    names = {built.fragment_uris[(0,)][0]: f"{hostile}/{kept.name}", built.fragment_uris[(1,)][0]: f"{hostile}/gone.nc"}
    rewrite_uris(built.path, built.names["uris"], lambda u: names.get(u, u))
    info, verify = run("info", built.path), run("verify", built.path)
    assert info.returncode == 0 and verify.returncode == 1, (info.stderr, verify.stderr)
    for proc in (info, verify):
        assert not any(c in proc.stdout + proc.stderr for c in ESCAPES), proc.stdout
    assert "x\\x1b[2J\\x1b]0;owned\\x07\\u202egnp" in info.stdout
    assert "\\x1b[2J" in verify.stdout and "gone.nc" in verify.stdout


# ---------------------------------------------------------------------------
# CFA-0.6 substitutions that multiply
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("pairs,copies", [(4, 30), (30, 2)])
def test_substitutions_that_multiply_are_refused_before_expanding(tmp_path, pairs, copies):
    """Each ``${Sn}: ${Sn+1}...`` pair is applied to the previous one's output: 4 pairs of 30 copies in a
    300-byte attribute make a 4-million-character URI, 30 pairs of 2 a billion (before: expanded, and a
    ``compute`` of 4 pairs of 40 ran for minutes; 8 pairs of 40 a bare MemoryError)."""
    built = build_cfa06(tmp_path, np.ma.MaskedArray(np.arange(12.0)), ("time",), ((4, 5, 3),))
    with netCDF4.Dataset(str(built.path), "a") as ds:
        var = ds[built.names["file"]]
        var.substitutions = " ".join(f"${{S{i}}}: " + f"${{S{i + 1}}}" * copies for i in range(pairs)) + \
            f" ${{S{pairs}}}: x"
        uris = np.asarray(var[...], dtype=object)
        uris[1] = "${S0}" + uris[1]
        var[...] = uris
    with pytest.raises(daskcfa.CFAFormatError, match="max-string-length") as info:
        daskcfa.from_cfa(str(built.path), built.variable)
    assert info.value.fragment == VICTIM and info.value.file == str(built.path)
