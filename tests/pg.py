"""A throwaway PostgreSQL cluster for tests and benches (Debian's ``postgresql`` package).

    cluster = PgCluster.create()          # initdb in a temporary folder, free loopback port
    cluster.start()
    url = cluster.create_database("t1")   # postgresql+psycopg://postgres@127.0.0.1:PORT/t1
    cluster.stop(); cluster.destroy()

``initdb`` and ``pg_ctl`` are not on PATH in Debian (``/usr/lib/postgresql/<v>/bin``, or
wherever ``dpkg -L postgresql-<v>`` lists them). PostgreSQL refuses to run as root: when
the tests run as root, every server program runs as the ``postgres`` user through
``runuser``, and the cluster folder belongs to that user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def find_bin_dir() -> Path | None:
    """The folder with ``initdb`` and ``pg_ctl`` (newest version first), or None."""
    env = os.environ.get("PRIVBERT_PG_BIN")
    if env and (Path(env) / "initdb").is_file():
        return Path(env)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    for pkg in ("postgresql-15", "postgresql-16", "postgresql-17"):
        try:
            files = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True,
                                   timeout=30).stdout.split()
        except (OSError, subprocess.SubprocessError):
            continue
        for f in files:
            if f.endswith("/bin/initdb") and Path(f).is_file():
                return Path(f).parent
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgCluster:
    """One cluster: data folder, port, superuser ``postgres`` with trust auth on loopback."""

    def __init__(self, bin_dir: Path, root: Path, port: int, as_user: str | None):
        self.bin_dir, self.root, self.port, self.as_user = bin_dir, root, port, as_user
        self.data = root / "data"
        self.log = root / "server.log"

    @classmethod
    def create(cls, *, fsync: bool = False, bin_dir: Path | None = None) -> PgCluster:
        """initdb into a fresh temporary folder. ``fsync=False`` (tests): no waiting for
        the disk; benches keep PostgreSQL's durable defaults."""
        bin_dir = bin_dir or find_bin_dir()
        if bin_dir is None:
            raise FileNotFoundError("PostgreSQL server programs not found (apt-get install "
                                    "postgresql)")
        as_user = "postgres" if os.geteuid() == 0 else None
        root = Path(tempfile.mkdtemp(prefix="privbert-pg-"))
        if as_user:
            pw = pwd.getpwnam(as_user)
            os.chown(root, pw.pw_uid, pw.pw_gid)
        self = cls(bin_dir, root, free_port(), as_user)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
                  "-E", "UTF8", "--locale=C", *(["--no-sync"] if not fsync else []))
        conf = [f"port = {self.port}", "listen_addresses = '127.0.0.1'",
                f"unix_socket_directories = '{self.root}'", "max_connections = 100",
                "shared_buffers = 32MB"]
        if not fsync:
            conf += ["fsync = off", "synchronous_commit = off", "full_page_writes = off"]
        with open(self.data / "postgresql.conf", "a") as fh:
            fh.write("\n".join(conf) + "\n")
        return self

    def _cmd(self, prog: str, *args: str) -> list[str]:
        cmd = [str(self.bin_dir / prog), *args]
        return ["runuser", "-u", self.as_user, "--", *cmd] if self.as_user else cmd

    def _run(self, prog: str, *args: str, timeout: float = 120) -> str:
        res = subprocess.run(self._cmd(prog, *args), capture_output=True, text=True,
                             timeout=timeout, cwd=self.root)
        if res.returncode != 0:
            raise RuntimeError(f"{prog} failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
        return res.stdout

    # -- server ------------------------------------------------------------------------------
    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                  "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def running(self) -> bool:
        res = subprocess.run(self._cmd("pg_ctl", "-D", str(self.data), "status"),
                             capture_output=True, timeout=30, cwd=self.root)
        return res.returncode == 0

    def destroy(self) -> None:
        if self.running():
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- databases ---------------------------------------------------------------------------
    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> str:
        """An empty database ``name``; its SQLAlchemy URL."""
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def dump(self, dbname: str) -> str:
        """``pg_dump`` of ``dbname`` as SQL text (schema and every row)."""
        return self._run("pg_dump", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                         dbname)
