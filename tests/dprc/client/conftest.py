"""A real ``dprc serve`` (embedded worker, SQLite under tmp, tiny models) as a subprocess, keys
from ``dprc keys create``, and the ``dprc`` client run as a subprocess against it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.serve_process import dprc_serve

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
    yield from serving(tmp_path_factory.mktemp("dprc-serve"), ("a", "b"))


def serving(tmp: Path, tenants: tuple[str, ...], **settings: str) -> Iterator[Served]:
    """A ``dprc serve`` subprocess on a fresh data folder in ``tmp`` (``settings``: more
    ``DPRC_*`` variables), an admin key for each tenant, and the client's environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRC_")}
    env.update(
        DPRC_DATA_DIR=str(tmp / "data"),
        DPRC_MAX_PHYSICAL_BATCH_SIZE="8",
        DPRC_LOG_LEVEL="warning",
        DPRC_REQUIRE_BUDGET="false",  # the default policy: tests/api/test_budget_governance.py
        HF_HUB_OFFLINE="1",
        **settings,
    )
    keys = {}
    for tenant in tenants:
        keys[tenant] = subprocess.run(
            # admin: the tests also change budgets, which only admins may
            [*DPRC, "keys", "create", "--tenant", tenant, "--role", "admin"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    with dprc_serve(DPRC, env, tmp / "server.log") as url:
        client_env = {k: v for k, v in env.items() if k != "DPRC_DATA_DIR"}
        client_env["DPRC_CLIENT_CONFIG"] = str(tmp / "client.toml")
        yield Served(url, client_env, keys)


def write_lines(path: Path, lines: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path
