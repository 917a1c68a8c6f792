"""Input and output files of ``edge-agent privatize``.

Input is read with ``os.read`` (:class:`edge_agent.lines.FdLines`), so a worker
thread blocked on stdin or a pipe never holds up the exit; ``-o`` naming the
input file (same device and inode) is refused before anything is written; output
is whole lines, flushed per batch.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from edge_agent.cli import CliError, UsageError
from edge_agent.lines import FdLines


def open_input(path: str):
    """(lines source with ``fileno`` and ``close``, size in bytes or None).

    Read with ``os.read`` (:class:`edge_agent.lines.FdLines`): the worker thread may
    stay blocked on stdin or a pipe after an error without holding up the exit."""
    if path == "-":
        try:
            return FdLines(sys.stdin.fileno(), owns=False), None
        except (AttributeError, OSError, ValueError):  # a stdin without a descriptor
            return sys.stdin.buffer, None
    p = Path(path)
    if not p.exists():
        raise CliError(f"{path}: no such file")
    if p.is_dir():
        raise CliError(f"{path}: is a directory, not a text file")
    fd = os.open(p, os.O_RDONLY)
    st = os.fstat(fd)
    return FdLines(fd), (st.st_size if stat.S_ISREG(st.st_mode) else None)


def refuse_output_on_input(stream, file: str, output: str | None) -> None:
    """UsageError when -o names the file being read (same device and inode): it would
    be truncated while it is read."""
    if output in (None, "-"):
        return
    try:
        st_in = os.fstat(stream.fileno())
        st_out = os.stat(output)
    except (OSError, ValueError, AttributeError):  # no such output yet, or no file number
        return
    if stat.S_ISREG(st_in.st_mode) and (st_in.st_dev, st_in.st_ino) == (st_out.st_dev,
                                                                         st_out.st_ino):
        what = "the input on stdin" if file == "-" else f"the input file {file}"
        raise UsageError(f"-o {output} is {what}: writing it would destroy the input; "
                         "choose another output file")


class Output:
    """Whole lines (UTF-8 bytes), flushed per batch; a file is created at its first line
    (or at the end)."""

    def __init__(self, path: str | None):
        self.path = None if path in (None, "-") else Path(path)
        if self.path is not None:
            if self.path.is_dir():
                raise CliError(f"{path}: is a directory (-o takes a file)")
            if not self.path.parent.is_dir():
                raise CliError(f"{self.path.parent}: no such directory for -o")
        self._f = None

    def write(self, lines: list[bytes]) -> None:
        if not lines:
            return
        data = b"".join(lines)
        if self.path is None:
            stdout = sys.stdout
            buffer = getattr(stdout, "buffer", None)
            if buffer is None:  # a text-only stream (some embeddings and test captures)
                stdout.write(data.decode("utf-8"))
            else:
                stdout.flush()
                buffer.write(data)
                buffer.flush()
            stdout.flush()
            return
        if self._f is None:
            self._f = open(self.path, "wb")  # noqa: SIM115
        self._f.write(data)
        self._f.flush()

    def close(self, ok: bool) -> None:
        if self._f is None and ok and self.path is not None:
            self.path.write_bytes(b"")
        if self._f is not None:
            self._f.close()
