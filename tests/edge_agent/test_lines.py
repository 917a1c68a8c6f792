"""Line reading: growing batches, the TextHide minimum, TSV columns and header, BOM."""

from __future__ import annotations

import io
import os
import threading
import time

import pytest

from edge_agent.privatize.lines import IDLE, FdLines, InputError, LineReader, parse_label


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


def test_partial_batches_of_an_idle_pipe_join_until_they_can_be_mixed():
    """A pipe that goes idle after fewer than k lines (IDLE: a partial batch) must not end
    TextHide k = 4 with 'only 1 remain': the short batch waits for the lines after it."""
    stream = [b"a\n", IDLE, b"b\n", IDLE] + [b"x\n"] * 20 + [IDLE] + [b"y\n"] * 5
    got = [len(b.lines) for b in LineReader(iter(stream)).batches(largest=32, minimum=4)]
    assert got == [22, 5] and sum(got) == 27
    got = [len(b.lines) for b in LineReader(iter(stream)).batches(largest=32)]
    assert got == [1, 1, 20, 5]  # without a minimum each partial batch goes on at once


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
    with pytest.raises(InputError, match="line 7: the label column has 9 character"):
        parse_label("two words", 7)


def test_label_errors_never_echo_the_column():
    """Swapped columns put the user's text in the label column: the message describes it."""
    for raw in ["my zqxsecret diagnosis is bad", "zqxsecret!", "a" * 65 + "zqxsecret"]:
        with pytest.raises(InputError) as exc:
            parse_label(raw, 3)
        msg = str(exc.value)
        assert "zqxsecret" not in msg and "line 3: the label column has" in msg
        assert f"{len(raw)} character(s)" in msg and "neither an integer" in msg
    with pytest.raises(InputError, match="label column is empty"):
        parse_label("  ", 2)


@pytest.mark.parametrize("raw", ["2147483648", "-2147483648", "99999999999999999999999",
                                 "+" + "9" * 5000, "000000000002147483648"])
def test_integer_labels_are_int32(raw):
    """|label| < 2**31 (the wire contract's int32); out of range names the line, no crash
    (not even for 5,000 digits, which int() refuses in Python 3.11+)."""
    with pytest.raises(InputError, match="line 5: integer label .* out of range"):
        parse_label(raw, 5)


def test_integer_labels_at_the_bounds():
    assert parse_label("2147483647", 1) == 2**31 - 1
    assert parse_label("-2147483647", 1) == -(2**31 - 1)
    assert parse_label("0000000000007", 1) == 7


def test_out_of_range_label_ends_input_after_earlier_lines():
    [b] = list(reader(b"good\t1\nbad\t0\nfun\t99999999999999999999999\nx\t1\n",
                      tsv=True).batches())
    assert [ln.label for ln in b.lines] == [1, 0]
    assert isinstance(b.error, InputError) and "line 3" in str(b.error)


def test_fd_lines_joins_lines_across_reads():
    r, w = os.pipe()
    os.write(w, b"a\nbb\r\n" + b"x" * 100 + b"\n\nlast")
    os.close(w)
    src = FdLines(r)
    src.CHUNK = 3  # lines and CRLF split across reads
    assert list(src) == [b"a\n", b"bb\r\n", b"x" * 100 + b"\n", b"\n", b"last"]
    batches = list(LineReader(FdLines(os.open(__file__, os.O_RDONLY))).batches())
    with open(__file__, "rb") as f:
        lines = f.read().decode().splitlines()
    assert [ln.text for b in batches for ln in b.lines] == [x for x in lines if x.strip()]


def test_fd_lines_close_does_not_wait_for_a_blocked_read():
    """A worker blocked on a live pipe: close() returns at once; the descriptor is released
    by the reader when its read returns, and nothing is read after that."""
    r, w = os.pipe()
    src = FdLines(r, idle=None)  # a blocking read only (the idle poll: test below)
    got: list[bytes] = []
    t = threading.Thread(target=lambda: got.extend(src), daemon=True)
    os.write(w, b"one\n")
    t.start()
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    assert got == [b"one\n"]
    start = time.monotonic()
    src.close()
    assert time.monotonic() - start < 0.5
    os.fstat(r)  # still open: the blocked read holds it
    os.write(w, b"two\nthree\n")
    t.join(5)
    assert not t.is_alive() and got == [b"one\n", b"two\n", b"three\n"]
    with pytest.raises(OSError):
        os.write(w, b"more\n")  # the read end is closed: EPIPE
    os.close(w)


def wait_for(cond, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.005)
    return cond()


def test_an_idle_pipe_hands_on_a_partial_batch():
    """Lines from a pipe that then goes quiet come out as a short batch (the CLI's records
    follow within ~idle); without the idle poll they would wait for 16 lines or EOF."""
    r, w = os.pipe()
    sizes: list[int] = []
    lines = LineReader(FdLines(r, idle=0.02))
    t = threading.Thread(target=lambda: sizes.extend(len(b.lines) for b in lines.batches()),
                         daemon=True)
    t.start()
    os.write(w, b"one\ntwo\n")
    assert wait_for(lambda: sizes == [2])
    os.write(w, b"thr")  # half a line is not handed on
    time.sleep(0.1)
    os.write(w, b"ee\n")
    assert wait_for(lambda: sizes == [2, 1])
    os.close(w)
    t.join(5)
    assert sizes == [2, 1] and not t.is_alive()


def test_a_regular_file_is_read_in_full_batches(tmp_path):
    p = tmp_path / "in.txt"
    p.write_bytes(b"x\n" * 20)
    src = FdLines(os.open(p, os.O_RDONLY), idle=0.0)  # no idle poll on a regular file
    assert [len(b.lines) for b in LineReader(src).batches()] == [16, 4]
