"""Frozen data sets (docs/operations.md, "Backups"; docs/api.md, the acknowledgement) and the
retention of an ended job's checkpoints (``DPRC_KEEP_CHECKPOINTS``, docs/operations.md), in-process.
A data set is frozen with the function ``dprc admin restore`` uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dprc_core.training.checkpoint import checkpoint_dir
from service.base.errors import Conflict, InvalidInput, NotFound, PermissionDenied
from service.budget import budget, freezes
from service.data import files
from service.data.private_data import run_folder
from service.jobs import job_runs, jobs
from service.store.db import locked_session
from tests.service.conftest import reviews

REASON = "restored from a backup; jobs ran on this data set after it"


def _freeze(domain, group_id: str) -> None:
    with locked_session(domain.store.sessions) as session:
        assert freezes.freeze(session, budget.lock_group(session, group_id), REASON)
        session.commit()


def test_a_frozen_data_set_refuses_new_jobs_until_an_admin_acknowledges(domain):
    acme = domain.acme
    data_set = domain.upload(acme.owner, reviews(), epsilon=8.0)
    running = domain.create_job(acme.trainer, data_set.row.id)
    _freeze(domain, data_set.group_id)
    with pytest.raises(Conflict) as refused:
        domain.create_job(acme.trainer, data_set.row.id)
    assert refused.value.code == "budget_group_frozen"
    assert refused.value.param == "training_file"
    assert REASON in refused.value.message
    assert len(domain.audit(acme, "job.create")) == 1
    # the jobs it already has are unaffected
    assert jobs.cancel(domain.store, acme.trainer, running.id).status == "cancelled"
    with pytest.raises(PermissionDenied):
        freezes.acknowledge(domain.store, acme.trainer, data_set.group_id, "let me train")
    with pytest.raises(InvalidInput):
        freezes.acknowledge(domain.store, acme.admin, data_set.group_id, " ")
    lifted = freezes.acknowledge(domain.store, acme.admin, data_set.group_id, "ledgers checked")
    assert lifted.frozen_reason is None and lifted.frozen_at is None
    (entry,) = domain.audit(acme, "budget.acknowledge")
    detail = json.loads(entry.detail)
    assert entry.key_id == acme.admin.key_id and entry.resource == data_set.group_id
    assert detail["reason"] == "ledgers checked" and detail["frozen_reason"] == REASON
    (frozen,) = domain.audit(acme, "budget.freeze")
    assert frozen.key_id is None and frozen.role == "shell"
    with pytest.raises(Conflict) as twice:
        freezes.acknowledge(domain.store, acme.admin, data_set.group_id, "again")
    assert twice.value.code == "budget_group_not_frozen"
    assert domain.create_job(acme.trainer, data_set.row.id).status == "queued"
    with pytest.raises(NotFound):
        freezes.acknowledge(domain.store, domain.globex.admin, data_set.group_id, "not mine")


def test_only_an_admin_lifts_a_freeze(domain):
    """docs/governance.md ('admins only') and docs/operations.md ('admin keys only (403
    otherwise)'): a data owner, who may change a budget, may not lift a restore's freeze."""
    acme = domain.acme
    data_set = domain.upload(acme.owner, reviews(), epsilon=8.0)
    _freeze(domain, data_set.group_id)
    with pytest.raises(PermissionDenied):
        freezes.acknowledge(domain.store, acme.owner, data_set.group_id, "I own the data")


def _archive(tmp: Path, step: int) -> Path:
    path = tmp / f"step-{step}.tar"
    path.write_bytes(b"weights of step %d" % step * 100)
    return path


@pytest.mark.parametrize("end", ["succeeded", "cancelled"])
def test_an_ended_job_keeps_its_last_checkpoints(make_domain, tmp_path, end):
    domain = make_domain(keep_checkpoints=1)
    acme = domain.acme
    data_set = domain.upload(acme.owner, reviews(60), epsilon=8.0)  # 3 steps of batch 20
    job = domain.create_job(acme.trainer, data_set.row.id)
    assert job.steps_total == 3
    assert job_runs.start_job(domain.store, job.id, "worker-1")
    run = run_folder(domain.data_dir, job.id)
    for step in (1, 2, 3):
        job_runs.record_progress(domain.store, job.id, step, 0.1 * step)
        checkpoint_dir(run, step).mkdir(parents=True)
        job_runs.record_checkpoint(domain.store, job.id, step, 0.1 * step, _archive(tmp_path, step))
    _, rows, _ = jobs.list_checkpoints(domain.store, acme.viewer, job.id, None, 10)
    archives = {c.step: c.file_id for c in rows}
    paths = {
        step: Path(files.retrieve(domain.store, acme.viewer, file_id).row.storage_path)
        for step, file_id in archives.items()
    }
    assert sorted(paths) == [1, 2, 3] and all(p.exists() for p in paths.values())  # while running
    job_runs.end_job(domain.store, job.id, end)
    for step in (1, 2):  # retired: the record kept, marked deleted, the bytes gone
        assert files.retrieve(domain.store, acme.viewer, archives[step]).row.deleted
        assert not paths[step].exists() and not checkpoint_dir(run, step).exists()
        with pytest.raises(NotFound):
            files.content_path(domain.store, acme.trainer, archives[step])
    assert paths[3].exists() and checkpoint_dir(run, 3).exists()
    path, _name = files.content_path(domain.store, acme.trainer, archives[3])
    assert path.read_bytes() == b"weights of step 3" * 100
    _, listed, _ = jobs.list_checkpoints(domain.store, acme.viewer, job.id, None, 10)
    assert [c.step for c in listed] == [3]  # no longer listed among the job's checkpoints
    # the job's events (each checkpoint's among them) and its ledger are never deleted
    events, _ = jobs.list_events(domain.store, acme.viewer, job.id, None, 100)
    assert {f"Checkpoint at step {s}" for s in (1, 2, 3)} <= {e.message for e in events}
    assert jobs.ledger(domain.store, acme.viewer, job.id).ledger is not None


def test_without_a_retention_setting_every_checkpoint_stays(domain, tmp_path):
    acme = domain.acme
    data_set = domain.upload(acme.owner, reviews(), epsilon=8.0)
    job = domain.create_job(acme.trainer, data_set.row.id)
    assert job_runs.start_job(domain.store, job.id, "worker-1")
    for step in (1, 2):
        job_runs.record_progress(domain.store, job.id, step, 0.1 * step)
        job_runs.record_checkpoint(domain.store, job.id, step, 0.1 * step, _archive(tmp_path, step))
    job_runs.end_job(domain.store, job.id, "succeeded")
    _, rows, _ = jobs.list_checkpoints(domain.store, acme.viewer, job.id, None, 10)
    assert sorted(c.step for c in rows) == [1, 2]
    for c in rows:
        assert files.content_path(domain.store, acme.trainer, c.file_id)[0].exists()
