"""Deployment files (docker-compose.yml, docker/Dockerfile.*, docs/deploy.md): structural
checks with PyYAML, plus `config -q` by a Compose binary when one is installed. No Docker
daemon is needed; nothing is built or pulled."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
API_DOCKERFILE = ROOT / "docker" / "Dockerfile.api"
WORKER_DOCKERFILE = ROOT / "docker" / "Dockerfile.worker"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"

WORKER_COMMAND = [
    "celery",
    "-A",
    "worker.celery_app",
    "worker",
    "-Q",
    "gpu",
    "--concurrency",
    "1",
    "--prefetch-multiplier",
    "1",
    "-l",
    "info",
]
API_COMMAND = ["dprc", "serve", "--host", "0.0.0.0", "--port", "8000"]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _service(compose: dict, name: str) -> dict:
    return compose["services"][name]


def _mounts(service: dict) -> dict[str, tuple[str, bool]]:
    """Volume mounts of a service: target path -> (source, read_only)."""
    out: dict[str, tuple[str, bool]] = {}
    for entry in service.get("volumes", []):
        if isinstance(entry, str):
            parts = entry.split(":")
            source, target = parts[0], parts[1]
            read_only = len(parts) > 2 and "ro" in parts[2].split(",")
        else:
            source, target = entry["source"], entry["target"]
            read_only = bool(entry.get("read_only", False))
        out[target] = (source, read_only)
    return out


def _environment(service: dict) -> dict[str, str | None]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return {k: v for k, _, v in (item.partition("=") for item in env)}
    return dict(env)


def _depends_on(service: dict) -> dict[str, str | None]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps)
    return {name: (spec or {}).get("condition") for name, spec in deps.items()}


def _healthcheck_text(service: dict) -> str:
    test = service["healthcheck"]["test"]
    return " ".join(test) if isinstance(test, list) else test


def _command(service: dict) -> list[str]:
    cmd = service["command"]
    return cmd if isinstance(cmd, list) else cmd.split()


def _dockerfile_args(text: str) -> dict[str, str]:
    args = {}
    for m in re.finditer(r"^ARG\s+(\w+)(?:=(.*))?$", text, re.M):
        args[m.group(1)] = (m.group(2) or "").strip().strip('"')
    return args


def _torch_pin() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = [d for d in deps if re.match(r"torch\s*==", d)]
    assert len(pins) == 1, deps
    return pins[0].split("==", 1)[1].strip()


def test_services_present(compose):
    assert {"redis", "postgres", "api", "worker"} <= set(compose["services"])


def test_postgres_has_volume_and_pg_isready(compose):
    pg = _service(compose, "postgres")
    source, read_only = _mounts(pg)["/var/lib/postgresql/data"]
    assert source in compose["volumes"] and not read_only
    assert "pg_isready" in _healthcheck_text(pg)


def test_redis_has_healthcheck(compose):
    assert "ping" in _healthcheck_text(_service(compose, "redis"))


def test_api_service(compose):
    api = _service(compose, "api")
    assert _command(api) == API_COMMAND
    assert api["build"]["dockerfile"] == "docker/Dockerfile.api"
    assert any(str(p).split(":")[-1] == "8000" for p in api["ports"])
    assert _depends_on(api) == {"redis": "service_healthy", "postgres": "service_healthy"}
    # readiness: the database answers at the migration head and the broker answers (/readyz)
    assert "/readyz" in _healthcheck_text(api)
    assert "8000" in _healthcheck_text(api)


def test_worker_service(compose):
    worker = _service(compose, "worker")
    assert _command(worker) == WORKER_COMMAND
    assert worker["build"]["dockerfile"] == "docker/Dockerfile.worker"
    assert "BASE_IMAGE" in worker["build"]["args"]
    deps = _depends_on(worker)
    assert deps["redis"] == deps["postgres"] == "service_healthy"
    assert "ports" not in worker


def test_worker_reserves_one_nvidia_gpu(compose):
    devices = _service(compose, "worker")["deploy"]["resources"]["reservations"]["devices"]
    assert len(devices) == 1
    (dev,) = devices
    assert dev["driver"] == "nvidia"
    assert dev["count"] == 1
    assert dev["capabilities"] == ["gpu"]


def test_api_and_worker_share_data_volume_at_same_path(compose):
    api, worker = _service(compose, "api"), _service(compose, "worker")
    api_env, worker_env = _environment(api), _environment(worker)
    data_dir = api_env["DPRC_DATA_DIR"]
    assert worker_env["DPRC_DATA_DIR"] == data_dir
    api_src, api_ro = _mounts(api)[data_dir]
    worker_src, worker_ro = _mounts(worker)[data_dir]
    assert api_src == worker_src
    assert api_src in compose["volumes"]  # a named volume, not a per-container path
    assert not api_ro and not worker_ro


def test_models_volume_read_only_in_api_and_worker(compose):
    for name in ("api", "worker"):
        source, read_only = _mounts(_service(compose, name))["/models"]
        assert source in compose["volumes"]
        assert read_only, name


def test_api_and_worker_use_same_store_and_broker(compose):
    api_env = _environment(_service(compose, "api"))
    worker_env = _environment(_service(compose, "worker"))
    for key in ("DPRC_DATABASE_URL", "DPRC_BROKER_URL"):
        assert api_env[key] == worker_env[key], key
    assert api_env["DPRC_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "@postgres:5432/" in api_env["DPRC_DATABASE_URL"]
    assert api_env["DPRC_BROKER_URL"].startswith("redis://redis:6379")


def test_only_the_api_publishes_a_port_beyond_localhost(compose):
    """The API is the service's one public port; the monitoring profile's Prometheus and
    Grafana publish theirs on 127.0.0.1 only; the database and the broker publish none."""
    published = {name for name, svc in compose["services"].items() if svc.get("ports")}
    assert published == {"api", "prometheus", "grafana"}
    for name in ("prometheus", "grafana"):
        service = _service(compose, name)
        assert service["profiles"] == ["monitoring"]
        assert all(str(p).startswith("127.0.0.1:") for p in service["ports"]), name


def test_worker_dockerfile_base_image_arg():
    text = WORKER_DOCKERFILE.read_text()
    args = _dockerfile_args(text.split("\nFROM ", 1)[0])
    assert "BASE_IMAGE" in args and args["BASE_IMAGE"], "BASE_IMAGE ARG with a default"
    assert re.search(r"^FROM \$\{?BASE_IMAGE\}?\s*$", text, re.M)
    assert args["BASE_IMAGE"].startswith("pytorch/pytorch:")
    assert "cuda" in args["BASE_IMAGE"]


def test_api_dockerfile_slim_non_root_with_healthcheck():
    text = API_DOCKERFILE.read_text()
    pre_from = _dockerfile_args(text.split("\nFROM ", 1)[0])
    assert pre_from.get("PYTHON_IMAGE") == "python:3.11-slim"
    assert re.search(r"^FROM \$\{?PYTHON_IMAGE\}?\s*$", text, re.M)
    assert re.search(r"^HEALTHCHECK .*?/healthz", text, re.M | re.S)


@pytest.mark.parametrize("dockerfile", [API_DOCKERFILE, WORKER_DOCKERFILE], ids=lambda p: p.name)
def test_dockerfile_common_rules(dockerfile):
    text = dockerfile.read_text()
    # the torch pin of the image is the project's
    assert _dockerfile_args(text)["TORCH_VERSION"] == _torch_pin()
    # runs as a non-root user, and the last USER wins
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0")
    # offline: no hub downloads at run time
    for var in ("HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1"):
        assert var in text
    # everything it copies exists (build context: the repository root)
    for m in re.finditer(r"^COPY\s+(?!--from)(.+?)\s+\S+\s*$", text, re.M):
        for src in m.group(1).split():
            assert (ROOT / src).exists(), f"{dockerfile.name}: COPY {src}"


def test_dockerignore_keeps_context_small():
    lines = set((ROOT / ".dockerignore").read_text().split())
    for entry in (".git", ".venv", "dprc-data", ".env"):
        assert entry in lines


def test_deploy_doc_snippets_parse_and_cover_topics():
    text = DEPLOY_DOC.read_text()
    for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
        assert isinstance(yaml.safe_load(block), dict)
    for topic in (
        "resume/",
        "NFS",
        "## Backups",
        "## Upgrades",
        "dprc keys create",
        "torch==2.13.0",
        "Docker daemon",
    ):
        assert topic in text, topic


def _compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, text=True, timeout=30
        )
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


def test_compose_config_validates():
    cmd = _compose_command()
    if cmd is None:
        pytest.skip("no docker-compose binary and no `docker compose` plugin on PATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPRC_", "POSTGRES_"))}
    result = subprocess.run(
        [*cmd, "-f", str(COMPOSE_FILE), "config", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stderr
