"""Fuzz the API with schemathesis against ``/openapi.json`` using a valid key; fails on any
5xx (check ``not_a_server_error``).

    python scripts/schemathesis_run.py [--database-url URL] [--max-examples N] [--max-time S]

Starts ``dprc serve`` on a free port with a throwaway data dir (SQLite by default; PostgreSQL
with --database-url), creates a key and a budgeted file (so that some ids exist), then runs the
``schemathesis`` CLI and exits with its status.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from shell_keys import shell_key  # scripts/shell_keys.py (this folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--max-examples", type=int, default=30)
    parser.add_argument("--max-time", type=int, default=None)
    parser.add_argument("--workers", default="1")  # >1 has hit a schemathesis-internal AST race
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="dprc-schemathesis-"))
    env = {
        **os.environ,
        "DPRC_DATA_DIR": str(data_dir),
        "DPRC_MAX_UPLOAD_BYTES": "65536",
        "DPRC_MAX_ACTIVE_JOBS_PER_TENANT": "1000",
    }
    if args.database_url:
        env["DPRC_DATABASE_URL"] = args.database_url
    else:
        env.pop("DPRC_DATABASE_URL", None)
    dprc = [sys.executable, "-m", "dprc.cli"]

    # the data owner budgets the seed file; the trainer's key is fuzzed
    key = shell_key(dprc, env, ROOT, "schemathesis", "trainer")
    owner = shell_key(dprc, env, ROOT, "schemathesis", "data_owner")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [*dprc, "serve", "--port", str(port), "--log-level", "warning"], env=env, cwd=ROOT
    )
    try:
        headers = {"Authorization": f"Bearer {key}"}
        for _ in range(300):
            try:
                httpx.get(f"{base}/healthz")
                break
            except httpx.TransportError:
                time.sleep(0.2)
        lines = "\n".join(json.dumps({"text": f"t{i}", "label": i % 2}) for i in range(50))
        r = httpx.post(
            f"{base}/v1/files",
            headers={"Authorization": f"Bearer {owner}"},
            files={"file": ("seed.jsonl", lines.encode())},
            data={"purpose": "fine-tune", "epsilon_budget": "8"},
        )
        r.raise_for_status()
        file_id = r.json()["id"]
        r = httpx.post(
            f"{base}/v1/fine_tuning/jobs",
            headers=headers,
            timeout=60,
            json={
                "model": "minilm-l6-v2",
                "training_file": file_id,
                "hyperparameters": {"n_epochs": 1, "batch_size": 5},
                "privacy": {"target_epsilon": 1.0, "clipping": {"method": "exact"}},
            },
        )
        r.raise_for_status()
        config = data_dir / "schemathesis.toml"  # real ids, so that tests reach the services
        config.write_text(
            f'[parameters]\n"path.file_id" = "{file_id}"\n'
            f'"path.fine_tuning_job_id" = "{r.json()["id"]}"\n'
            '"path.model" = "minilm-l6-v2"\n'
        )
        cmd = [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "--config-file",
            str(config),
            "run",
            f"{base}/openapi.json",
            "-H",
            f"Authorization: Bearer {key}",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            str(args.max_examples),
            "--workers",
            args.workers,
            "--request-timeout",
            "60",
            "--no-color",
            "--seed",
            "1",
            "--suppress-health-check",
            "all",
            "--generation-database",
            "none",
        ]
        if args.max_time:
            cmd += ["--max-time", str(args.max_time)]
        print(
            "$",
            " ".join(c if "Bearer" not in c else "Authorization: Bearer ***" for c in cmd[1:]),
            flush=True,
        )
        return subprocess.run(cmd, cwd=ROOT).returncode
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    raise SystemExit(main())
