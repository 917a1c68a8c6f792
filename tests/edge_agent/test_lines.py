"""Line reading: growing batches, the TextHide minimum, TSV columns and header, BOM."""

from __future__ import annotations

import io

import pytest

from edge_agent.lines import InputError, LineReader, parse_label


def reader(text: bytes, **kw) -> LineReader:
    return LineReader(io.BytesIO(text), **kw)


def test_batches_grow_to_the_largest():
    sizes = [len(b.lines) for b in reader(b"x\n" * 200).batches(largest=64)]
    assert sizes == [16, 32, 64, 64, 24]


@pytest.mark.parametrize(("n", "sizes"), [(18, [18]), (21, [16, 5]), (50, [16, 34])])
def test_short_last_batch_joins_the_one_before(n, sizes):
    """TextHide mixes k = 4 lines of a batch: no batch may be shorter (except a short input)."""
    got = [len(b.lines) for b in reader(b"x\n" * n).batches(largest=32, minimum=4)]
    assert got == sizes and sum(got) == n


def test_error_stops_after_the_lines_before_it():
    batches = list(reader(b"a\n\nb\n\xff\nc\n").batches())
    assert len(batches) == 1
    b = batches[0]
    assert [ln.text for ln in b.lines] == ["a", "b"] and b.empty == [2]
    assert isinstance(b.error, InputError) and "line 4" in str(b.error)


def test_tsv_header_columns_bom_and_crlf():
    r = reader("\ufeffsentence\tlabel\r\ngood\t1\r\nbad\tneg\r\n".encode(), tsv=True)
    [b] = list(r.batches())
    assert [(ln.number, ln.text, ln.label) for ln in b.lines] == [(2, "good", 1), (3, "bad", "neg")]
    [b] = list(reader(b"label\t1\ngood\t0\n", tsv=True, header="no").batches())
    assert [ln.text for ln in b.lines] == ["label", "good"]
    [b] = list(reader(b"a\tb\t1\nc\t0\n", tsv=True).batches())
    assert b.lines[0].text_b == "b" and "2 columns where earlier lines have 3" in str(b.error)


def test_parse_label():
    assert parse_label(" 3 ", 1) == 3 and parse_label("positive", 1) == "positive"
    with pytest.raises(InputError, match="line 7: label"):
        parse_label("two words", 7)
