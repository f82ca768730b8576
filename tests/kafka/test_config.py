"""One client configuration, everywhere: the factory, the properties file, redaction, and an
enumeration of every place the package builds a Kafka client.

That the settings really work end to end is shown on a SASL_SSL broker in
``test_secured_kafka.py`` (a client missing them could not even connect there).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

import pyrula_stream
from pyrula_stream import KafkaAgentClient, WorkerOptions
from pyrula_stream.errors import ConfigurationError
from pyrula_stream.kafka.config import (
    KAFKA_CONFIG_ENV,
    client_config,
    load_properties,
    new_producer,
    property_name,
    settings_from_env,
)
from pyrula_stream.redaction import redacted

PACKAGE = Path(pyrula_stream.__file__).parent
CLIENT_CLASSES = {"Producer", "Consumer", "AdminClient", "SchemaRegistryClient"}
FACTORY = PACKAGE / "kafka" / "config.py"
# Calls that may leave kafka_config out: the default options of a caller that was given
# none (they read PYRULA_KAFKA_CONFIG), offline replay (no Kafka), and a method that
# shares a builder's name.
MAY_OMIT = {
    ("runtime/mesh.py", "WorkerOptions"),
    ("runtime/replay.py", "WorkerOptions"),
    ("runtime/worker.py", "WorkerOptions"),
    ("runtime/execution.py", "load_recording"),  # self.load_recording, a callback
    ("gateway/app.py", "AppOptions"),  # the default options: the environment's settings
    ("runtime/offline.py", "WorkerOptions"),  # a turn run offline: no Kafka at all
    ("objects/local.py", "resolve"),  # Path.resolve: the store's directory
    ("objects/s3_server.py", "resolve"),  # Path.resolve: where the server binary is built
}
# The benchmark and chaos harnesses run on the environment's settings (PYRULA_KAFKA_CONFIG),
# which is what every client falls back to without an explicit kafka_config.
ENVIRONMENT_ONLY = ("bench", "chaos")


@functools.cache
def _modules() -> list[tuple[Path, ast.Module]]:
    """Every module of the package, parsed once for the scans below (nothing mutates them)."""
    return [(p, ast.parse(p.read_text())) for p in sorted(PACKAGE.rglob("*.py"))]


def _name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")


def _builds_a_client(call: ast.Call) -> bool:
    """``Producer(conf)``, or a client class handed to a builder: ``_build(Producer, conf)``."""
    handed = any(isinstance(a, ast.Name) and a.id in CLIENT_CLASSES for a in call.args)
    return _name(call) in CLIENT_CLASSES or handed


def test_clients_are_constructed_only_in_the_factory() -> None:
    built_at = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and _builds_a_client(node)
    ]
    assert built_at, "the scan found no client construction at all"
    assert {site.split(":")[0] for site in built_at} <= {"kafka/config.py"}, built_at


def _takes_settings() -> dict[str, int | None]:
    """Every function, method and class of the package with a ``kafka_config`` parameter
    (or dataclass field): its name -> the parameter's position (None: keyword-only)."""
    found: dict[str, int | None] = {}
    for _, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                fields = [
                    b.target.id
                    for b in node.body
                    if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name)
                ]
                if "kafka_config" in fields:
                    found[node.name] = fields.index("kafka_config")
                init = next(
                    (
                        b
                        for b in node.body
                        if isinstance(b, ast.FunctionDef) and b.name == "__init__"
                    ),
                    None,
                )
                if init is not None:
                    position = _position(init, skip_self=True)
                    if position != -1:
                        found[node.name] = position
                else:  # it inherits its base's __init__ (a base defined earlier in the file)
                    bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                    inherited = [found[b] for b in bases if b in found]
                    if inherited:
                        found[node.name] = inherited[0]
            elif (
                isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name != "__init__"
            ):
                position = _position(
                    node, skip_self=bool(node.args.args) and node.args.args[0].arg == "self"
                )
                if position != -1:
                    found[node.name] = position
    return found


def _position(func: ast.FunctionDef | ast.AsyncFunctionDef, *, skip_self: bool) -> int | None:
    """Where ``kafka_config`` sits among the positional parameters; None if keyword-only,
    -1 if absent."""
    positional = [a.arg for a in func.args.posonlyargs + func.args.args][int(skip_self) :]
    if "kafka_config" in positional:
        return positional.index("kafka_config")
    return None if any(a.arg == "kafka_config" for a in func.args.kwonlyargs) else -1


def test_every_client_builder_is_handed_the_users_settings() -> None:
    takes = _takes_settings()
    assert {"client_config", "KafkaAgentClient", "WorkerOptions", "TableWriter"} <= set(takes)
    missing = []
    checked = 0
    for path, tree in _modules():
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in ENVIRONMENT_ONLY or path == FACTORY:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or _name(node) not in takes:
                continue
            if (rel.as_posix(), _name(node)) in MAY_OMIT:
                continue
            checked += 1
            position = takes[_name(node)]
            by_keyword = any(k.arg in ("kafka_config", None) for k in node.keywords)
            by_position = position is not None and len(node.args) > position
            if not (by_keyword or by_position):
                missing.append(f"{rel}:{node.lineno} {_name(node)}(...)")
    assert checked > 20, f"the scan looked at only {checked} calls"
    assert not missing, "built without kafka_config:\n" + "\n".join(missing)


