"""One logging configuration for ``dprc serve`` and the Celery workers
(``service.base.logging_setup``): the embedded worker's ``log.info`` lines reach the output."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service.base.logging_setup import configure_logging
from tests.api.conftest import _free_port

ROOT = Path(__file__).resolve().parents[2]


def test_configure_logging_sets_one_root_handler_and_the_level():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        configure_logging("warning")
        configure_logging("debug")  # again: one handler, the new level
        ours = [h for h in root.handlers if h.get_name() == "dprc"]
        assert len(ours) == 1 and root.level == logging.DEBUG
        with pytest.raises(ValueError):
            configure_logging("chatty")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_dprc_serve_shows_the_embedded_workers_log_lines(tmp_path):
    env = {
        **os.environ,
        "DPRC_DATA_DIR": str(tmp_path),
        "DPRC_LOG_LEVEL": "info",
        "PYTHONUNBUFFERED": "1",
    }
    for var in ("DPRC_DATABASE_URL", "DPRC_BROKER_URL", "DPRC_EMBEDDED_WORKER"):
        env.pop(var, None)  # the default: SQLite and the embedded worker
    log_file = tmp_path / "serve.log"
    with log_file.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dprc.cli", "serve", "--port", str(_free_port())],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while "embedded worker" not in log_file.read_text():
                assert proc.poll() is None, log_file.read_text()
                assert time.monotonic() < deadline, log_file.read_text()
                time.sleep(0.2)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    line = next(x for x in log_file.read_text().splitlines() if "embedded worker" in x)
    assert "INFO worker.embedded:" in line and "started" in line
