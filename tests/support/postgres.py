"""A private PostgreSQL cluster for the test session: initdb into a temp folder, a free port."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path


def find_bindir() -> Path | None:
    """Where initdb and pg_ctl live, or None when the server is not installed."""
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        cand = Path(out.stdout.strip())
        if (cand / "initdb").exists():
            return cand
    for cand in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(cand, "initdb").exists():
            return Path(cand)
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PrivatePostgres:
    bindir: Path
    root: Path
    port: int
    _as: list[str]

    @property
    def admin_url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, db: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{db}"

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, text=True, cwd=self.root)

    def create_database(self) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        self._psql(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        self._psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _psql(self, sql: str) -> None:
        subprocess.run(
            [str(self.bindir / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
             "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-q", "-c", sql],
            check=True, capture_output=True, text=True,
        )

    def stop(self) -> None:
        try:
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def start(bindir: Path, settings: dict[str, str] | None = None) -> PrivatePostgres:
    """initdb + start on a free loopback port; as the `postgres` user when we are root.
    ``settings`` adds server settings (name -> value), e.g. a benchmark's shared_buffers."""
    root = Path(tempfile.mkdtemp(prefix="orch-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:  # initdb refuses to run as root
        user = "postgres"
        pw = pwd.getpwnam(user)
        os.chown(root, pw.pw_uid, pw.pw_gid)
        run_as = ["runuser", "-u", user, "--"]
    pg = PrivatePostgres(bindir, root, _free_port(), run_as)
    try:
        pg._run(str(bindir / "initdb"), "-D", str(root / "data"), "-A", "trust", "-U", "postgres",
                "-E", "UTF8", "--no-sync")
        opts = (f"-p {pg.port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        opts += "".join(f" -c {k}={v}" for k, v in (settings or {}).items())
        pg._run(str(bindir / "pg_ctl"), "-D", str(root / "data"), "-o", opts, "-l",
                str(root / "log"), "-w", "-t", "60", "start")
    except subprocess.CalledProcessError as e:
        log = (root / "log").read_text() if (root / "log").exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"private PostgreSQL failed to start: {e.stderr}\n{log}") from e
    return pg
