"""A budgeted file's ``spent`` follows its running jobs (issue 16 item 6): a read composes the
steps each job has run so far, not only what was composed when a job was created or ended."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager

from dprc_core.accounting import epsilon
from service.budget.budget import SPENT_REFRESH_SECONDS
from tests.api.conftest import _serve, _settings


def _lines(n: int) -> bytes:
    return ("\n".join(json.dumps({"text": "ab" * (6 + i % 5)}) for i in range(n)) + "\n").encode()


def test_spent_follows_a_running_job(tmp_path):
    settings = _settings(
        tmp_path, None, embedded_worker=True, lease_seconds=6, sweep_seconds=2
    ).model_copy(update={"max_physical_batch_size": 8})
    with contextmanager(_serve)(settings) as srv:
        client = srv.client(srv.key("live-spent"))
        f = client.files.create(
            file=("t.jsonl", _lines(40)), purpose="fine-tune", extra_body={"epsilon_budget": 20.0}
        )
        job = client.fine_tuning.jobs.create(
            model="dprc-tiny-llama",
            training_file=f.id,
            hyperparameters={"n_epochs": 100, "batch_size": 8, "max_seq_len": 16},
            extra_body={"privacy": {"target_epsilon": 8.0, "clipping": {"method": "exact"}}},
        )
        budget = client.files.retrieve(f.id).model_extra["budget"]
        assert budget["spent"] == 0.0 and budget["committed"] > 7.0
        deadline = time.monotonic() + 120
        while True:  # while it runs, the file's spent rises
            spent = client.files.retrieve(f.id).model_extra["budget"]["spent"]
            state = client.fine_tuning.jobs.retrieve(job.id)
            if spent > 0 and state.status == "running":
                break
            assert state.status in ("queued", "running"), state
            assert time.monotonic() < deadline, "the file's spent never moved while it ran"
            time.sleep(0.2)
        client.fine_tuning.jobs.pause(job.id)
        deadline = time.monotonic() + 120
        while (state := client.fine_tuning.jobs.retrieve(job.id)).status != "paused":
            assert time.monotonic() < deadline, state
            time.sleep(0.2)
        time.sleep(SPENT_REFRESH_SECONDS + 0.1)
        budget = client.files.retrieve(f.id).model_extra["budget"]
        p = state.model_extra["privacy"]
        steps = state.model_extra["steps_done"]
        assert 0 < steps < p["steps"]
        # the library's accountant on the steps that ran, at the file's delta
        want = epsilon(p["noise_multiplier"], p["sample_rate"], steps, budget["delta"], "exact")
        assert budget["spent"] == want, (budget, want)
        assert 0 < budget["spent"] < budget["committed"]
        listed = {x.id: x for x in client.files.list().data}[f.id]
        assert listed.model_extra["budget"]["spent"] == want
        client.fine_tuning.jobs.cancel(job.id)
