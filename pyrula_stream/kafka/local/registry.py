"""A real Schema Registry for tests, without Docker: Apache-licensed Apicurio Registry.

Maven fetches ``io.apicurio:apicurio-registry-app:<version>:tar.gz:all`` (about 160 MB)
once into the same cache as the Kafka jars; it is unpacked there and started as a child
JVM on a free loopback port. It needs Java 21+, which is looked for in ``JAVA21_HOME``,
``JAVA_HOME``, the ``java`` on the PATH and ``/usr/lib/jvm/*``. Confluent clients talk to
its Confluent-compatible API at ``<url>/apis/ccompat/v7``. State is in memory.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pyrula_stream.errors import BrokerUnavailableError
from pyrula_stream.kafka.local.broker import cache_root, free_port
from pyrula_stream.redaction import redact_url

APICURIO_VERSION = "3.3.3"
MIN_JAVA = 21
CCOMPAT_PATH = "/apis/ccompat/v7"


def _java_major(java: str) -> int:
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)', out.stderr + out.stdout)
    return int(match.group(1)) if match else 0


def find_java(minimum: int = MIN_JAVA) -> str:
    """A ``java`` binary of at least ``minimum``, or a clear error saying where we looked."""
    candidates = [
        str(Path(home) / "bin" / "java")
        for home in (os.environ.get("JAVA21_HOME"), os.environ.get("JAVA_HOME"))
        if home
    ]
    on_path = shutil.which("java")
    if on_path:
        candidates.append(on_path)
    candidates += sorted(str(p) for p in Path("/usr/lib/jvm").glob("*/bin/java"))
    for java in candidates:
        if Path(java).exists() and _java_major(java) >= minimum:
            return java
    raise BrokerUnavailableError(
        f"the local Schema Registry (Apicurio) needs Java {minimum}+; none found in "
        f"$JAVA21_HOME, $JAVA_HOME, PATH or /usr/lib/jvm (looked at: {candidates}). "
        "Install a Java 21+ runtime (e.g. Eclipse Temurin 21) and set JAVA21_HOME to it, or "
        "set SCHEMA_REGISTRY_URL to a running registry"
    )


def fetch_registry(version: str = APICURIO_VERSION) -> Path:
    """Fetch and unpack Apicurio Registry once; later calls return the cached folder."""
    folder = cache_root() / f"apicurio-registry-{version}"
    marker = folder / ".complete"
    if marker.exists():
        return folder
    mvn = shutil.which("mvn")
    if not mvn:
        raise BrokerUnavailableError("Maven (mvn) is needed to fetch Apicurio Registry")
    download = Path(tempfile.mkdtemp(prefix="pyrula-apicurio-"))
    try:
        result = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                "dependency:copy",
                f"-Dartifact=io.apicurio:apicurio-registry-app:{version}:tar.gz:all",
                f"-DoutputDirectory={download}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        archives = list(download.glob("*.tar.gz"))
        if result.returncode != 0 or not archives:
            raise BrokerUnavailableError(
                f"Maven could not fetch Apicurio Registry {version}:\n"
                f"{result.stdout[-2000:]}{result.stderr[-2000:]}"
            )
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        with tarfile.open(archives[0]) as archive:
            archive.extractall(folder, filter="data")
    finally:
        shutil.rmtree(download, ignore_errors=True)
    if not (folder / "quarkus-run.jar").exists():
        raise BrokerUnavailableError(f"no quarkus-run.jar in the Apicurio archive at {folder}")
    marker.write_text(version)
    return folder


@dataclass
class LocalRegistry:
    """A running Apicurio Registry; ``url`` is its Confluent-compatible API."""

    url: str
    process: subprocess.Popen[bytes]
    log_file: str

    def __repr__(self) -> str:
        return f"LocalRegistry({redact_url(self.url)!r}, log_file={self.log_file!r})"

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``. Safe to repeat."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/subjects", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def start_local_registry(timeout_s: float = 120.0) -> LocalRegistry:
    """Start Apicurio Registry on a free loopback port; return once its API answers."""
    from pyrula_stream.kafka.local.broker import _die_with_parent

    java = find_java()
    home = fetch_registry()
    port = free_port()
    log_file = Path(tempfile.mkdtemp(prefix="pyrula-registry-")) / "registry.log"
    with open(log_file, "wb") as out:
        process = subprocess.Popen(
            [
                java,
                "-Xmx512m",
                "-XX:TieredStopAtLevel=1",
                "-Dquarkus.http.host=127.0.0.1",
                f"-Dquarkus.http.port={port}",
                "-jar",
                str(home / "quarkus-run.jar"),
            ],
            cwd=home,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
    registry = LocalRegistry(f"http://127.0.0.1:{port}{CCOMPAT_PATH}", process, str(log_file))
    deadline = time.monotonic() + timeout_s
    while not _answers(registry.url):
        if process.poll() is not None or time.monotonic() > deadline:
            registry.stop()
            tail = log_file.read_text(errors="replace")[-3000:]
            raise BrokerUnavailableError(f"Apicurio Registry did not start:\n{tail}")
        time.sleep(0.2)
    return registry
