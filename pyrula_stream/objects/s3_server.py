"""A real S3 server on loopback: Versity's S3 gateway (``versitygw``) over a directory.

``versitygw`` speaks the S3 API (signatures, multipart uploads, listings, errors) and
keeps each bucket as a folder, so tests, ``chaos --large`` and the bench exercise the
same boto3 calls a deployment makes against AWS S3, MinIO or Ceph, with nothing to
install but Go: the binary is built once from the Go module proxy
(``go install <module>@<version>``: 2.5 minutes on two busy cores from a cold
Go build cache) into the repository's
``.tools/`` folder (``make setup`` does it), or into the cache folder when the package
runs outside a clone. ``$PYRULA_S3_SERVER`` names a binary to use instead.

Each start gets its own data folder, port and random root credentials (passed in the
server's environment, never on its command line); ``LocalS3.client_env()`` gives them as
the standard ``AWS_*`` variables, which is how ``S3ObjectStore`` takes credentials.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pyrula_stream.errors import ConfigurationError, ObjectStoreUnavailable
from pyrula_stream.kafka.local.broker import cache_root, free_port

SERVER_MODULE = "github.com/versity/versitygw/cmd/versitygw"
SERVER_VERSION = "v1.8.0"
SERVER_ENV = "PYRULA_S3_SERVER"
"""A ``versitygw`` binary to run instead of the one built here."""
REGION = "us-east-1"
REPO_ROOT = Path(__file__).resolve().parents[2]


def tools_dir() -> Path:
    """The clone's ``.tools/`` (gitignored) when the package runs from one, else the
    cache folder's ``tools/`` (``PYRULA_STREAM_CACHE``)."""
    if (REPO_ROOT / "pyproject.toml").exists() and (REPO_ROOT / "pyrula_stream").is_dir():
        return REPO_ROOT / ".tools"
    return cache_root() / "tools"


def server_binary() -> Path:
    """The ``versitygw`` binary, built from the Go module proxy the first time."""
    given = os.environ.get(SERVER_ENV)
    if given:
        if not Path(given).is_file():
            raise ConfigurationError(f"${SERVER_ENV}={given}: no such file")
        return Path(given)
    folder = tools_dir() / f"versitygw-{SERVER_VERSION}"
    binary = folder / "versitygw"
    if binary.is_file():
        return binary
    go = shutil.which("go")
    if go is None:
        raise ConfigurationError(
            "the local S3 server is built with Go, which is not installed: install Go "
            f"1.25+ (https://go.dev/dl), or set ${SERVER_ENV} to a versitygw binary"
        )
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOBIN": str(folder), "GOFLAGS": "-buildvcs=false"}
    done = subprocess.run(
        [go, "install", f"{SERVER_MODULE}@{SERVER_VERSION}"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not binary.is_file():
        raise ConfigurationError(
            f"building {SERVER_MODULE}@{SERVER_VERSION} failed ({done.returncode}):\n"
            f"{done.stderr[-2000:]}"
        )
    return binary


def _die_with_parent() -> None:
    """In the child: SIGTERM the server when its parent dies (no stray servers)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    os.setsid()


@dataclass
class LocalS3:
    """A running server started by ``start_local_s3``. Its credentials stay out of
    ``repr`` (and so out of test reports and logs)."""

    endpoint_url: str
    root: str
    """The server's folder: ``buckets/`` (one folder per bucket) and ``server.log``."""
    access_key: str = field(repr=False)
    secret_key: str = field(repr=False)
    owns_data_dir: bool = True
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def client_env(self) -> dict[str, str]:
        """The standard variables an S3 client reads its credentials and region from."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
        }

    def store_url(self, bucket: str, prefix: str = "") -> str:
        """The ``--object-store`` URL of ``bucket`` on this server (path-style)."""
        return f"s3://{bucket}/{prefix}?endpoint={self.endpoint_url}&path_style=1"

    @property
    def buckets_dir(self) -> Path:
        return Path(self.root) / "buckets"

    @property
    def log_file(self) -> Path:
        return Path(self.root) / "server.log"

    def create_bucket(self, bucket: str) -> None:
        """A new bucket (a folder under ``buckets/``); an existing one is kept."""
        (self.buckets_dir / bucket).mkdir(exist_ok=True)

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, SIGKILL after ``grace_s``; the folder goes when this module made it.
        Safe to repeat."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self.owns_data_dir:
            shutil.rmtree(self.root, ignore_errors=True)


def start_local_s3(
    *,
    data_dir: Path | None = None,
    port: int | None = None,
    buckets: tuple[str, ...] = (),
    timeout_s: float = 30.0,
) -> LocalS3:
    """Start ``versitygw`` over ``data_dir`` (a new temporary folder by default, removed
    on ``stop``) on a free loopback port; return once it answers HTTP, with ``buckets``
    made. A ``data_dir`` used before keeps its objects."""
    binary = server_binary()
    owns = data_dir is None
    root = Path(data_dir or tempfile.mkdtemp(prefix="pyrula-s3-"))
    port = port or free_port()
    access, secret = f"pyrula{secrets.token_hex(6)}", secrets.token_hex(20)
    server = LocalS3(f"http://127.0.0.1:{port}", str(root), access, secret, owns)
    server.buckets_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "ROOT_ACCESS_KEY_ID": access,
        "ROOT_SECRET_ACCESS_KEY": secret,
        "VGW_REGION": REGION,
    }
    listen = f"127.0.0.1:{port}"
    with open(server.log_file, "ab") as out:
        server.process = subprocess.Popen(
            [str(binary), "--port", listen, "--quiet", "posix", str(server.buckets_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=_die_with_parent,
        )
    try:
        _wait_until_answering(server, timeout_s)
    except BaseException:
        tail = server.log_file.read_text(errors="replace")[-3000:]
        server.stop()
        raise ObjectStoreUnavailable(f"the local S3 server did not start:\n{tail}") from None
    for bucket in buckets:
        server.create_bucket(bucket)
    return server


def _wait_until_answering(server: LocalS3, timeout_s: float) -> None:
    """Any HTTP answer (an unsigned request is refused with 403) means it serves."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process is not None and server.process.poll() is not None:
            raise ObjectStoreUnavailable(f"versitygw exited with {server.process.returncode}")
        try:
            with urllib.request.urlopen(server.endpoint_url, timeout=1.0):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise ObjectStoreUnavailable(f"no answer at {server.endpoint_url} within {timeout_s:.0f}s")


@contextlib.contextmanager
def local_s3(*buckets: str) -> Iterator[LocalS3]:
    """A server with ``buckets`` for the length of a ``with`` (tests, chaos, the bench),
    its credentials in this process's environment as the ``AWS_*`` variables meanwhile,
    where boto3 and any child process read them; the variables are put back after."""
    server = start_local_s3(buckets=buckets)
    saved = {name: os.environ.get(name) for name in server.client_env()}
    os.environ.update(server.client_env())
    try:
        yield server
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        server.stop()
