"""``dprc synthetic …`` as a subprocess against a real ``dprc serve`` subprocess (SQLite, the
embedded worker): the command line's refusals (exit 2, before any request), then a job from a
classification file created, followed to its end and shown with its one (ε, δ) and result
file; its events; the owner's report for an admin key and the 403 for a trainer's."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys

import httpx

from dprc import cli
from tests.dprc.client.conftest import write_lines


def _rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        label = rng.choice(["calm", "angry"])
        word = rng.choice(["fine", "ok", "nice"] if label == "calm" else ["bad", "awful", "mad"])
        out.append({"text": f"it is {word} {i} ({seed})", "label": label})
    return out


def test_the_command_line_refuses_unclear_sources(served):
    both = served.run("synthetic", "create", "--n", "3", "--model", "ft:x", "--training-file", "f")
    neither = served.run("synthetic", "create", "--n", "3")
    for out in (both, neither):
        assert out.returncode == 2
        assert "exactly one of --model FT_MODEL" in out.stderr and "--training-file" in out.stderr
    half = served.run("synthetic", "create", "--n", "3", "--training-file", "file-x")
    assert (
        half.returncode == 2 and "--training-file needs --base-model and --epsilon" in half.stderr
    )
    mixed = served.run("synthetic", "create", "--n", "3", "--model", "ft:x", "--epsilon", "2")
    assert mixed.returncode == 2 and "--epsilon go with --training-file" in mixed.stderr
    labels = served.run(
        "synthetic", "create", "--n", "3", "--model", "ft:x", "--labels", "dp",
        "--label-weights", "{}",
    )  # fmt: skip
    assert labels.returncode == 2 and "not allowed with argument" in labels.stderr
    no_n = served.run("synthetic", "create", "--model", "ft:x")
    assert no_n.returncode == 2 and "--n" in no_n.stderr


def test_a_synthetic_job_from_a_training_file(served, tmp_path):
    train = write_lines(tmp_path / "reviews.jsonl", _rows(48, 0))
    f = served.json("files", "upload", str(train), "--epsilon-budget", "12")
    job = served.json(
        "synthetic", "create", "--training-file", f["id"], "--base-model", "dprc-tiny-llama",
        "--epsilon", "4", "--n", "6", "--norm-method", "exact", "--n-epochs", "1",
        "--batch-size", "8", "--max-seq-len", "32", "--max-tokens", "8", "--seed", "1",
    )  # fmt: skip
    assert job["object"] == "synthetic_data.job" and job["format"] == "classification"
    assert job["labels"]["type"] == "dp" and job["n"] == 6

    followed = served.ok("synthetic", "get", job["id"], "--follow", "--interval", "0.5")
    done = served.json("synthetic", "get", job["id"])
    assert done["status"] == "succeeded" and done["records_done"] == 6, done
    p = done["privacy"]
    eps = f"ε = {p['epsilon']:.4g} at δ = {p['delta']:.4g} for each example"
    assert eps in followed.stdout, followed.stdout
    assert "(composed: fine-tuning + label histogram)" in followed.stdout
    assert done["result_file"] and done["result_file"] in followed.stdout
    assert re.search(r"^status +succeeded$", followed.stdout, re.M)
    assert re.search(r"^records +6/6$", followed.stdout, re.M)

    listed = served.json("synthetic", "list")
    assert [j["id"] for j in listed] == [job["id"]]
    assert job["id"] in served.ok("synthetic", "list").stdout
    events = served.ok("synthetic", "events", job["id"]).stdout
    assert "label histogram" in events

    # the owner's report: an admin key reads it (JSON, with the note on stderr) ...
    out = tmp_path / "report.json"
    rep = served.ok("synthetic", "report", job["id"], "--output", str(out))
    assert "NOT differentially private" in rep.stderr
    report = json.loads(out.read_text())
    assert report["private"] is True and report["compared_records"]["synthetic"] == 6
    # ... a trainer's does not (the job itself it reads)
    r = httpx.post(
        f"{served.url}/v1/organization/api_keys",
        json={"role": "trainer"},
        headers={"Authorization": f"Bearer {served.keys['a']}"},
    )
    assert r.status_code == 200, r.text
    trainer = r.json()["key"]
    assert served.json("synthetic", "get", job["id"], DPRC_API_KEY=trainer)["id"] == job["id"]
    refused = served.run("synthetic", "report", job["id"], DPRC_API_KEY=trainer)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "HTTP 403" in refused.stderr and "only admin and data_owner keys" in refused.stderr


def test_the_commands_import_no_library():
    """``dprc synthetic …`` is parsed and its module imported without torch, numpy, scipy or
    dprc_core (docs/cli.md: the client is light)."""
    code = (
        "import sys\n"
        "from dprc import cli\n"
        "cli.build_client_parser().parse_args(['synthetic', 'get', 'synth-x', '--follow'])\n"
        "import dprc.client.synthetic\n"
        "heavy = {'torch', 'numpy', 'scipy', 'transformers', 'dprc_core'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout
    assert "synthetic" in cli.build_client_parser().format_help()
