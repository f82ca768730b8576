"""``make deploy-check``: the image and the chart, checked on this machine.

1. Tools: ``helm`` (built from the Go module proxy into ``.tools/bin`` when missing),
   ``kubernetes-validate`` (in ``.venv-deploy``), the CRDs of KEDA and the Prometheus
   Operator (module zips from the Go proxy), and docker or podman.
2. The image: ``BASE_IMAGE`` if set, else ``python:3.11-slim`` if the registry answers,
   else a Debian base made here with debootstrap and imported (cached); then the
   project's image, and an image FROM it with ``deploy/check_agent.py`` added.
3. Containers against a local broker: topics applied from a container, two worker
   containers and a gateway container; turns submitted through the gateway; one worker
   stopped with SIGTERM mid-load, as Kubernetes stops a pod: every turn completes once.
4. The chart rendered for each file of ``deploy/helm/checks/`` and every manifest
   validated against the Kubernetes API schema (and the CRDs' schemas for KEDA's and
   the Prometheus Operator's kinds).

Each step prints how long it took. ``--only chart`` runs the tools and chart steps
alone; ``--only image`` builds ``pyrula-stream:<version>`` (``make image``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from pyrula_stream._version import __version__

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".tools"
DEPLOY_VENV = ROOT / ".venv-deploy"
CHART = ROOT / "deploy" / "helm" / "pyrula-stream"
CHECKS = ROOT / "deploy" / "helm" / "checks"
HELM_MODULE = "helm.sh/helm/v4/cmd/helm@v4.3.2"
KUBERNETES_VERSION = "1.33.0"
KUBERNETES_VALIDATE = "kubernetes-validate>=1.33.0"
CRD_SOURCES = {
    # kind -> (Go module, version, path of the CRD in the module's zip)
    "ScaledObject": (
        "github.com/kedacore/keda/v2",
        "v2.21.1",
        "config/crd/bases/keda.sh_scaledobjects.yaml",
    ),
    "TriggerAuthentication": (
        "github.com/kedacore/keda/v2",
        "v2.21.1",
        "config/crd/bases/keda.sh_triggerauthentications.yaml",
    ),
    "ServiceMonitor": (
        "github.com/prometheus-operator/prometheus-operator",
        "v0.85.0",
        "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",
    ),
}
IMAGE = "localhost/pyrula-stream:check"
CHECK_IMAGE = "localhost/pyrula-stream-check:latest"
DEBIAN_BASE = "localhost/pyrula-base:bookworm"
TURNS = 24


# --- steps and tools ---------------------------------------------------------------------


@contextlib.contextmanager
def step(name: str, timings: dict[str, float]) -> Iterator[None]:
    print(f"--- {name}", flush=True)
    start = time.monotonic()
    try:
        yield
    finally:
        timings[name] = round(time.monotonic() - start, 1)
        print(f"--- {name}: {timings[name]} s", flush=True)


def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """A command whose failure ends the check, with its output."""
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)
    if done.returncode != 0:
        output = done.stdout[-3000:] + done.stderr[-3000:]
        sys.exit(f"failed ({done.returncode}): {' '.join(cmd)}\n{output}")
    return done


def helm() -> str:
    found = shutil.which("helm") or (TOOLS / "bin" / "helm")
    if Path(found).exists():
        return str(found)
    go = shutil.which("go")
    if go is None:
        sys.exit("helm is missing and Go is not installed to build it (https://go.dev/dl)")
    env = {**os.environ, "GOBIN": str(TOOLS / "bin")}
    run([go, "install", HELM_MODULE], env=env)
    return str(TOOLS / "bin" / "helm")


def validator_python() -> str:
    python = DEPLOY_VENV / "bin" / "python"
    if not python.exists():
        run([sys.executable, "-m", "venv", str(DEPLOY_VENV)])
        run([str(python), "-m", "pip", "install", "-q", KUBERNETES_VALIDATE])
    return str(python)


def crd_schema(kind: str) -> dict[str, Any]:
    """The OpenAPI schema of a CRD's served version, from its module's zip (cached)."""
    module, version, path = CRD_SOURCES[kind]
    cache = TOOLS / "crds" / f"{kind}.json"
    if cache.exists():
        return json.loads(cache.read_text())  # type: ignore[no-any-return]
    proxy = os.environ.get("GOPROXY", "https://proxy.golang.org").split(",")[0]
    escaped = "".join(f"!{c.lower()}" if c.isupper() else c for c in module)
    with urllib.request.urlopen(f"{proxy}/{escaped}/@v/{version}.zip", timeout=120) as r:
        archive = zipfile.ZipFile(io.BytesIO(r.read()))
    crd = yaml.safe_load(archive.read(f"{module}@{version}/{path}"))
    (served,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    schema = served["schema"]["openAPIV3Schema"]
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(schema))
    return schema  # type: ignore[no-any-return]


def container_tool() -> list[str]:
    """docker, else podman (with the runtime and limits a sandboxed machine accepts)."""
    if (
        shutil.which("docker")
        and subprocess.run(["docker", "info"], capture_output=True).returncode == 0
    ):
        return ["docker"]
    if shutil.which("podman"):
        return ["podman"]
    sys.exit("neither docker nor podman is installed")


def run_flags(tool: list[str]) -> list[str]:
    extra = os.environ.get("PYRULA_CONTAINER_RUN_ARGS")
    if extra is not None:
        return extra.split()
    if tool[0] == "podman":
        return ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]
    return []


def tool_flags(tool: list[str]) -> list[str]:
    """Global flags: podman with runc where crun is refused."""
    if tool[0] == "podman" and shutil.which("runc"):
        return ["--runtime", shutil.which("runc") or "runc"]
    return []


# --- the chart ---------------------------------------------------------------------------


def check_chart(timings: dict[str, float]) -> None:
    with step("tools for the chart", timings):
        helm_bin, python = helm(), validator_python()
    for values in sorted(CHECKS.glob("*.yaml")):
        with step(f"chart: {values.name}", timings):
            rendered = run([helm_bin, "template", "check", str(CHART), "-f", str(values)]).stdout
            docs = [d for d in yaml.safe_load_all(rendered) if d]
            core = [d for d in docs if d["kind"] not in CRD_SOURCES]
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
                yaml.safe_dump_all(core, f)
            run([python, "-m", "kubernetes_validate", "-k", KUBERNETES_VERSION, "--strict", f.name])
            for doc in docs:
                if doc["kind"] in CRD_SOURCES:
                    validate_custom(doc)
            kinds = ", ".join(sorted({d["kind"] for d in docs}))
            print(f"{values.name}: {len(docs)} manifests valid ({kinds})")
    with step("chart: values it refuses", timings):
        for bad, why in (
            (["--set", "worker.terminationGracePeriodSeconds=20"], "must exceed"),
            (["--set", "keda.enabled=true", "--set", "keda.maxReplicas=7"], "must not exceed"),
        ):
            done = subprocess.run(
                [
                    helm_bin,
                    "template",
                    "check",
                    str(CHART),
                    "-f",
                    str(CHECKS / "default.yaml"),
                    *bad,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode == 0 or why not in done.stderr:
                sys.exit(f"the chart took {bad}: {done.stderr[-500:]}")


def validate_custom(doc: dict[str, Any]) -> None:
    from jsonschema import Draft202012Validator

    schema = crd_schema(doc["kind"])
    spec_errors = [
        f"{list(e.absolute_path)}: {e.message}"
        for e in Draft202012Validator(schema).iter_errors(doc)
    ]
    if spec_errors:
        sys.exit(f"{doc['kind']} {doc['metadata']['name']}: {spec_errors}")


# --- the image and containers ----------------------------------------------------------


def base_image(tool: list[str]) -> str:
    if os.environ.get("BASE_IMAGE"):
        return os.environ["BASE_IMAGE"]
    try:
        pulled = subprocess.run(
            [*tool, "pull", "-q", "python:3.11-slim"], capture_output=True, timeout=120, check=False
        )
    except subprocess.TimeoutExpired:
        pulled = subprocess.CompletedProcess([], 1)
    if pulled.returncode == 0:
        return "python:3.11-slim"
    if (
        subprocess.run([*tool, "image", "inspect", DEBIAN_BASE], capture_output=True).returncode
        == 0
    ):
        return DEBIAN_BASE
    if shutil.which("debootstrap") is None:
        sys.exit("no base image: set BASE_IMAGE, reach a registry, or install debootstrap")
    root = Path(tempfile.mkdtemp(prefix="pyrula-base-"))
    run(
        [
            "debootstrap",
            "--variant=minbase",
            "--include=python3,python3-venv,ca-certificates,passwd",
            "bookworm",
            str(root),
            os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian"),
        ]
    )
    (root / "usr" / "local" / "bin" / "python").symlink_to("/usr/bin/python3")
    # The machine's trust store: a base made here reaches PyPI the way this machine does
    # (through a proxy whose CA only this machine's bundle holds, where there is one).
    bundle = Path(os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt"))
    if bundle.exists():
        shutil.copy(bundle, root / "etc" / "ssl" / "certs" / "ca-certificates.crt")
    tar = root.with_suffix(".tar")
    run(["tar", "-C", str(root), "-cf", str(tar), "."])
    run(
        [
            *tool,
            "import",
            "--change",
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            str(tar),
            DEBIAN_BASE,
        ]
    )
    shutil.rmtree(root, ignore_errors=True)
    tar.unlink()
    return DEBIAN_BASE


def build_images(tool: list[str], base: str) -> None:
    run(
        [
            *tool,
            *tool_flags(tool),
            "build",
            "--build-arg",
            f"BASE_IMAGE={base}",
            "-t",
            IMAGE,
            str(ROOT),
        ]
    )
    with tempfile.TemporaryDirectory() as ctx:
        shutil.copy(ROOT / "deploy" / "check_agent.py", Path(ctx) / "check_agent.py")
        (Path(ctx) / "Dockerfile").write_text(
            f"FROM {IMAGE}\nCOPY --chown=10001:10001 check_agent.py /app/check_agent.py\n"
        )
        run([*tool, *tool_flags(tool), "build", "--network", "host", "-t", CHECK_IMAGE, ctx])


class Containers:
    """Containers of this check, on the host's network, removed at the end."""

    def __init__(self, tool: list[str], bootstrap: str) -> None:
        self.tool, self.bootstrap = tool, bootstrap
        self.names: list[str] = []

    def start(self, name: str, *args: str) -> None:
        run(
            [
                *self.tool,
                *tool_flags(self.tool),
                "run",
                "-d",
                "--name",
                name,
                "--network",
                "host",
                *run_flags(self.tool),
                "-e",
                f"KAFKA_BOOTSTRAP_SERVERS={self.bootstrap}",
                CHECK_IMAGE,
                *args,
            ]
        )
        self.names.append(name)

    def once(self, *args: str) -> str:
        return run(
            [
                *self.tool,
                *tool_flags(self.tool),
                "run",
                "--rm",
                "--network",
                "host",
                *run_flags(self.tool),
                "-e",
                f"KAFKA_BOOTSTRAP_SERVERS={self.bootstrap}",
                CHECK_IMAGE,
                *args,
            ]
        ).stdout

    def stop(self, name: str) -> int:
        """SIGTERM, then wait for the exit, as the kubelet does; the exit code."""
        run([*self.tool, *tool_flags(self.tool), "kill", "--signal", "TERM", name])
        waited = run([*self.tool, *tool_flags(self.tool), "wait", name], timeout=120)
        return int(waited.stdout.strip().splitlines()[-1])

    def logs(self, name: str) -> str:
        done = subprocess.run(
            [*self.tool, "logs", name], capture_output=True, text=True, check=False
        )
        return done.stdout + done.stderr

    def remove_all(self) -> None:
        for name in self.names:
            subprocess.run([*self.tool, "rm", "-f", name], capture_output=True, check=False)


