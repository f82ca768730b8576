"""A real single-node Apache Kafka broker (KRaft, combined mode), started from Maven jars.

No Docker and no Kafka install: Maven fetches ``org.apache.kafka:kafka_2.13`` and a log4j
binding into a cache folder once; every later start reuses it. The broker runs as a child
JVM on loopback ports and is stopped cleanly (SIGTERM, then SIGKILL after a grace).
Started again on a data directory it already formatted, it comes back on the same ports
with the same topics, offsets and transactions (a restart, not a new cluster).
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyrula_stream.errors import BrokerUnavailableError, ConfigurationError

KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.24.3"
MIN_JAVA = 17

INSTALL_HINT = (
    "Install Java 17+ and Maven (e.g. `apt-get install openjdk-17-jre-headless maven`), "
    "or set KAFKA_BOOTSTRAP_SERVERS to an existing broker, "
    "or run `docker compose up -d` and set KAFKA_BOOTSTRAP_SERVERS=localhost:9092."
)

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.pyrula.stream</groupId><artifactId>local-broker</artifactId>
  <version>1</version><packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""

_LOG4J = """status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = FILE
"""


def cache_root() -> Path:
    """Where jars and broker state live; ``PYRULA_STREAM_CACHE`` overrides."""
    env = os.environ.get("PYRULA_STREAM_CACHE")
    base = Path(env) if env else Path.home() / ".cache" / "pyrula-stream"
    return base


def _java_binary() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise BrokerUnavailableError(f"Java was not found. {INSTALL_HINT}")
    return found


def check_java() -> str:
    """Return the java binary, or explain what to install when it is missing or too old."""
    java = _java_binary()
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):
        major = int(match.group(2))
    if major < MIN_JAVA:
        raise BrokerUnavailableError(
            f"Java {MIN_JAVA}+ is needed to run the local Kafka broker, found {major or 'unknown'}"
            f" at {java}. {INSTALL_HINT}"
        )
    return java


def fetch_jars(version: str = KAFKA_VERSION) -> Path:
    """Fetch the broker's jars with Maven once; later calls return the cached folder."""
    folder = cache_root() / f"kafka-{version}"
    libs = folder / "libs"
    marker = folder / ".complete"
    if marker.exists():
        return libs
    mvn = shutil.which("mvn")
    if not mvn:
        raise BrokerUnavailableError(f"Maven (mvn) was not found. {INSTALL_HINT}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pom.xml").write_text(_POM.format(kafka=version, log4j=LOG4J_VERSION))
    result = subprocess.run(
        [
            mvn,
            "-q",
            "-B",
            "-f",
            str(folder / "pom.xml"),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={libs}",
            "-DincludeScope=runtime",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise BrokerUnavailableError(
            f"Maven could not fetch Apache Kafka {version}:\n{result.stdout[-2000:]}"
            f"{result.stderr[-2000:]}\n{INSTALL_HINT}"
        )
    marker.write_text(version)
    return libs


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_PICKED: set[int] = set()
"""Ports this process handed out already: a child may not have bound its port yet."""


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's is 32768-60999)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152  # the IANA range, which macOS and Windows use


def free_port() -> int:
    """A loopback port that is free now, for a child process to bind later.

    Never one of the kernel's ephemeral ports (what ``bind(0)`` gives): any outgoing
    connection of any process, a Kafka client's for one, may take such a port before the
    child binds it. A port below the range is taken only by an explicit bind, so picking
    one at random that binds now, and never twice in this process, leaves next to no race.
    """
    high = _ephemeral_low() - 1
    low = max(1024, high // 2)
    for _ in range(1000):
        port = random.randint(low, high)
        if port not in _PICKED and port_is_free(port):
            _PICKED.add(port)
            return port
    raise OSError(f"no free loopback port in {low}-{high}")


_LISTENERS = re.compile(
    r"^listeners=(?:PLAINTEXT|SASL_SSL)://[^:]+:(\d+),CONTROLLER://[^:]+:(\d+)$", re.M
)


def _previous_ports(props: Path) -> tuple[int, int] | None:
    """The broker and controller ports of a data directory formatted before, if any."""
    if not (props.parent / "log" / "meta.properties").exists() or not props.exists():
        return None
    match = _LISTENERS.search(props.read_text())
    return (int(match.group(1)), int(match.group(2))) if match else None


def server_properties(
    data_dir: Path,
    port: int,
    controller_port: int,
    security: BrokerSecurity | None = None,
    advertised_port: int | None = None,
) -> str:
    """The single node: a combined broker and controller."""
    listener = "SASL_SSL" if security else "PLAINTEXT"
    return f"""process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners={listener}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners={listener}://127.0.0.1:{advertised_port or port}
controller.listener.names=CONTROLLER
listener.security.protocol.map={listener}:{listener},CONTROLLER:PLAINTEXT
inter.broker.listener.name={listener}
{_security_properties(security) if security else ""}
{node_defaults(data_dir, replicas=1)}"""


def node_defaults(data_dir: Path, *, replicas: int) -> str:
    """What every node of ours sets: its log directory, no topics made on the fly, and
    internal topics with ``replicas`` copies (in-sync minimum one less)."""
    min_isr = max(1, replicas - 1)
    return f"""log.dirs={data_dir / "log"}
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor={replicas}
offsets.topic.num.partitions=4
transaction.state.log.replication.factor={replicas}
transaction.state.log.min.isr={min_isr}
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor={replicas}
share.coordinator.state.topic.min.isr={min_isr}
group.initial.rebalance.delay.ms=0
log.cleaner.backoff.ms=100
log.cleaner.threads=1
"""


def _die_with_parent() -> None:
    """In the child: ask Linux to SIGTERM the JVM when its parent dies (no stray JVMs)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    os.setsid()


SCRAM_MECHANISM = "SCRAM-SHA-512"
SUPER_USER = "admin"


@dataclass(frozen=True)
class BrokerSecurity:
    """A SASL_SSL listener: SCRAM users (``admin`` is the super user) and the CA file.

    Made for tests of a secured cluster; the certificate is self-signed for 127.0.0.1.
    """

    ca_file: str
    keystore_file: str
    passwords: Mapping[str, str] = field(repr=False)
    keystore_password: str = field(repr=False, default="")

    def client_settings(self, user: str, password: str | None = None) -> dict[str, Any]:
        """librdkafka settings for ``user`` (its own password unless one is given)."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": SCRAM_MECHANISM,
            "sasl.username": user,
            "sasl.password": self.passwords[user] if password is None else password,
            "ssl.ca.location": self.ca_file,
        }

    def super_settings(self) -> dict[str, Any]:
        return self.client_settings(SUPER_USER)


def _security_properties(security: BrokerSecurity) -> str:
    # The controller listener stays PLAINTEXT on loopback; the broker's own registration
    # arrives there as User:ANONYMOUS, which is why that principal is a super user.
    admin_password = security.passwords[SUPER_USER]
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{SUPER_USER}" password="{admin_password}";'
    )
    return f"""sasl.enabled.mechanisms={SCRAM_MECHANISM}
sasl.mechanism.inter.broker.protocol={SCRAM_MECHANISM}
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={jaas}
ssl.keystore.type=PKCS12
ssl.keystore.location={security.keystore_file}
ssl.keystore.password={security.keystore_password}
ssl.truststore.type=PEM
ssl.truststore.location={security.ca_file}
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:{SUPER_USER};User:ANONYMOUS
"""


def _make_certificate(java: str, folder: Path, password: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 with Java's keytool: (keystore, CA PEM)."""
    keytool = str(Path(java).parent / "keytool")
    keystore, ca = folder / "broker.p12", folder / "ca.pem"
    common = ["-keystore", str(keystore), "-storetype", "PKCS12", "-storepass", password]
    steps = [
        [keytool, "-genkeypair", "-alias", "broker", "-keyalg", "RSA", "-keysize", "2048",
         "-validity", "7", "-dname", "CN=127.0.0.1", "-ext", "SAN=ip:127.0.0.1,dns:localhost",
         "-keypass", password, *common],
        [keytool, "-exportcert", "-rfc", "-alias", "broker", "-file", str(ca), *common],
    ]  # fmt: skip
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BrokerUnavailableError(f"keytool failed: {done.stdout}{done.stderr}"[-2000:])
    return keystore, ca


@dataclass
class LocalBroker:
    """A running broker started by this module."""

    bootstrap_servers: str
    pid: int
    data_dir: str
    log_file: str
    owns_data_dir: bool = True
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)
    security: BrokerSecurity | None = field(default=None, compare=False)

    def admin_settings(self) -> dict[str, Any]:
        """Client settings with every right: the super user's, or none on PLAINTEXT."""
        return self.security.super_settings() if self.security else {}

    def is_running(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        with contextlib.suppress(ChildProcessError):
            done, _ = os.waitpid(self.pid, os.WNOHANG)
            if done:
                return False
        return True

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the JVM, wait for a clean shutdown, SIGKILL if it hangs. Safe to repeat.

        The data directory is removed only when this module made it (``owns_data_dir``).
        """
        self.halt(signal.SIGTERM, grace_s)
        if self.owns_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def halt(self, sig: int = signal.SIGTERM, grace_s: float = 20.0) -> None:
        """End the JVM with ``sig`` (SIGKILL after ``grace_s``), keeping its data."""
        if self.is_running():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)
            deadline = time.monotonic() + grace_s
            while self.is_running() and time.monotonic() < deadline:
                time.sleep(0.1)
            if self.is_running():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                while self.is_running():
                    time.sleep(0.05)

    def to_json(self) -> str:
        return json.dumps(
            {
                "bootstrap_servers": self.bootstrap_servers,
                "pid": self.pid,
                "data_dir": self.data_dir,
                "log_file": self.log_file,
                "owns_data_dir": self.owns_data_dir,
            }
        )


def wait_until_ready(
    bootstrap_servers: str,
    timeout_s: float = 60.0,
    *,
    kafka_config: Mapping[str, Any] | None = None,
) -> None:
    """Block until the broker answers a metadata request. Its port is waited for first: a
    client sent at a port nobody listens on yet logs "unreachable", which a broker that
    is still starting is not."""
    from pyrula_stream.kafka.admin import broker_answers

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _listens(bootstrap_servers) and broker_answers(
            bootstrap_servers, timeout_s=2.0, kafka_config=kafka_config or {}
        ):
            return
        time.sleep(0.2)
    raise BrokerUnavailableError(
        f"Kafka at {bootstrap_servers} did not answer metadata within {timeout_s:.0f}s"
    )


def _listens(bootstrap_servers: str) -> bool:
    """Whether the first address accepts a TCP connection (true when it cannot be read)."""
    host, _, port = bootstrap_servers.split(",")[0].rpartition(":")
    if not host or not port.isdigit():
        return True
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def jvm_command(java: str, libs: Path, heap: str, data: Path) -> list[str]:
    """The JVM that runs one node: small heap, serial GC, logs in its data directory."""
    log_file = data / "broker.log"
    (data / "log4j2.properties").write_text(_LOG4J.format(log=log_file))
    return [
        java,
        f"-Xmx{heap}",
        "-Xms128m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        f"-Dlog4j2.configurationFile={data / 'log4j2.properties'}",
        "-cp",
        f"{libs}/*",
    ]


def launch_node(jvm: list[str], data: Path, die_with_parent: bool) -> subprocess.Popen[bytes]:
    """Start the node whose ``server.properties`` is in ``data`` (output to broker.out)."""
    with open(data / "broker.out", "ab") as out:
        return subprocess.Popen(
            [*jvm, "kafka.Kafka", str(data / "server.properties")],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if die_with_parent else os.setsid,
        )


def format_storage(
    jvm: list[str],
    props: Path,
    security: BrokerSecurity | None = None,
    cluster_id: str | None = None,
) -> None:
    """A new cluster's storage; a secured one gets its SCRAM users now (KRaft has no other
    way before the first start). The nodes of one cluster share its ``cluster_id``."""
    cluster_id = cluster_id or new_cluster_id()
    scram = [
        arg
        for name, password in (security.passwords.items() if security else ())
        for arg in ("--add-scram", f"{SCRAM_MECHANISM}=[name={name},password={password}]")
    ]
    fmt = subprocess.run(
        [
            *jvm,
            "kafka.tools.StorageTool",
            "format",
            f"--cluster-id={cluster_id}",
            "-c",
            str(props),
            *scram,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if fmt.returncode != 0:
        raise BrokerUnavailableError(f"formatting Kafka storage failed:\n{fmt.stderr[-2000:]}")


def start_local_broker(
    *,
    data_dir: Path | None = None,
    port: int | None = None,
    die_with_parent: bool = True,
    heap: str = "768m",
    scram_users: Mapping[str, str] | None = None,
    advertised_port: int | None = None,
) -> LocalBroker:
    """Start a single-node KRaft broker; return once it answers.

    A ``data_dir`` this function formatted before is started again as it was, on its
    previous port unless ``port`` says otherwise; a new one is formatted first.
    With ``scram_users`` (name -> password) the client listener is SASL_SSL: those users
    and a super user ``admin`` are created at format time, a certificate for 127.0.0.1 is
    made now, and KRaft's ``StandardAuthorizer`` denies whatever no ACL allows (a secured
    broker always starts from a new ``data_dir``: its passwords are not kept).
    ``advertised_port`` sends clients to another port than the one it listens on (a
    proxy in front of it, as the chaos harness's ``PartitionProxy``).
    """
    java = check_java()
    libs = fetch_jars()
    owns = data_dir is None
    data = Path(data_dir or tempfile.mkdtemp(prefix="pyrula-kafka-"))
    data.mkdir(parents=True, exist_ok=True)
    props = data / "server.properties"
    previous = _previous_ports(props)
    port = port or (previous[0] if previous else free_port())
    controller_port = previous[1] if previous else free_port()
    security = None
    if scram_users is not None:
        if previous is not None:
            raise ConfigurationError(
                f"{data} holds a broker formatted before; a secured local broker "
                "(scram_users) starts from a new data_dir"
            )
        store_password = uuid.uuid4().hex
        keystore, ca = _make_certificate(java, data, store_password)
        passwords = {**scram_users, SUPER_USER: uuid.uuid4().hex}
        security = BrokerSecurity(str(ca), str(keystore), passwords, store_password)
    props.write_text(server_properties(data, port, controller_port, security, advertised_port))
    jvm = jvm_command(java, libs, heap, data)
    if previous is None:
        format_storage(jvm, props, security)
    proc = launch_node(jvm, data, die_with_parent)
    broker = LocalBroker(
        f"127.0.0.1:{port}", proc.pid, str(data), str(data / "broker.log"), owns, proc, security
    )
    try:
        wait_until_ready(broker.bootstrap_servers, kafka_config=broker.admin_settings())
    except BaseException:
        tail = (data / "broker.out").read_text(errors="replace")[-3000:]
        broker.stop()
        raise BrokerUnavailableError(f"the local Kafka broker did not start:\n{tail}") from None
    return broker
