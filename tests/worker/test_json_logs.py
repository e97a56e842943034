"""``DPRC_LOG_FORMAT=json`` (issue 30, part 4) on a real ``dprc serve`` subprocess with its
embedded worker: every line of the whole run's log is one JSON object with time, level,
logger and message, Python warnings included; a request's lines carry its ``X-Request-ID``
(echoed on the response) and, once authenticated, its tenant and key id; the worker's lines
carry the job id; and nothing in the log is a key, a session cookie, a seed or a line of the
training data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx

from tests.serve_process import dprc_serve
from tests.worker.conftest import learnable_lines

DPRC = [sys.executable, "-m", "dprc.cli"]


def test_a_whole_run_logs_json_lines_with_context_and_no_secrets(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRC_")}
    env.update(
        DPRC_DATA_DIR=str(tmp_path / "data"),
        DPRC_MAX_PHYSICAL_BATCH_SIZE="8",
        DPRC_LOG_LEVEL="info",
        DPRC_LOG_FORMAT="json",
        HF_HUB_OFFLINE="1",
    )
    key = subprocess.run(
        [*DPRC, "keys", "create", "--tenant", "acme-logs", "--role", "admin"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    log_path = tmp_path / "server.log"
    data = learnable_lines(24)
    with dprc_serve(DPRC, env, log_path) as url:
        auth = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=url, headers=auth, timeout=120) as http:
            up = http.post(
                "/v1/files",
                files={"file": ("t.jsonl", data)},
                data={"purpose": "fine-tune", "epsilon_budget": "9"},
                headers={"X-Request-ID": "req-upload-1"},
            )
            assert up.status_code == 200, up.text
            assert up.headers["x-request-id"] == "req-upload-1"
            job = http.post(
                "/v1/fine_tuning/jobs",
                json={
                    "model": "dprc-tiny-llama",
                    "training_file": up.json()["id"],
                    "hyperparameters": {"n_epochs": 1, "batch_size": 8, "max_seq_len": 32},
                    "privacy": {"target_epsilon": 4.0, "clipping": {"norm_method": "exact"}},
                },
            ).json()
            while job["status"] not in ("succeeded", "failed", "cancelled"):
                time.sleep(0.5)
                job = http.get(f"/v1/fine_tuning/jobs/{job['id']}").json()
            assert job["status"] == "succeeded", job
            events = http.get(f"/v1/fine_tuning/jobs/{job['id']}/events").json()["data"]
            # 3 steps: the plan is flagged, on the job's events as in the log
            assert any("unlikely to learn" in e["message"] for e in events)
            ckpt = http.get(f"/v1/fine_tuning/jobs/{job['id']}/checkpoints").json()["data"][0]
            assert http.get(f"/v1/files/{ckpt['file_id']}/content").status_code == 200
            assert http.get("/v1/files/file-nope").status_code == 404
        # a dashboard session: its cookie must not reach the log either
        with httpx.Client(base_url=url, timeout=60) as browser:
            signed = browser.post("/sign-in", data={"api_key": key})
            assert signed.status_code in (200, 303), signed.text
            cookie = browser.cookies.get("dprc_session")
            assert cookie
            assert browser.get("/jobs").status_code == 200

    text = log_path.read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]  # all JSON
    assert lines
    for line in lines:
        assert {"time", "level", "logger", "message"} <= set(line), line
    upload = [x for x in lines if x.get("request_id") == "req-upload-1"]
    assert upload and any("/v1/files" in x["message"] for x in upload)  # the access line
    assert any(x.get("tenant") == "acme-logs" and x.get("key_id") for x in upload)
    assert any(x.get("job_id") == job["id"] for x in lines)  # the worker's lines
    # a Python warning is a JSON line too (logging.captureWarnings), not a raw stderr line
    assert any(x["logger"] == "py.warnings" and "unlikely to learn" in x["message"] for x in lines)
    # nothing secret: the key, the session cookie, the job's seed, a line of the data
    assert key not in text and cookie not in text
    assert str(job["seed"]) not in text
    for example in data.decode().splitlines():
        assert json.loads(example)["text"] not in text