async def wait_http(url: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient() as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(url, timeout=2)).status_code == 200:
                    return
            await asyncio.sleep(0.5)
    sys.exit(f"{url} never answered 200")


async def load_with_a_stop(c: Containers, bootstrap: str) -> dict[str, Any]:
    """Turns through the gateway; worker-a stopped with SIGTERM while they run."""
    from pyrula_stream.testing import read_topic
    from pyrula_stream.wire.events import decode_event

    await wait_http("http://127.0.0.1:19401/readyz")
    await wait_http("http://127.0.0.1:19402/readyz")
    await wait_http("http://127.0.0.1:18000/readyz")
    turn_ids: list[str] = []
    async with httpx.AsyncClient(base_url="http://127.0.0.1:18000/agents/check") as http:
        for i in range(TURNS):
            r = await http.post("/turns", json={"n": i}, timeout=30)
            r.raise_for_status()
            turn_ids.append(r.json()["turn_id"])
            if i == TURNS // 2:
                exit_code = await asyncio.to_thread(c.stop, "pyrula-check-worker-a")
        deadline = time.monotonic() + 180
        pending = set(turn_ids)
        while pending and time.monotonic() < deadline:
            for turn_id in list(pending):
                status = (await http.get(f"/turns/{turn_id}", timeout=30)).json()
                if status.get("state") in ("completed", "failed"):
                    pending.discard(turn_id)
            await asyncio.sleep(1)
    ends: dict[str, int] = {}
    started_by: dict[str, str] = {}
    for _, value, headers in read_topic(bootstrap, "pyrula.check.events"):
        event = decode_event(value or b"", headers)
        if event.is_terminal:
            ends[event.turn_id] = ends.get(event.turn_id, 0) + 1
        if event.type == "run:start":
            started_by[event.turn_id] = str(event.data.get("worker"))
    after_stop = turn_ids[TURNS // 2 + 1 :]
    lost = [t for t in turn_ids if t not in ends]
    doubled = [t for t, n in ends.items() if n > 1]
    return {
        "turns": len(turn_ids),
        "lost": len(lost),
        "doubled": len(doubled),
        "not_finished_by_status": len(pending),
        "stopped_worker_exit_code": exit_code,
        "started_on_a": sum(1 for w in started_by.values() if w.endswith("check-a")),
        "started_on_b": sum(1 for w in started_by.values() if w.endswith("check-b")),
        "after_stop_not_on_b": sum(
            1 for t in after_stop if not started_by.get(t, "").endswith("check-b")
        ),
    }


def check_containers(timings: dict[str, float]) -> dict[str, Any]:
    from pyrula_stream.testing import local_kafka

    tool = container_tool()
    with step("base image", timings):
        base = base_image(tool)
        print(f"base: {base}")
    with step("image", timings):
        build_images(tool, base)
    with local_kafka() as bootstrap:
        c = Containers(tool, bootstrap)
        try:
            with step("topics from a container", timings):
                print(c.once("topics", "apply", "check_agent:agent", "--partitions", "4"))
            with step("workers, gateway, turns, a SIGTERM", timings):
                for name, port in (("a", 19401), ("b", 19402)):
                    c.start(
                        f"pyrula-check-worker-{name}",
                        "worker",
                        "check_agent:agent",
                        f"--worker-id=check-{name}",
                        "--health-host=0.0.0.0",
                        f"--health-port={port}",
                        "--shutdown-grace=20",
                    )
                c.start(
                    "pyrula-check-gateway",
                    "gateway",
                    "check_agent:agent",
                    "--host=0.0.0.0",
                    "--port=18000",
                    "--allow-unauthenticated",
                )
                result = asyncio.run(load_with_a_stop(c, bootstrap))
                print(json.dumps(result))
                if result["lost"] or result["doubled"] or result["not_finished_by_status"]:
                    print(c.logs("pyrula-check-worker-a")[-3000:])
                    sys.exit(f"turns lost or doubled: {result}")
                if result["after_stop_not_on_b"] or not result["started_on_a"]:
                    sys.exit(f"the turns did not move to worker b after the stop: {result}")
                if result["stopped_worker_exit_code"] != 0:
                    sys.exit(f"the stopped worker exited {result['stopped_worker_exit_code']}")
                return result
        finally:
            c.remove_all()


def revision() -> str:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(prog="make deploy-check")
    parser.add_argument("--only", choices=["chart", "containers", "image"], default=None)
    args = parser.parse_args()
    timings: dict[str, float] = {}
    start = time.monotonic()
    result: dict[str, Any] = {}
    if args.only == "image":
        tool = container_tool()
        base = base_image(tool)
        build_args = [f"BASE_IMAGE={base}", f"VERSION={__version__}", f"REVISION={revision()}"]
        run(
            [*tool, *tool_flags(tool), "build", "--network", "host"]
            + [arg for pair in build_args for arg in ("--build-arg", pair)]
            + ["-t", f"pyrula-stream:{__version__}", str(ROOT)]
        )
        print(f"built pyrula-stream:{__version__} on {base} with {tool[0]}")
        return 0
    if args.only in (None, "chart"):
        check_chart(timings)
    if args.only in (None, "containers"):
        result = check_containers(timings)
    print(
        json.dumps(
            {"ok": True, "seconds": round(time.monotonic() - start, 1), "steps": timings, **result}
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
