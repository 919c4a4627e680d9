"""A PostgreSQL server that a test starts and stops itself: Debian's binaries (``make postgresql``), a data
folder and a Unix socket in a temporary folder, no TCP port.

PostgreSQL refuses to run as root: as root, the server runs as the ``postgres`` user that Debian's package
creates; otherwise as the current user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PORT = 5432  # only names the socket file (.s.PGSQL.5432) in a folder of our own: no TCP port is opened


def binaries() -> Path | None:
    """The folder of the newest installed ``pg_ctl`` (Debian's layout), else the one on PATH."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    on_path = shutil.which("pg_ctl")
    return Path(on_path).parent if on_path else None


def why_not() -> str | None:
    """Why no server can be started here, or ``None``."""
    if binaries() is None:
        return "PostgreSQL's server binaries are missing: `make postgresql` installs Debian's (needs root)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return (
                "running as root, and there is no `postgres` user for the server (Debian's package adds it)"
            )
    return None


@dataclass(frozen=True)
class Server:
    socket_folder: Path

    def url(self, database: str = "postgres") -> str:
        """An SQLAlchemy URL for ``database`` (psycopg 3, over the Unix socket)."""
        return f"postgresql+psycopg://postgres@/{database}?host={self.socket_folder}&port={PORT}"

    def create_database(self, name: str) -> str:
        """Create database ``name``; return its URL."""
        import psycopg

        with psycopg.connect(
            host=str(self.socket_folder), port=PORT, user="postgres", dbname="postgres", autocommit=True
        ) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


@contextlib.contextmanager
def running() -> Iterator[Server]:
    """Start a server for the duration of the block (raises ``RuntimeError`` if it does not start)."""
    reason = why_not()
    if reason:
        raise RuntimeError(reason)
    folder = Path(tempfile.mkdtemp(prefix="pg-", dir="/tmp"))  # short: a socket path has at most 107 bytes
    user = None
    if os.geteuid() == 0:
        user = "postgres"
        shutil.chown(folder, user=user)
    bin_folder = binaries()
    assert bin_folder is not None

    def run(*command: str) -> None:
        done = subprocess.run(command, user=user, capture_output=True, text=True, cwd=folder, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stdout}{done.stderr}")

    data = folder / "data"
    try:
        run(
            str(bin_folder / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-locale",
        )
        options = f"-k {folder} -c listen_addresses='' -p {PORT} -c fsync=off"
        run(
            str(bin_folder / "pg_ctl"),
            "-D",
            str(data),
            "-o",
            options,
            "-l",
            str(folder / "log"),
            "-w",
            "start",
        )
        try:
            yield Server(folder)
        finally:
            run(str(bin_folder / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
