"""``dprc jobs create --sketch`` as a subprocess against a real ``dprc serve`` subprocess: the
option becomes ``privacy.clipping.sketch`` and the job is planned with it."""

from __future__ import annotations

import pytest

from dprc_core.accounting import noise_multiplier
from tests.dprc.client.conftest import write_lines


def _create(train_id: str, *extra: str) -> list[str]:
    return [
        "jobs", "create", "--model", "dprc-tiny-llama", "--training-file", train_id,
        "--epochs", "1", "--batch-size", "8", "--max-seq-len", "32", "--target-epsilon", "2",
        *extra,
    ]  # fmt: skip


def test_jobs_create_with_a_per_example_sketch(served, tmp_path):
    lines = [{"text": ["ab", "cd", "ef"][i % 3] * (6 + i % 5)} for i in range(32)]
    f = served.json("files", "upload", str(write_lines(tmp_path / "t.jsonl", lines)))
    job = served.json(
        *_create(f["id"], "--norm-method", "hutch", "--k", "32", "--sketch", "per_example")
    )
    p = job["privacy"]
    assert p["clipping"]["sketch"] == p["accountant"]["sketch"] == "per_example"
    want = noise_multiplier(
        2.0, p["target_delta"], p["sample_rate"], p["steps"], "hutch", 32, sketch="per_example"
    )
    assert p["noise_multiplier"] == pytest.approx(want, rel=1e-12)
    served.ok("jobs", "get", job["id"], "--follow", "--interval", "0.5")  # exit 0: succeeded
    shown = served.ok("jobs", "get", job["id"]).stdout
    assert "hutch, k=32, per-example sketch" in shown and "succeeded" in shown

    # refused with exact norms, by the server (400 naming the field)
    refused = served.run(*_create(f["id"], "--norm-method", "exact", "--sketch", "per_example"))
    assert refused.returncode == 2
    assert "HTTP 400" in refused.stderr and "privacy.clipping.sketch" in refused.stderr
    # an unknown sketch: refused by the command line, before any request
    bad = served.run(*_create(f["id"], "--norm-method", "hutch", "--sketch", "hidden"))
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
