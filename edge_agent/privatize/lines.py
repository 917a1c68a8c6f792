"""Reading input for ``edge-agent privatize``: one record per line, in growing batches.

Lines are read as bytes and decoded as strict UTF-8 one by one, so a bad line
is reported with its number and every line before it is still processed.
With ``tsv``: ``text<TAB>label`` or ``text_a<TAB>text_b<TAB>label`` (no
quoting, as in GLUE files); the number of columns is fixed by the first line.
Error messages name the line and describe what is wrong; they never repeat the
line's text.
"""

from __future__ import annotations

import os
import re
import select
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, cast

_INT = re.compile(r"^[+-]?\d+$")
_LABEL = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")  # shared.payload's short class name


class InputError(ValueError):
    """A line that cannot be read; the message names the line."""


@dataclass(frozen=True)
class Line:
    """One input record."""

    number: int  # 1-based line number in the input
    text: str
    text_b: str | None = None
    label: int | str | None = None


@dataclass
class Batch:
    """Lines read together; ``error`` ends the input after them."""

    lines: list[Line] = field(default_factory=list)
    empty: list[int] = field(default_factory=list)  # numbers of empty lines (skipped)
    nbytes: int = 0
    error: Exception | None = None  # raised after the lines before it are written


HEADER = Line(0, "")  # the TSV header line: not a record


LABEL_BOUND = 2**31  # integer labels travel as int32 (ARCHITECTURE.md "Payloads")


def parse_label(raw: str, number: int) -> int | str:
    """An integer label with |label| < 2**31, or a short class name (letters, digits,
    ``_.:-``, at most 64).

    Errors describe the column, never echo it: a TSV with swapped columns has the
    user's text where the label should be.
    """
    raw = raw.strip()
    if _INT.match(raw):
        digits = raw.lstrip("+-")
        # compare digit counts first: int() of a huge string is slow (and capped by Python)
        if len(digits.lstrip("0")) <= 10 and abs(int(raw)) < LABEL_BOUND:
            return int(raw)
        raise InputError(f"line {number}: integer label of {len(digits)} digit(s) is out of "
                         "range (labels are int32: |label| < 2**31)")
    if _LABEL.match(raw):
        return raw
    what = "is empty" if not raw else f"has {len(raw)} character(s)"
    raise InputError(f"line {number}: the label column {what}: neither an integer nor a short "
                     "class name (letters, digits, _.:-, at most 64); is the label the last "
                     "column?")


def batch_sizes(largest: int, first: int = 16) -> Iterator[int]:
    """16, 32, 64 ... up to ``largest``: the first record comes out fast, then big batches."""
    size = max(1, min(first, largest))
    while True:
        yield size
        size = min(size * 2, largest)


IDLE = b""  # yielded by FdLines when a pipe has been idle after some lines (never a line)
IDLE_SECONDS = 0.03  # a record should follow its line within about 100 ms; the search of one
# token on MiniLM takes tens of ms on a busy 2-core machine, so the idle wait is kept short


