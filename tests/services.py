"""Throwaway PostgreSQL, Redis and S3-compatible servers for tests, benchmarks and cluster scripts.

Each ``start_*`` context manager runs a real server as a child process on a free loopback port,
with its files in a fresh temporary directory, waits until it answers, yields what a client needs
to reach it, and stops it and deletes its files on exit. Nothing depends on what the machine
already runs. pytest gets them as session fixtures (``redis_server``, ``postgres_server``,
``s3_server``, registered in ``tests/conftest.py``); a script uses the context managers directly,
and a shell script can run ``python -m tests.services postgres redis s3``, which prints
``DATABASE_URL=...``-style lines and serves until it is interrupted.

- PostgreSQL: a temporary cluster made by Debian's ``initdb`` (the newest
  ``/usr/lib/postgresql/*/bin``, or ``PARLEY_PG_BINDIR``), with its unix socket in the temporary
  directory and trust authentication on loopback. ``initdb`` and ``postgres`` refuse to run as
  root, so under root they run as the ``postgres`` system user (made by Debian's package), else
  ``nobody``.
- Redis: ``redis-server`` without persistence; ``start_redis(password=...)`` makes it require that
  password (``requirepass``, written to a 0600 config file in its private directory so that ``ps``
  does not show it) and puts it in the URL: ``redis://:PASSWORD@127.0.0.1:PORT/0``.
- S3: moto's server mode (``moto[server]`` from PyPI, a test extra). It is a separate process
  speaking the S3 REST API over real HTTP, so boto3 and django-storages exercise their real
  request signing, uploads and error handling. It is chosen because it installs with pip into the
  project's venv: Debian 12 has no S3 server package (its rclone predates ``rclone serve s3``)
  and MinIO is in neither registry. Objects live in the process's memory, which is what a
  throwaway test server wants.

Servers are started with ``setpriv --pdeathsig`` where util-linux provides it, so a test process
killed without running its cleanup (a hard timeout, SIGKILL) does not leave servers behind.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0  # generous: several engineers' suites share two cores
STOP_TIMEOUT_S = 15.0
PORT_ATTEMPTS = 3  # another process may take the free port between free_port() and the bind
LOG_TAIL_CHARS = 3000


class ServiceError(RuntimeError):
    """A throwaway server could not be started: a missing binary or a server that did not come up."""


@dataclass(frozen=True)
class RedisServer:
    url: str  # redis://127.0.0.1:PORT/0, or redis://:PASSWORD@127.0.0.1:PORT/0
    host: str
    port: int
    password: str | None = None

    def database_url(self, database: int) -> str:
        """The URL of another database on the same server (the Celery broker's), password included."""
        return self.url.rsplit("/", 1)[0] + f"/{database}"


@dataclass(frozen=True)
class PostgresServer:
    url: str  # postgres://USER@127.0.0.1:PORT/DATABASE, a fresh database; the user is a superuser
    host: str
    port: int
    user: str
    database: str
    socket_dir: Path


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str  # http://127.0.0.1:PORT
    access_key: str
    secret_key: str
    region: str
    bucket: str  # created empty at start


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on right now (the kernel's pick for an ephemeral bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


# --- Redis -----------------------------------------------------------------------------------------


@contextlib.contextmanager
def start_redis(password: str | None = None) -> Iterator[RedisServer]:
    """A ``redis-server`` on a free loopback port, no persistence; yields its ``url`` (database 0).

    With ``password`` every client must authenticate (the URL carries it); without, anyone on the
    machine may read and write, which is only acceptable for a test's own throwaway server.
    """
    binary = _require("redis-server", "apt-get install redis-server")
    with _temp_dir("redis") as folder:
        config = folder / "redis.conf"
        config.touch(mode=0o600)
        if password is not None:
            if not password or any(c.isspace() or c in "\"'@:/" for c in password):
                raise ValueError("a Redis password for a URL must be non-empty, without spaces, quotes, @, : or /")
            config.write_text(f"requirepass {password}\n")

        def command(port: int) -> list[str]:
            return [binary, str(config), "--bind", HOST, "--port", str(port), "--save", "", "--appendonly", "no",
                    "--dir", str(folder), "--daemonize", "no", "--logfile", ""]  # fmt: skip

        def answers(port: int) -> bool:
            return _redis_answers(port, password)

        with _serve("redis-server", command, folder / "redis.log", answers) as port:
            auth = f":{password}@" if password is not None else ""
            yield RedisServer(url=f"redis://{auth}{HOST}:{port}/0", host=HOST, port=port, password=password)


def _redis_answers(port: int, password: str | None = None) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1) as sock:
            if password is not None:
                sock.sendall(_resp("AUTH", password))
                if not sock.recv(16).startswith(b"+OK"):
                    return False
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _resp(*words: str) -> bytes:
    """One command in Redis's wire format (an array of bulk strings: any byte in a word is safe)."""
    parts = [f"*{len(words)}\r\n".encode()]
    for word in words:
        data = word.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


# --- PostgreSQL ------------------------------------------------------------------------------------

POSTGRES_USER = "parley"
POSTGRES_DATABASE = "parley"


@contextlib.contextmanager
def start_postgres() -> Iterator[PostgresServer]:
    """A temporary PostgreSQL cluster on a free loopback port; yields the ``url`` of a fresh database."""
    bindir = _postgres_bindir()
    account = _unprivileged_account()
    with _temp_dir("postgres", owner=account) as folder:
        data, sockets, log = folder / "data", folder / "sockets", folder / "postgres.log"
        sockets.mkdir()
        if account:
            os.chown(sockets, account.pw_uid, account.pw_gid)
        initdb = [str(bindir / "initdb"), "-D", str(data), "-U", POSTGRES_USER, "--auth=trust",
                  "--encoding=UTF8", "--locale=C", "--no-sync"]  # fmt: skip
        _run(initdb, "initdb", log, account)

        def command(port: int) -> list[str]:
            # fsync and friends off: the cluster is thrown away, and tests should not wait on disks.
            return [str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(sockets),
                    "-c", f"listen_addresses={HOST}", "-c", "fsync=off", "-c", "synchronous_commit=off",
                    "-c", "full_page_writes=off"]  # fmt: skip

        def answers(port: int) -> bool:
            ready = [str(bindir / "pg_isready"), "-q", "-h", HOST, "-p", str(port), "-t", "1"]
            return subprocess.run(ready, check=False, timeout=10).returncode == 0

        # SIGINT is PostgreSQL's "fast shutdown": sessions are ended, the server exits at once.
        with _serve("postgres", command, log, answers, account=account, stop_signal=signal.SIGINT) as port:
            createdb = [str(bindir / "createdb"), "-h", HOST, "-p", str(port), "-U", POSTGRES_USER, POSTGRES_DATABASE]
            _run(createdb, "createdb", log, None)
            yield PostgresServer(
                url=f"postgres://{POSTGRES_USER}@{HOST}:{port}/{POSTGRES_DATABASE}",
                host=HOST,
                port=port,
                user=POSTGRES_USER,
                database=POSTGRES_DATABASE,
                socket_dir=sockets,
            )


def _postgres_bindir() -> Path:
    """``PARLEY_PG_BINDIR``, else the newest Debian ``/usr/lib/postgresql/N/bin``, else ``initdb`` on PATH."""
    override = os.environ.get("PARLEY_PG_BINDIR")
    if override:
        if not (Path(override) / "initdb").is_file():
            raise ServiceError(f"PARLEY_PG_BINDIR={override} has no initdb")
        return Path(override)
    debian = sorted(
        (p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/initdb")),
        key=lambda bindir: int(bindir.parent.name) if bindir.parent.name.isdigit() else 0,
    )
    if debian:
        return debian[-1]
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    raise ServiceError(
        "initdb not found (looked in /usr/lib/postgresql/*/bin and on PATH): "
        "apt-get install postgresql, or set PARLEY_PG_BINDIR"
    )


def _unprivileged_account() -> pwd.struct_passwd | None:
    """Who runs initdb and postgres: None (ourselves) unless we are root, which PostgreSQL refuses."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise ServiceError("running as root and neither a 'postgres' nor a 'nobody' user exists to run PostgreSQL")


# --- S3 (moto's server mode) -----------------------------------------------------------------------

S3_ACCESS_KEY = "parley-test-access"
S3_SECRET_KEY = "parley-test-secret"
S3_REGION = "us-east-1"
S3_BUCKET = "parley-test"


@contextlib.contextmanager
def start_s3() -> Iterator[S3Server]:
    """moto's S3-compatible server on a free loopback port, with one empty bucket."""
    try:
        import boto3
        import moto.server  # noqa: F401 (only checks that the server mode is installed)
    except ImportError as exc:
        raise ServiceError(
            f"moto's server mode is not installed in {sys.executable}'s environment ({exc}): "
            "pip install -e '.[test]' (it pins moto[server])"
        ) from exc
    with _temp_dir("s3") as folder:

        def command(port: int) -> list[str]:
            return [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)]

        def answers(port: int) -> bool:
            try:
                with urllib.request.urlopen(f"http://{HOST}:{port}/moto-api/", timeout=1):
                    return True
            except (OSError, urllib.error.URLError):
                return False

        with _serve("moto S3 server", command, folder / "moto.log", answers) as port:
            server = S3Server(
                endpoint_url=f"http://{HOST}:{port}",
                access_key=S3_ACCESS_KEY,
                secret_key=S3_SECRET_KEY,
                region=S3_REGION,
                bucket=S3_BUCKET,
            )
            client = boto3.client(
                "s3",
                endpoint_url=server.endpoint_url,
                aws_access_key_id=server.access_key,
                aws_secret_access_key=server.secret_key,
                region_name=server.region,
            )
            client.create_bucket(Bucket=server.bucket)
            yield server


# --- process plumbing shared by the three ----------------------------------------------------------


def _require(binary: str, install_hint: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise ServiceError(f"{binary} not found on PATH: {install_hint}")
    return path


@contextlib.contextmanager
def _temp_dir(service: str, owner: pwd.struct_passwd | None = None) -> Iterator[Path]:
    """A fresh directory, removed afterwards; given to ``owner``, whom every parent must let through."""
    base = tempfile.gettempdir()
    if owner and not _traversable(Path(base), owner):
        base = "/tmp"  # a root-only TMPDIR: /tmp is world-traversable on every Debian box
    folder = Path(tempfile.mkdtemp(prefix=f"parley-{service}-", dir=base))
    try:
        if owner:
            os.chown(folder, owner.pw_uid, owner.pw_gid)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _traversable(path: Path, account: pwd.struct_passwd) -> bool:
    for folder in [path, *path.parents]:
        st = folder.stat()
        if st.st_uid == account.pw_uid:
            ok = st.st_mode & 0o100
        elif st.st_gid == account.pw_gid:
            ok = st.st_mode & 0o010
        else:
            ok = st.st_mode & 0o001
        if not ok:
            return False
    return True


def _as(account: pwd.struct_passwd | None) -> dict:
    """Popen arguments that run a child as ``account`` (None: as ourselves)."""
    if account is None:
        return {}
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def _run(command: list[str], what: str, log: Path, account: pwd.struct_passwd | None) -> None:
    with log.open("a") as out:
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=START_TIMEOUT_S, **_as(account))
    if result.returncode != 0:
        raise ServiceError(f"{what} failed (exit {result.returncode}):\n{_tail(log)}")


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def _serve(
    what: str,
    command: Callable[[int], list[str]],
    log: Path,
    answers: Callable[[int], bool],
    *,
    account: pwd.struct_passwd | None = None,
    stop_signal: signal.Signals = signal.SIGTERM,
) -> Iterator[int]:
    """Run ``command(port)`` on a free port until ``answers(port)``; yield the port; stop it afterwards.

    A server that exits before answering is retried on another port (a lost race for the port
    looks like that), up to PORT_ATTEMPTS times; then the error shows the end of its log.
    """
    # The child gets stop_signal if we die without cleaning up (setpriv applies it after exec).
    guard = ["setpriv", f"--pdeathsig={stop_signal.name[3:]}", "--"] if shutil.which("setpriv") else []
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = free_port()
        with log.open("a") as out:
            process = subprocess.Popen(
                [*guard, *command(port)], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, **_as(account)
            )
        try:
            if _wait_until_answers(what, process, port, answers):
                break
        except BaseException:
            _stop(process, stop_signal)
            raise
        if attempt == PORT_ATTEMPTS:
            raise ServiceError(f"{what} exited before answering (exit {process.returncode}):\n{_tail(log)}")
    try:
        yield port
    finally:
        _stop(process, stop_signal)


def _wait_until_answers(what: str, process: subprocess.Popen, port: int, answers: Callable[[int], bool]) -> bool:
    """True once the server answers; False if it exited first; ServiceError past START_TIMEOUT_S."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while process.poll() is None:
        if answers(port):
            return True
        if time.monotonic() > deadline:
            raise ServiceError(f"{what} did not answer on port {port} within {START_TIMEOUT_S:.0f}s")
        time.sleep(0.05)
    return False


def _stop(process: subprocess.Popen, stop_signal: signal.Signals) -> None:
    if process.poll() is None:
        process.send_signal(stop_signal)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --- command line: servers for a shell script --------------------------------------------------------

STARTERS = {"redis": start_redis, "postgres": start_postgres, "s3": start_s3}


def _environment_lines(server: RedisServer | PostgresServer | S3Server) -> list[str]:
    if isinstance(server, RedisServer):
        return [f"REDIS_URL={server.url}"]
    if isinstance(server, PostgresServer):
        return [f"DATABASE_URL={server.url}"]
    return [
        f"S3_ENDPOINT_URL={server.endpoint_url}",
        f"S3_ACCESS_KEY={server.access_key}",
        f"S3_SECRET_KEY={server.secret_key}",
        f"S3_REGION={server.region}",
        f"S3_BUCKET={server.bucket}",
    ]


def main(argv: list[str]) -> int:
    names = argv or list(STARTERS)
    unknown = [name for name in names if name not in STARTERS]
    if unknown:
        print(f"usage: python -m tests.services [{'|'.join(STARTERS)}]...  (unknown: {' '.join(unknown)})")
        return 2
    # SIGTERM (a script's `kill`) unwinds like Ctrl-C, so every server is stopped and its files removed.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with contextlib.ExitStack() as stack:
        for name in names:
            for line in _environment_lines(stack.enter_context(STARTERS[name]())):
                print(line, flush=True)
        # READY inside: a script may send SIGTERM the moment it reads the line, before print has returned.
        with contextlib.suppress(KeyboardInterrupt):
            print("READY", flush=True)
            signal.pause()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