def test_the_factory_layers_defaults_user_settings_and_role_settings() -> None:
    user = {"security.protocol": "SASL_SSL", "client.id": "billing", "isolation.level": "x"}
    conf = client_config(
        "b:9092", user, **{"client.id": "pyrula-w1", "isolation.level": "read_committed"}
    )
    assert conf["security.protocol"] == "SASL_SSL"
    assert conf["client.id"] == "billing", "the user's client.id wins (quotas key on it)"
    assert conf["isolation.level"] == "read_committed", "what the role depends on wins"
    assert conf["bootstrap.servers"] == "b:9092"
    assert conf["socket.nagle.disable"] is True


def test_without_explicit_settings_the_environments_file_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "client.properties"
    path.write_text("# comment\n! also a comment\n\nsecurity.protocol = SSL\nclient.id: ops\n")
    monkeypatch.setenv(KAFKA_CONFIG_ENV, str(path))
    assert client_config("b:1")["security.protocol"] == "SSL"
    assert "client.id" not in client_config("b:1", {}), "explicit settings replace the file"
    assert WorkerOptions().kafka_config == {"security.protocol": "SSL", "client.id": "ops"}
    assert KafkaAgentClient("b:1").kafka_config["client.id"] == "ops"


def test_a_bad_properties_line_is_named_without_echoing_a_secret(tmp_path: Path) -> None:
    path = tmp_path / "bad.properties"
    path.write_text("security.protocol=SASL_SSL\nsasl.password hunter2-hunter2\n")
    with pytest.raises(ConfigurationError, match=r"bad\.properties:2: expected key=value") as exc:
        load_properties(path)
    assert "hunter2-hunter2" not in str(exc.value)
    with pytest.raises(ConfigurationError, match="cannot read"):
        load_properties(tmp_path / "missing.properties")


def test_secrets_never_show_in_reprs_or_client_errors() -> None:
    secret = "s3cret-value-9b1e"
    settings = {
        "sasl.username": "u",
        "sasl.password": secret,
        "ssl.key.password": secret,
        "ssl.keystore.password": secret,
    }
    assert secret not in repr(WorkerOptions(kafka_config=settings, producer_config=settings))
    assert secret not in repr(KafkaAgentClient("b:1", kafka_config=settings).kafka_config)
    assert redacted(settings)["sasl.password"] == "[redacted]"
    with pytest.raises(ConfigurationError, match="invalid Kafka client settings") as exc:
        # librdkafka refuses the value and quotes it; the factory's error must not.
        new_producer(client_config("b:1", {**settings, "security.protocol": secret}))
    assert secret not in str(exc.value)


@pytest.mark.parametrize(
    ("variable", "key"),
    [
        ("PYRULA_KAFKA_SASL_PASSWORD", "sasl.password"),
        ("PYRULA_KAFKA_SECURITY_PROTOCOL", "security.protocol"),
        ("PYRULA_KAFKA_SASL_OAUTHBEARER_CLIENT_ID", "sasl.oauthbearer.client.id"),
        (
            "PYRULA_KAFKA_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO",
            "schema.registry.basic.auth.user.info",
        ),
        ("PYRULA_KAFKA_SOME__UNDERSCORED_KEY", "some_underscored.key"),
        ("PYRULA_KAFKA_SOME___DASHED_KEY", "some-dashed.key"),
    ],
)
def test_variables_name_properties_as_confluent_images_do(variable: str, key: str) -> None:
    assert property_name(variable) == key


def test_variables_go_over_the_environments_file_and_never_show(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "s3cret-from-a-k8s-secret"
    path = tmp_path / "client.properties"
    path.write_text("security.protocol=SASL_SSL\nsasl.username=file-user\nclient.id=ops\n")
    monkeypatch.setenv(KAFKA_CONFIG_ENV, str(path))
    monkeypatch.setenv("PYRULA_KAFKA_SASL_USERNAME", "env-user")
    monkeypatch.setenv("PYRULA_KAFKA_SASL_PASSWORD", secret)
    settings = settings_from_env()
    assert dict(settings) == {
        "security.protocol": "SASL_SSL",
        "sasl.username": "env-user",
        "sasl.password": secret,
        "client.id": "ops",
    }
    assert "config" not in settings, "PYRULA_KAFKA_CONFIG names the file, not a property"
    assert client_config("b:1")["sasl.password"] == secret
    assert WorkerOptions().kafka_config["sasl.username"] == "env-user"
    assert secret not in repr(settings) and secret not in repr(WorkerOptions())
    assert secret not in repr(KafkaAgentClient("b:1").kafka_config)


def test_variables_alone_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KAFKA_CONFIG_ENV, raising=False)
    monkeypatch.setenv("PYRULA_KAFKA_CLIENT_ID", "from-env")
    assert dict(settings_from_env()) == {"client.id": "from-env"}
    assert "client.id" not in client_config("b:1", {}), "explicit settings replace them"
