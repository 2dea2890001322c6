"""The dialect capability table (daskcfa.formats.capabilities) is true of the encoder and names every format."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from daskcfa.choices import WRITE_FORMATS
from daskcfa.errors import CFAFormatError
from daskcfa.formats.capabilities import CAPABILITIES, can, dialects_that, listed
from daskcfa.formats.encode import WRITABLE_DIALECTS, encode_aggregation
from daskcfa.model import AggregationDataset
from test_encode import aggregated, example


def test_the_table_describes_every_format_written():
    assert tuple(CAPABILITIES) == WRITE_FORMATS
    assert sorted(WRITABLE_DIALECTS.values()) == sorted(WRITE_FORMATS)
    assert not can("CFA-9", "missing_fragments")


def _encodes(dataset: AggregationDataset, fmt: str, refusal: str) -> bool:
    """Whether ``fmt`` encodes ``dataset`` (False when refused for saying ``refusal``; other errors raise)."""
    try:
        encode_aggregation(dataset, format=fmt)
    except CFAFormatError as exc:
        assert refusal in str(exc), exc
        return False
    return True


def _only(dataset: AggregationDataset, index: int) -> AggregationDataset:
    """One aggregated variable of ``dataset``, with its dimensions (fixed-size: no plain variable sizes them)."""
    return AggregationDataset(dimensions=[replace(d, unlimited=False) for d in dataset.dimensions],
                              aggregated=[dataset.aggregated[index]])


@pytest.mark.parametrize("fmt", WRITE_FORMATS)
def test_the_encoder_does_what_the_table_says(fmt):
    with_missing = example("CFA-0.4", "NETCDF4")
    assert _encodes(_only(with_missing, 0), fmt, "wholly missing fragment") == can(fmt, "missing_fragments")
    assert _encodes(_only(example("CFA-0.6.2", "NETCDF4"), 1), fmt, "alternative URIs need") == can(fmt,
                                                                                                "alternatives")
    values = np.ma.MaskedArray([280.0, 281.0])
    unique = AggregationDataset(dimensions=[d for d in with_missing.dimensions if d.name == "/lat"],
                                aggregated=[aggregated("/uv", ("lat",), [(1, 3)], None, None, unique_values=values)])
    assert _encodes(unique, fmt, "unique-valued fragments") == can(fmt, "unique_values")


def test_refusals_name_the_dialects_that_can():
    with_missing = example("CFA-0.4", "NETCDF4")
    with pytest.raises(CFAFormatError) as info:
        encode_aggregation(_only(with_missing, 0), format="CF-1.13")
    assert f"({listed(dialects_that('missing_fragments'))} can)" in str(info.value)
    assert listed(("a",)) == "a" and listed(("a", "b", "c")) == "a, b and c"
