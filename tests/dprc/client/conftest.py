"""A real ``dprc serve`` (embedded worker, SQLite under tmp, tiny models) as a subprocess, keys
from ``dprc keys create``, and the ``dprc`` client run as a subprocess against it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import _free_port

DPRC = [sys.executable, "-m", "dprc.cli"]


@dataclass
class Served:
    url: str
    env: dict[str, str]  # the client's environment: no server, no key, a private config path
    keys: dict[str, str]

    def run(
        self, *argv: str, tenant: str | None = "a", timeout: float = 300, **env: str
    ) -> subprocess.CompletedProcess[str]:
        e = dict(self.env)
        e["DPRC_SERVER_URL"] = self.url
        if tenant is not None:
            e["DPRC_API_KEY"] = self.keys[tenant]
        e.update(env)
        return subprocess.run(
            [*DPRC, *argv], env=e, capture_output=True, text=True, timeout=timeout
        )

    def ok(self, *argv: str, **kw) -> subprocess.CompletedProcess[str]:
        out = self.run(*argv, **kw)
        assert out.returncode == 0, (argv, out.returncode, out.stderr)
        return out

    def json(self, *argv: str, **kw):
        return json.loads(self.ok(*argv, "--json", **kw).stdout)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("dprc-serve")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRC_")}
    env.update(
        DPRC_DATA_DIR=str(tmp / "data"),
        DPRC_MAX_PHYSICAL_BATCH_SIZE="8",
        DPRC_LOG_LEVEL="warning",
        HF_HUB_OFFLINE="1",
    )
    keys = {}
    for tenant in ("a", "b"):
        keys[tenant] = subprocess.run(
            # admin: the tests also change budgets, which only admins may
            [*DPRC, "keys", "create", "--tenant", tenant, "--role", "admin"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    port = _free_port()
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen(
        [*DPRC, "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(f"{url}/healthz", timeout=5)
                break
            except httpx.TransportError:
                assert proc.poll() is None, (tmp / "server.log").read_text()
                assert time.monotonic() < deadline, "dprc serve did not start"
                time.sleep(0.3)
        client_env = {k: v for k, v in env.items() if k != "DPRC_DATA_DIR"}
        client_env["DPRC_CLIENT_CONFIG"] = str(tmp / "client.toml")
        yield Served(url, client_env, keys)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def write_lines(path: Path, lines: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path
