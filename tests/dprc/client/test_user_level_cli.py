"""``dprc files upload --user-field`` and ``dprc jobs create --privacy-unit user`` as
subprocesses against a real ``dprc serve``: the upload reports its users and a per-user budget,
the job is planned over users (N = U, q = B/U, the library's σ), runs, and ``jobs get`` says
that its ε is per user."""

from __future__ import annotations

import pytest

from dprc_core.accounting import noise_multiplier
from tests.dprc.client.conftest import write_lines


def test_a_user_level_data_set_and_job_from_the_command_line(served, tmp_path):
    owners = ["heavy"] * 20 + [f"u{i}" for i in range(15)]
    lines = [
        {"text": ["ab", "cd", "ef"][i % 3] * (6 + i % 5) + f" {i}", "person": o}
        for i, o in enumerate(owners)
    ]
    path = write_lines(tmp_path / "people.jsonl", lines)
    f = served.json("files", "upload", str(path), "--epsilon-budget", "4", "--user-field", "person")
    assert (f["n_users"], f["max_lines_per_user"], f["budget"]["unit"]) == (16, 20, "user")
    listed = served.ok("files", "get", f["id"]).stdout
    assert "USERS" in listed and "per user" in listed

    argv = [
        "jobs", "create", "--model", "dprc-tiny-llama", "--training-file", f["id"],
        "--epochs", "1", "--batch-size", "4", "--max-seq-len", "32", "--target-epsilon", "2",
        "--norm-method", "exact",
    ]  # fmt: skip
    refused = served.run(*argv)  # example level on a data set with users
    assert refused.returncode == 2 and "privacy_unit_mismatch" in refused.stderr
    job = served.json(*argv, "--privacy-unit", "user", "--max-examples-per-user", "2")
    p = job["privacy"]
    assert p["unit"]["type"] == "user" and p["unit"]["max_examples_per_user"] == 2
    assert (p["dataset_size"], p["sample_rate"]) == (16, 4 / 16)
    want = noise_multiplier(2.0, p["target_delta"], 4 / 16, p["steps"], "exact")
    assert p["noise_multiplier"] == pytest.approx(want, rel=1e-12)
    served.ok("jobs", "get", job["id"], "--follow", "--interval", "0.5")  # exit 0: succeeded
    shown = served.ok("jobs", "get", job["id"]).stdout
    assert "user (ε per user; 16 users in 'person', at most 2 lines a user a step)" in shown
