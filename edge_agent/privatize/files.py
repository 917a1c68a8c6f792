"""Input and output files of ``edge-agent privatize``.

Input is read with ``os.read`` (:class:`edge_agent.privatize.lines.FdLines`), so a worker
thread blocked on stdin or a pipe never holds up the exit; ``-o`` naming the
input file (same device and inode) is refused before anything is written; output
is whole lines, flushed per batch, in a file created 0600 (an existing one keeps its mode).
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import cast

from edge_agent.errors import CliError, UsageError
from edge_agent.privatize.lines import FdLines

OUTPUT_MODE = 0o600  # a new -o file: what this device sent is for its user only


def open_input(path: str):
    """(lines source with ``fileno`` and ``close``, size in bytes or None).

    Read with ``os.read`` (:class:`edge_agent.privatize.lines.FdLines`): the worker thread may
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


def _write_offset(fd: int) -> int:
    """Where the next write to ``fd`` lands: its offset, or the end of the file when it
    was opened to append (``>>``: the offset of such a descriptor stays 0); 0 for a pipe."""
    try:
        import fcntl

        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND:
            return os.fstat(fd).st_size
    except (ImportError, OSError):
        pass
    try:
        return os.lseek(fd, 0, os.SEEK_CUR)
    except OSError:  # a pipe or a terminal
        return 0


class Output:
    """Whole lines (UTF-8 bytes) written with ``os.write`` as each batch is ready; a file
    is created at its first line (or at the end).

    On a write error (full disk, file size limit, /dev/full) a regular file is cut back
    to its last complete line, and the CliError names the file and the records it holds:
    the output stays valid line by line.
    """

    def __init__(self, path: str | None):
        self.path = None if path in (None, "-") else Path(path)
        if self.path is not None:
            if self.path.is_dir():
                raise CliError(f"{path}: is a directory (-o takes a file)")
            if not self.path.parent.is_dir():
                raise CliError(f"{self.path.parent}: no such directory for -o")
        self._fd: int | None = None
        self._start = 0  # offset of the first byte this run writes (stdout may append)
        self.nbytes = 0  # bytes of complete lines written
        self.records = 0  # lines (records) written

    @property
    def name(self) -> str:
        return "stdout" if self.path is None else str(self.path)

    def _open(self) -> int | None:
        if self.path is not None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, OUTPUT_MODE)
            return self._fd
        sys.stdout.flush()
        try:
            fd = sys.stdout.fileno()
        except (AttributeError, OSError, ValueError):  # a stream without a descriptor
            return None
        self._start = _write_offset(fd)
        self._fd = fd
        return fd

    def write(self, lines: list[bytes]) -> None:
        if not lines:
            return
        data = b"".join(lines)
        fd = self._fd if self._fd is not None else self._open()
        if fd is None:  # a text-only stream (some embeddings and test captures)
            sys.stdout.write(data.decode("utf-8"))
            sys.stdout.flush()
        else:
            done = 0
            try:
                while done < len(data):
                    done += os.write(fd, memoryview(data)[done:])
            except BrokenPipeError:  # the reader went away: the CLI stops quietly
                raise
            except OSError as exc:
                whole = data.rfind(b"\n", 0, done) + 1  # complete lines of this batch
                self.nbytes += whole
                self.records += data.count(b"\n", 0, whole)
                raise CliError(self._failed(exc)) from None
        self.nbytes += len(data)
        self.records += len(lines)

    def _failed(self, exc: OSError) -> str:
        """Cut a regular file back to its last complete line; the one-line message."""
        cut = ""
        try:
            fd = cast(int, self._fd)  # an output file (stdout has none and never fails so)
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.ftruncate(fd, self._start + self.nbytes)
                cut = ", cut back to its last complete line"
        except OSError as err:
            cut = f"; cutting it back failed too ({err.strerror or err})"
        return (f"{self.name}: write failed ({exc.strerror or exc}); it holds "
                f"{self.records} complete record(s){cut}")

    def close(self, ok: bool) -> None:
        if self._fd is None and ok and self.path is not None:
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, OUTPUT_MODE))
        if self._fd is not None and self.path is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
