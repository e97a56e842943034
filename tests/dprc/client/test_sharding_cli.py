"""``dprc jobs create --devices N --sharding fsdp`` as a subprocess against a real ``dprc serve``
subprocess (whose largest worker has 2 devices; its embedded worker has 1, so the jobs stay
queued): the options become ``devices`` and ``sharding``, ``jobs get`` says them in words, the
server's refusals reach the user, and an unknown sharding is refused by the command line. The
server launches jobs on 2 hosts through a Ray cluster whose address answers nothing: ``--nodes 2``
becomes ``nodes``, ``jobs get`` says the shape, and the job fails with the reason."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from tests.dprc.client.conftest import Served, serving, write_lines


@pytest.fixture(scope="module")
def served_two(tmp_path_factory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("dprc-serve-sharding")
    yield from serving(
        tmp,
        ("a",),
        DPRC_MAX_JOB_DEVICES="2",
        DPRC_LAUNCHER="ray",
        DPRC_RAY_ADDRESS=f"127.0.0.1:{_closed_port()}",
        DPRC_MAX_JOB_NODES="2",
        DPRC_RAY_WAIT_SECONDS="1",
    )


def _closed_port() -> int:
    with socket.socket() as s:  # bound, never listening: a connection to it is refused
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _create(train_id: str, *extra: str) -> list[str]:
    return [
        "jobs", "create", "--model", "dprc-tiny-llama", "--training-file", train_id,
        "--epochs", "1", "--batch-size", "8", "--max-seq-len", "32", "--target-epsilon", "2",
        "--norm-method", "exact", *extra,
    ]  # fmt: skip


def test_jobs_create_with_devices_and_sharding_and_jobs_get_says_them(served_two, tmp_path):
    served = served_two
    lines = [{"text": ["ab", "cd", "ef"][i % 3] * (6 + i % 5)} for i in range(32)]
    f = served.json("files", "upload", str(write_lines(tmp_path / "t.jsonl", lines)))

    fsdp = served.json(*_create(f["id"], "--devices", "2", "--sharding", "fsdp"))
    assert (fsdp["devices"], fsdp["sharding"]) == (2, "fsdp")
    shown = served.ok("jobs", "get", fsdp["id"]).stdout
    assert "2 devices, model sharded (FSDP): 1/2 of it on each" in shown

    ddp = served.json(*_create(f["id"], "--devices", "2"))
    assert (ddp["devices"], ddp["sharding"]) == (2, "none")
    shown = served.ok("jobs", "get", ddp["id"]).stdout
    assert "2 devices, data-parallel (whole model on each)" in shown

    one = served.json(*_create(f["id"]))
    assert (one["devices"], one["sharding"]) == (1, "none")
    assert "1 device" in served.ok("jobs", "get", one["id"]).stdout
    # the plan does not depend on the sharding
    for key in ("noise_multiplier", "sample_rate", "steps", "planned_epsilon"):
        assert fsdp["privacy"][key] == ddp["privacy"][key] == one["privacy"][key], key

    # refused by the server, with its code: fsdp on one device
    refused = served.run(*_create(f["id"], "--sharding", "fsdp"))
    assert refused.returncode == 2
    assert "HTTP 400" in refused.stderr and "sharding_needs_devices" in refused.stderr
    # an unknown sharding: refused by the command line, before any request
    bad = served.run(*_create(f["id"], "--devices", "2", "--sharding", "zero3"))
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_jobs_create_with_nodes_and_a_ray_cluster_that_is_down(served_two, tmp_path):
    served = served_two
    lines = [{"text": ["ab", "cd", "ef"][i % 3] * (6 + i % 5)} for i in range(32)]
    f = served.json("files", "upload", str(write_lines(tmp_path / "t.jsonl", lines)))
    job = served.json(*_create(f["id"], "--nodes", "2"))
    assert (job["nodes"], job["devices"]) == (2, 1)
    shown = served.ok("jobs", "get", job["id"]).stdout
    assert "2 nodes × 1 device(s) (2 ranks), data-parallel (whole model on each)" in shown
    deadline = time.monotonic() + 120
    while job["status"] != "failed":
        assert job["status"] in ("queued", "running"), job
        assert time.monotonic() < deadline
        time.sleep(0.5)
        job = served.json("jobs", "get", job["id"])
    assert job["error"]["code"] == "nodes_unavailable"
    assert "cannot reach the Ray cluster at 127.0.0.1:" in job["error"]["message"]
    refused = served.run(*_create(f["id"], "--nodes", "3"))  # DPRC_MAX_JOB_NODES=2
    assert refused.returncode == 2 and "nodes_unavailable" in refused.stderr


def test_jobs_create_with_method_dpo_and_beta(served_two, tmp_path):
    """``--method dpo --beta`` become OpenAI's ``method`` (the hyperparameters moved into it);
    ``jobs get`` says the method; ``--beta`` without dpo is refused before any request."""
    served = served_two
    pairs = [
        {
            "input": {"messages": [{"role": "user", "content": f"say {c}"}]},
            "preferred_output": [{"role": "assistant", "content": c * 2}],
            "non_preferred_output": [{"role": "assistant", "content": c.upper()}],
        }
        for c in "abcdefghijklmnop"
    ]
    f = served.json("files", "upload", str(write_lines(tmp_path / "p.jsonl", pairs)))
    assert f["format"] == "preference"
    job = served.json(*_create(f["id"], "--method", "dpo", "--beta", "0.3"))
    assert job["method"] == {
        "type": "dpo",
        "dpo": {"hyperparameters": {**job["hyperparameters"], "beta": 0.3}},
    }
    assert job["hyperparameters"]["n_epochs"] == 1  # the options reached the method's
    assert "dpo (beta 0.3" in served.ok("jobs", "get", job["id"]).stdout
    refused = served.run(*_create(f["id"]))  # preference lines need dpo: the server says so
    assert refused.returncode == 2 and "method dpo" in refused.stderr
    bad = served.run(*_create(f["id"], "--method", "supervised", "--beta", "0.3"))
    assert bad.returncode == 2 and "--beta is DPO's" in bad.stderr
