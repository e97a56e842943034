"""A real ``dprc serve`` (embedded: SQLite + the in-process worker, the built-in tiny model)
in a subprocess, and Debian's Chromium driven headless by Playwright (never a downloaded
browser: ``make test`` installs Chromium with scripts/browser.sh)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("DPRC_CHROMIUM", "/usr/bin/chromium"))
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
# the screenshots docs/dashboard.md shows
DOCS = {"job", "new_job", "data_set", "data_sets", "jobs", "accountant", "job_phone"}


@dataclass
class Dashboard:
    url: str
    env: dict[str, str]
    log: Path
    shots: Path
    keys: dict[tuple[str, str], str] = field(default_factory=dict)

    def key(self, tenant: str, role: str = "admin") -> str:
        """``dprc keys create --role`` as a user runs it (one key per tenant and role; admin by
        default, the role that may do everything): the key is the line it prints."""
        if (tenant, role) not in self.keys:
            argv = ["keys", "create", "--tenant", tenant, "--role", role]
            out = subprocess.run(
                [sys.executable, "-m", "dprc.cli", *argv],
                env=self.env,
                cwd=ROOT,
                check=True,
                capture_output=True,
                text=True,
            )
            self.keys[(tenant, role)] = out.stdout.strip()
        return self.keys[(tenant, role)]

    def api(self, tenant: str, role: str = "admin") -> httpx.Client:
        """The JSON API with the tenant's bearer key (the test's independent view)."""
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.key(tenant, role)}"},
            timeout=120,
        )

    def shot(self, page, name: str, full_page: bool = False) -> None:
        """A screenshot under the test's output folder; also into $DPRC_DASHBOARD_SHOTS (for
        docs/: ``DPRC_DASHBOARD_SHOTS=docs``) as ``dashboard_<name>.png`` when set and the
        page is one of :data:`DOCS`."""
        path = self.shots / f"dashboard_{name}.png"
        page.screenshot(path=str(path), full_page=full_page)
        target = os.environ.get("DPRC_DASHBOARD_SHOTS")
        if target and name in DOCS:
            Path(target).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, Path(target) / path.name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory) -> Iterator[Dashboard]:
    tmp = tmp_path_factory.mktemp("dashboard")
    env = {
        **os.environ,
        "DPRC_DATA_DIR": str(tmp / "data"),
        "DPRC_LEASE_SECONDS": "6",
        "DPRC_SWEEP_SECONDS": "2",
        "DPRC_MAX_PHYSICAL_BATCH_SIZE": "8",
        "HF_HUB_OFFLINE": "1",
        # the pages' tests upload data sets without budgets too (the default policy's
        # refusal is tested in tests/api/test_budget_governance.py)
        "DPRC_REQUIRE_BUDGET": "false",
    }
    for var in ("DPRC_DATABASE_URL", "DPRC_BROKER_URL", "DPRC_EMBEDDED_WORKER"):
        env.pop(var, None)  # the embedded default
    port = _free_port()
    log = tmp / "server.log"
    shots = tmp / "shots"
    shots.mkdir()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dprc.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dprc serve did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)
        assert f"dprc dashboard: {url}/" in log.read_text()  # the URL a user opens
        yield Dashboard(url=url, env=env, log=log, shots=shots)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def chromium():
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: `make test` installs it (scripts/browser.sh)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        yield pw.chromium


@pytest.fixture
def new_context(chromium, tmp_path):
    """A fresh browser profile (its own user-data-dir, no cookies) per call."""
    opened: list = []  # the contexts to close

    def make(viewport: dict[str, int] = DESKTOP):
        profile = tmp_path / f"profile-{len(opened)}"
        ctx = chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=FLAGS,
            viewport=viewport,
            accept_downloads=True,
        )
        ctx.set_default_timeout(60_000)
        opened.append(ctx)
        return ctx

    yield make
    for ctx in opened:
        ctx.close()
