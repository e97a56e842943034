"""A budget group's events as the budget composes them (``budget.group_events``): read from the
columns the events need, each stored event parsed once per process (``event_from_dict``), they
are the events of the former reading — whole job rows, ``committed_event`` / ``spent_event``
per row — slot for slot: queued, running (part of its steps done), settled and cancelled
jobs."""

from __future__ import annotations

from sqlalchemy import select

from dprc_core.accounting import PrivacyEvent
from service.budget import budget
from service.jobs import job_runs, jobs
from service.store.tables import BudgetGroup, File
from tests.service.conftest import reviews


def _row_by_row(session, group):
    rows = budget.group_jobs(session, group.id)
    releases = budget.group_releases(session, group.id)
    return (
        tuple([budget.spent_event(j) for j in rows] + [budget.release_spent(r) for r in releases]),
        tuple(
            [budget.committed_event(j) for j in rows]
            + [budget.release_committed(r) for r in releases]
        ),
    )


def test_group_events_are_the_rows_events(domain):
    acme = domain.acme
    data_set = domain.upload(acme.owner, reviews(), epsilon=30.0)
    made = [
        domain.create_job(acme.trainer, data_set.row.id, epsilon=1.0 + 0.1 * i) for i in range(4)
    ]
    assert job_runs.start_job(domain.store, made[1].id, "w")
    job_runs.record_progress(domain.store, made[1].id, 1, 0.0)  # running, 1 step done
    assert job_runs.start_job(domain.store, made[2].id, "w")
    job_runs.record_progress(domain.store, made[2].id, 1, 0.0)
    job_runs.end_job(domain.store, made[2].id, "cancelled")  # settled to 1 step
    jobs.cancel(domain.store, acme.trainer, made[3].id)  # queued, cancelled: nothing spent
    with domain.store.sessions() as session:
        file = session.scalar(select(File).where(File.id == data_set.row.id))
        group = session.scalar(select(BudgetGroup).where(BudgetGroup.id == file.group_id))
        read = budget.group_events(session, group)
        again = budget.group_events(session, group)
        expected = _row_by_row(session, group)
    assert read == expected == again
    spent, committed = read
    assert spent[0] is None and committed[0] is not None  # queued: its plan reserved
    assert spent[1] is not None and spent[1].steps == 1 and committed[1].steps > 1
    assert spent[2] == committed[2] and spent[2].steps == 1
    assert spent[3] is None and committed[3] is None


def test_event_from_dict_is_from_dict():
    data = {"noise_multiplier": 1.1, "sample_rate": 0.05, "steps": 20, "clipping": "exact"}
    event = budget.event_from_dict(data)
    assert event == PrivacyEvent.from_dict(data)
    assert budget.event_from_dict(dict(reversed(list(data.items())))) is event  # parsed once
    hutch = {**data, "clipping": "hutch", "k": 32, "sketch": "per_example"}
    assert budget.event_from_dict(hutch) == PrivacyEvent.from_dict(hutch) != event
