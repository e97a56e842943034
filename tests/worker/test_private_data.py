"""Secrets on disk: under ``dprc serve`` (started with the usual umask 022) every file the
service writes is 0600 and every folder 0700; a job's resume state (its seed and generator
states) is gone once the job ends while its released checkpoint stays downloadable; deleting
the training file removes the job's run folder."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import openai

from tests.api.conftest import _free_port
from tests.worker.conftest import learnable_lines, wait_for

ROOT = Path(__file__).resolve().parents[2]


def _env(data_dir: Path) -> dict[str, str]:
    env = {**os.environ, "DPRC_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
    for var in ("DPRC_DATABASE_URL", "DPRC_BROKER_URL", "DPRC_EMBEDDED_WORKER"):
        env.pop(var, None)  # the default: SQLite and the embedded worker
    return env


def _umask_022() -> None:
    os.umask(0o022)


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*")}


def test_files_are_private_and_resume_state_is_removed(tmp_path):
    data = tmp_path / "data"
    env = _env(data)
    key = subprocess.run(
        [sys.executable, "-m", "dprc.cli", "keys", "create", "--tenant", "owner"]
        + ["--role", "admin"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True, preexec_fn=_umask_022,
    ).stdout.strip()  # fmt: skip
    port = _free_port()
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dprc.cli", "serve", "--port", str(port)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_umask_022,
    )  # fmt: skip
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)
        deadline = time.monotonic() + 60
        while True:
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.3)
        f = client.files.create(
            file=("train.jsonl", learnable_lines(24)),
            purpose="fine-tune",
            extra_body={"epsilon_budget": "20"},
        )
        job = client.fine_tuning.jobs.create(
            model="dprc-tiny-llama",
            training_file=f.id,
            hyperparameters={"n_epochs": 1, "batch_size": 8, "max_seq_len": 32},
            extra_body={
                "privacy": {"target_epsilon": 8.0, "clipping": {"method": "hutch", "k": 16}},
                "checkpoint_every": 1,
            },
        )
        job = wait_for(client, job.id, {"succeeded", "failed", "cancelled"})
        assert job.status == "succeeded", job.error
        modes = _modes(data)
        assert any(name.startswith("runs/") for name in modes)  # checkpoints were written
        loose = {n: oct(m) for n, m in modes.items() if m & 0o077}
        assert not loose, loose  # nothing readable by group or others
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        assert not [n for n in modes if n.endswith("/resume") or "/resume/" in n]
        ckpt = client.fine_tuning.jobs.checkpoints.list(job.id).data[0]
        assert client.files.content(ckpt.model_extra["file_id"]).read()  # released: stays
        assert (data / "runs" / job.id).exists()
        client.files.delete(f.id)
        assert not (data / "runs" / job.id).exists()  # derived data goes with the file
        assert client.files.content(ckpt.model_extra["file_id"]).read()  # results stay
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
