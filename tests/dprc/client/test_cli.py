"""``dprc files …``, ``dprc jobs …`` and ``dprc accountant --server`` as subprocesses against a
real ``dprc serve`` subprocess (embedded worker, SQLite, the built-in tiny Llama)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from dprc_core.accounting import epsilon
from dprc_core.training.results import RESULT_COLUMNS, read_results
from tests.api.conftest import _free_port
from tests.dprc.client.conftest import write_lines

PATTERNS = ["ab", "cd", "ef"]


def _train(path, n=32, tag=""):
    """Training lines; a distinct `tag` makes a data set of its own (its own budget group)."""
    return write_lines(path, [{"text": PATTERNS[i % 3] * (6 + i % 5) + tag} for i in range(n)])


def _create_args(train_id: str, *extra: str) -> list[str]:
    return [
        "jobs", "create", "--model", "dprc-tiny-llama", "--training-file", train_id,
        "--epochs", "1", "--batch-size", "8", "--learning-rate", "0.01", "--max-seq-len", "32",
        "--target-epsilon", "6", "--norm-method", "hutch", "--k", "16", "--seed", "11",
        "--checkpoint-every", "2", *extra,
    ]  # fmt: skip


def test_files_budget_errors_and_tenant_isolation(served, tmp_path):
    f = served.json("files", "upload", str(_train(tmp_path / "t.jsonl")), "--epsilon-budget", "9")
    assert f["n_examples"] == 32 and f["budget"]["epsilon"] == 9.0
    listing = served.ok("files", "list").stdout
    assert f["id"] in listing and "t.jsonl" in listing and "ε 9" in listing
    assert served.json("files", "get", f["id"])["id"] == f["id"]
    budget = served.json("files", "budget", f["id"], "--set", "9.5", "--reason", "more")
    assert budget["epsilon"] == 9.5 and budget["remaining"] == 9.5
    out = tmp_path / "back.jsonl"
    served.ok("files", "download", f["id"], "-o", str(out))
    assert out.read_bytes() == (tmp_path / "t.jsonl").read_bytes()

    # another tenant: not found, non-zero, one line
    other = served.run("files", "get", f["id"], tenant="b")
    assert other.returncode == 2
    assert "HTTP 404 file_not_found" in other.stderr and other.stderr.count("\n") == 1
    assert f["id"] not in served.ok("files", "list", tenant="b").stdout
    # a bad key
    bad = served.run("files", "list", DPRC_API_KEY="dprc-not-a-key")
    assert bad.returncode == 2 and "HTTP 401" in bad.stderr
    # no key at all, and no server listening
    none = served.run("files", "list", tenant=None)
    assert none.returncode == 2 and "no API key" in none.stderr
    gone = served.run("files", "list", DPRC_SERVER_URL=f"http://127.0.0.1:{_free_port()}")
    assert gone.returncode == 2 and "cannot reach the dprc server" in gone.stderr
    # a refused budget change: 400 with the server's message
    low = served.run("files", "budget", f["id"], "--set", "0", "--reason", "less")
    assert low.returncode == 2 and "HTTP 4" in low.stderr

    deleted = served.json("files", "delete", f["id"])
    assert deleted["deleted"] is True
    # its privacy record stays readable (docs/governance.md)
    assert served.json("files", "get", f["id"])["deleted"] is True
    no_reason = served.run("files", "budget", f["id"], "--set", "8")
    assert no_reason.returncode == 2 and "--reason" in no_reason.stderr


def test_login_writes_a_private_config_the_client_then_uses(served, tmp_path):
    config = tmp_path / "cfg" / "client.toml"
    env = {"DPRC_CLIENT_CONFIG": str(config), "DPRC_SERVER_URL": "", "DPRC_API_KEY": ""}
    proc = served.run("login", "--server", served.url, tenant=None, **env)
    assert proc.returncode == 2 and "no API key given" in proc.stderr  # empty stdin
    import subprocess
    import sys

    e = {**served.env, **env}
    done = subprocess.run(
        [sys.executable, "-m", "dprc.cli", "login", "--server", served.url + "/v1/"],
        input=served.keys["a"] + "\n", env=e, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert served.keys["a"] in config.read_text() and served.keys["a"] not in done.stderr
    assert served.run("files", "list", tenant=None, **env).returncode == 0  # from the file
    os.chmod(config, 0o644)
    loose = served.run("files", "list", tenant=None, **env)
    assert loose.returncode == 2 and "readable by others" in loose.stderr


@pytest.mark.slow  # real jobs in a dprc serve subprocess
def test_a_job_with_a_validation_file_followed_to_success(served, tmp_path):
    train = served.json("files", "upload", str(_train(tmp_path / "t.jsonl")), tenant="a")
    # held-out lines: none of them is a training line (a validation file that shares lines
    # with a budgeted data set joins its budget, and is refused as a validation file)
    valid_lines = [{"text": PATTERNS[(i + 1) % 3] * 7 + f" held out {i}"} for i in range(6)]
    valid = served.json("files", "upload", str(write_lines(tmp_path / "v.jsonl", valid_lines)))
    args = _create_args(train["id"], "--validation-file", valid["id"])
    follow = served.run(*args, "--follow", "--json", "--interval", "0.5")
    assert follow.returncode == 0, follow.stderr
    lines = [json.loads(x) for x in follow.stdout.splitlines()]
    assert lines[-1]["status"] == "succeeded" and lines[-1]["step"] == 4  # ceil(32 / 8)
    steps = [x["step"] for x in lines]
    assert steps == sorted(steps)
    job_id = lines[-1]["id"]
    job = served.json("jobs", "get", job_id)
    assert job["validation_file"] == valid["id"]
    assert "validation_file" not in job["hyperparameters"]
    priv = job["privacy"]
    want = epsilon(
        priv["noise_multiplier"],
        priv["sample_rate"],
        4,
        priv["target_delta"],
        "hutch",
        16,
        sketch=priv["accountant"]["sketch"],
    )
    assert priv["accountant"]["sketch"] == "per_example"  # the default for hutch
    assert abs(lines[-1]["epsilon"] - want) <= 1e-9 * want
    assert abs(served.json("jobs", "ledger", job_id)["epsilon_spent"] - want) <= 1e-9 * want

    # checkpoint metrics: OpenAI's keys plus epsilon (spent up to the step)
    ckpts = served.json("jobs", "checkpoints", job_id)
    assert sorted(c["step_number"] for c in ckpts) == [2, 4]
    for c in ckpts:
        assert {"step", "train_loss", "valid_loss", "epsilon"} <= set(c["metrics"])
        assert c["metrics"]["epsilon"] == c["epsilon"]
        assert c["metrics"]["step"] == c["step_number"]
    table = served.ok("jobs", "checkpoints", job_id).stdout
    assert "VALID_LOSS" in table and ckpts[0]["file_id"] in table

    # the results CSV: one row per step, equal to the step events
    csv_path = tmp_path / "results.csv"
    served.ok("jobs", "download", job_id, "--results", "-o", str(csv_path))
    text = csv_path.read_text()
    assert text.splitlines()[0] == ",".join(RESULT_COLUMNS)
    rows = read_results(text)
    events = served.json("jobs", "events", job_id, "--limit", "100")
    step_events = [e["data"] for e in events if e["message"].startswith("Step ")]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] == [d["step"] for d in step_events]
    for row, data in zip(rows, step_events, strict=True):
        assert row["epsilon"] == data["epsilon_spent"]
        for col in ("train_loss", "valid_loss", "clipped_fraction", "batch_size", "dropped"):
            assert row[col] == data.get(col), col
    scored = {r["step"]: r["valid_loss"] for r in rows if r["valid_loss"] is not None}
    assert scored == {c["step_number"]: c["metrics"]["valid_loss"] for c in ckpts}
    assert all(r["train_loss"] is not None for r in rows)

    # the last checkpoint, extracted: safetensors weights and the ledger
    served.ok("jobs", "download", job_id, "--extract", str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / "model" / "model.safetensors").is_file()
    assert (tmp_path / "ckpt" / "ledger.json").is_file()
    assert job_id in served.ok("jobs", "list").stdout
    # another tenant's job is not found
    for argv in (("jobs", "get", job_id), ("jobs", "cancel", job_id)):
        other = served.run(*argv, tenant="b")
        assert other.returncode == 2 and "HTTP 404 job_not_found" in other.stderr
    # validation_file of another tenant: not found
    b_train = served.json("files", "upload", str(_train(tmp_path / "b.jsonl")), tenant="b")
    cross = served.run(*_create_args(b_train["id"], "--validation-file", valid["id"]), tenant="b")
    assert cross.returncode == 2 and "HTTP 404 file_not_found" in cross.stderr
    assert "validation_file" in cross.stderr


@pytest.mark.slow  # real jobs in a dprc serve subprocess
def test_follow_exits_non_zero_when_the_job_fails_or_is_cancelled(served, tmp_path):
    # texts that tokenize to one token: the worker fails the job before any step
    bad = served.json(
        "files", "upload", str(write_lines(tmp_path / "x.jsonl", [{"text": "x"}] * 20))
    )
    failed = served.run(*_create_args(bad["id"]), "--follow", "--interval", "0.5")
    assert failed.returncode == 1
    assert "failed: invalid_training_file" in failed.stderr

    # a long job: paused (follow exits 3), resumed, then cancelled (follow exits 1)
    # lines of its own: the earlier tests' jobs charged the shared lines' budget group
    train = served.json("files", "upload", str(_train(tmp_path / "t.jsonl", tag=" paused")))
    job = served.json(*_create_args(train["id"]), "--epochs", "200")
    paused = served.json("jobs", "pause", job["id"])
    assert paused["status"] in ("paused", "running")
    waited = served.run("jobs", "get", job["id"], "--follow", "--interval", "0.5")
    assert waited.returncode == 3 and "is paused" in waited.stderr
    assert served.json("jobs", "resume", job["id"])["status"] == "queued"
    served.ok("jobs", "cancel", job["id"])
    cancelled = served.run("jobs", "get", job["id"], "--follow", "--interval", "0.5")
    assert cancelled.returncode == 1 and "is cancelled" in cancelled.stderr


def test_accountant_through_the_server_equals_the_library(served):
    argv = ["accountant", "epsilon", "--sigma", "1.1", "--delta", "1e-5",
            "--dataset-size", "1000", "--batch-size", "10", "--epochs", "2"]  # fmt: skip
    remote = served.json(*argv, "--server", served.url)
    assert remote["steps"] == 200 and remote["sample_rate"] == 0.01
    assert remote["epsilon"] == epsilon(1.1, 0.01, 200, 1e-5, "exact", None)
    # no mechanism named: the server's ε under each one a job could have run, as the library's
    rows = remote["by_mechanism"]
    assert [(r["envelope"], r["sketch"]) for r in rows][:3] == [
        ("exact", "shared"), ("hutch", "per_example"), ("hutch", "shared"),
    ]  # fmt: skip
    assert [r["epsilon"] for r in rows] == [
        epsilon(1.1, 0.01, 200, 1e-5, r["envelope"], r["k"], sketch=r["sketch"]) for r in rows
    ]
    configured = served.ok(*argv, "--server").stdout  # the URL from DPRC_SERVER_URL
    assert configured.startswith("epsilon = ") and served.url in configured
    sigma = served.json(
        "accountant", "sigma", "--epsilon", "2", "--delta", "1e-5", "-q", "0.01",
        "--steps", "200", "--server",
    )  # fmt: skip
    assert epsilon(sigma["noise_multiplier"], 0.01, 200, 1e-5, "exact", None) <= 2.0
    refused = served.run("accountant", "epsilon", "--sigma", "0", "--delta", "1e-5", "-q",
                         "0.01", "--steps", "10", "--server")  # fmt: skip
    assert refused.returncode == 2 and "HTTP 400" in refused.stderr


def test_a_data_owner_decides_pending_uploads_from_the_command_line(served, tmp_path):
    """``dprc files pending | approve | reject``: a trainer's upload waits; the queue shows its
    overlap; approve (a new budget, or --join) and reject reach the server, refusals too."""
    import httpx

    def key(role: str) -> str:
        r = httpx.post(
            f"{served.url}/v1/organization/api_keys",
            json={"role": role},
            headers={"Authorization": f"Bearer {served.keys['a']}"},
        )
        assert r.status_code == 200, r.text
        return r.json()["key"]

    trainer, owner = key("trainer"), key("data_owner")
    base = served.json(
        "files",
        "upload",
        str(_train(tmp_path / "base.jsonl", tag=" owned")),
        "--epsilon-budget",
        "9",
    )
    up = served.ok(
        "files", "upload", str(_train(tmp_path / "t.jsonl", tag=" OWNED")), "--epsilon-budget",
        "9", DPRC_API_KEY=trainer,
    ).stdout  # fmt: skip
    assert "pending" in up and f"with {base['budget_group']}" in up
    # the base data set's default δ (1/32^1.1) is above 1/(10·32): dprc files get says so
    assert "warning: delta_large: delta=" in served.ok("files", "get", base["id"]).stdout
    fresh = served.json(
        "files", "upload", str(_train(tmp_path / "n.jsonl", tag=" new")), DPRC_API_KEY=trainer
    )
    queue = served.ok("files", "pending", DPRC_API_KEY=owner).stdout
    assert fresh["id"] in queue and "shares no example" in queue
    pending = {f["id"]: f for f in served.json("files", "pending", DPRC_API_KEY=owner)}
    copy_id = next(i for i in pending if i != fresh["id"])
    # a trainer cannot decide; a reason is required by the command line
    denied = served.run("files", "approve", copy_id, "--join", base["budget_group"],
                        "--reason", "x", DPRC_API_KEY=trainer)  # fmt: skip
    assert denied.returncode == 2 and "permission_denied" in denied.stderr
    no_reason = served.run("files", "reject", fresh["id"], DPRC_API_KEY=owner)
    assert no_reason.returncode == 2 and "--reason" in no_reason.stderr
    # a fresh budget on data that shares examples is refused, joining is not
    refused = served.run("files", "approve", copy_id, "--epsilon-budget", "9", "--reason", "x",
                         DPRC_API_KEY=owner)  # fmt: skip
    assert refused.returncode == 2 and "budget_group_conflict" in refused.stderr
    joined = served.json("files", "approve", copy_id, "--join", base["budget_group"],
                         "--reason", "same data", DPRC_API_KEY=owner)  # fmt: skip
    assert joined["budget_group"] == base["budget_group"]
    assert joined["approval"]["status"] == "approved"
    out = served.ok("files", "reject", fresh["id"], "--reason", "not ours", DPRC_API_KEY=owner)
    assert f"rejected {fresh['id']}" in out.stdout
    assert served.json("files", "pending", DPRC_API_KEY=owner) == []