def _readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` has data (or EOF, or an error) within ``timeout`` seconds."""
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(timeout * 1000.0))
    except (OSError, ValueError, AttributeError):  # closed meanwhile, or no poll()
        return True


class FdLines:
    """Lines (bytes, ending in ``\\n`` but perhaps the last) read with ``os.read`` from a
    file descriptor, for a worker thread that may stay blocked on a live pipe.

    Unlike ``sys.stdin.buffer`` there is no buffered-reader lock for the interpreter to
    wait on at exit, and :meth:`close` never blocks: while a read is in progress the
    reading thread releases the descriptor when the read returns.

    From a pipe or a terminal (not a regular file), :data:`IDLE` is yielded when no data
    has come for ``idle`` seconds after a line: the reader then hands on a partial batch,
    so a streaming producer gets its records promptly.
    """

    CHUNK = 1 << 18

    def __init__(self, fd: int, owns: bool = True, idle: float | None = IDLE_SECONDS):
        self._fd = fd
        self._owns = owns
        self._lock = threading.Lock()  # held around each read
        self._closing = False
        self._released = False
        try:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
        except OSError:
            regular = False
        self._idle = None if regular else idle

    def fileno(self) -> int:
        return self._fd

    def __iter__(self) -> Iterator[bytes]:
        head: list[bytes] = []  # the start of a line that spans reads
        fresh = False  # a line was yielded since the last IDLE
        try:
            while True:
                idle = False
                with self._lock:  # the poll too: close() never frees the fd under it
                    if self._closing:
                        return
                    if fresh and self._idle is not None and not _readable(self._fd,
                                                                           self._idle):
                        idle = True
                    else:
                        data = os.read(self._fd, self.CHUNK)
                if idle:
                    fresh = False
                    yield IDLE
                    continue
                if not data:
                    break
                lines = data.split(b"\n")
                if len(lines) == 1:
                    head.append(data)
                    continue
                if head:
                    lines[0] = b"".join(head) + lines[0]
                rest = lines.pop()
                head = [rest] if rest else []
                for line in lines:
                    yield line + b"\n"
                fresh = True
            if head:
                yield b"".join(head)
        finally:
            with self._lock:
                self._release()

    def _release(self) -> None:  # with the lock held
        if self._owns and not self._released:
            self._released = True
            os.close(self._fd)

    def close(self) -> None:
        """Stop reading and release the descriptor (now, or when a read in progress ends)."""
        self._closing = True
        if self._lock.acquire(blocking=False):
            try:
                self._release()
            finally:
                self._lock.release()


class LineReader:
    """Batches of :class:`Line` from a binary stream."""

    def __init__(self, stream: BinaryIO, tsv: bool = False, header: str = "auto"):
        self.stream = stream
        self.tsv = tsv
        self.header = header
        self.columns: int | None = None
        self._number = 0
        self._first_label: int | str | None = None  # the label of line 1 when a record
        self._labels: set = set()  # labels of the other lines (the first 10,000 distinct)
        self._kinds: dict[str, int] = {}  # "integer" / "class name" -> first line with it
        self._kind_of_first: str | None = None

    def _note_label(self, number: int, label: int | str) -> None:
        kind = "class name" if isinstance(label, str) else "integer"
        if number == 1:
            self._first_label, self._kind_of_first = label, kind
            return
        self._kinds.setdefault(kind, number)
        if len(self._labels) < 10_000:
            self._labels.add(label)

    def _first_looks_like_header(self) -> bool:
        lab = self._first_label
        return (isinstance(lab, str) and not any(c.isdigit() for c in lab)
                and lab not in self._labels)

    def label_warnings(self) -> list[str]:
        """Warnings about the labels read so far: a first line that looks like a header
        (its last column has no digits and is no other line's label), labels of mixed
        kinds (integers and class names). They describe, never quote, the input."""
        out = []
        kinds = dict(self._kinds)
        if self._first_label is not None:
            if self._first_looks_like_header():
                out.append("line 1 looks like a header (its last column has no digits and is "
                           "not the label of any other line) but was privatized as a record: "
                           "use --header yes to skip it")
            else:
                kinds[cast(str, self._kind_of_first)] = 1
        if len(kinds) > 1:
            out.append(f"labels of mixed kinds: integers (first on line {kinds['integer']}) "
                       f"and class names (first on line {kinds['class name']}); a model "
                       "treats 1 and a name as different classes")
        return out

    def _parse(self, number: int, raw: bytes) -> Line | None:
        """A Line, None for an empty line, HEADER, or InputError."""
        raw = raw.rstrip(b"\n").rstrip(b"\r")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"line {number}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at "
                             f"byte {exc.start + 1}); convert the input to UTF-8") from None
        if number == 1:
            text = text.removeprefix("\ufeff")
        if not self.tsv:
            return Line(number, text) if text.strip() else None
        if not text.strip():
            return None
        cols = text.split("\t")
        if number == 1 and (self.header == "yes" or (
                self.header == "auto" and cols[-1].strip().lower() == "label")):
            return HEADER
        if len(cols) not in (2, 3):
            raise InputError(f"line {number}: expected text<TAB>label or "
                             f"text_a<TAB>text_b<TAB>label, found {len(cols)} column(s)")
        if self.columns is None:
            self.columns = len(cols)
        elif len(cols) != self.columns:
            raise InputError(f"line {number}: {len(cols)} columns where earlier lines have "
                             f"{self.columns}")
        label = parse_label(cols[-1], number)
        if not cols[0].strip() or (len(cols) == 3 and not cols[1].strip()):
            return None
        self._note_label(number, label)
        return Line(number, cols[0], cols[1] if len(cols) == 3 else None, label)

    def batches(self, largest: int = 256, minimum: int = 1) -> Iterator[Batch]:
        """Batches of growing size; a batch with fewer than ``minimum`` lines (TextHide
        mixes k lines of a batch) joins its neighbour: a short last one the one before it,
        a short partial one from an idle pipe the ones after it."""
        sizes = batch_sizes(max(largest, minimum), first=max(16, minimum))
        pending: Batch | None = None
        for batch in self._raw_batches(sizes):
            if pending is not None and min(len(pending.lines), len(batch.lines)) < minimum:
                pending.lines += batch.lines
                pending.empty += batch.empty
                pending.nbytes += batch.nbytes
                pending.error = batch.error
                continue
            if pending is not None:
                yield pending
            pending = batch
            if minimum <= 1:
                yield pending
                pending = None
        if pending is not None:
            yield pending

    def _raw_batches(self, sizes: Iterator[int]) -> Iterator[Batch]:
        size = next(sizes)
        batch = Batch()
        for raw in self.stream:
            if raw is IDLE or not raw:  # a pipe went idle: hand on what is complete
                if batch.lines:
                    yield batch
                    batch, size = Batch(), next(sizes)
                continue
            self._number += 1
            batch.nbytes += len(raw)
            try:
                line = self._parse(self._number, raw)
            except InputError as exc:
                batch.error = exc
                yield batch
                return
            if line is None:
                batch.empty.append(self._number)
            elif line is not HEADER:
                batch.lines.append(line)
            if len(batch.lines) >= size:
                yield batch
                batch, size = Batch(), next(sizes)
        if batch.lines or batch.empty or batch.nbytes:
            yield batch
