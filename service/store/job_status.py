"""A job's statuses and which of them hold a budget reservation. The moves between them are
:mod:`service.jobs.lifecycle`'s; the budget (:mod:`service.budget.budget`) reads only which are
active."""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    """The statuses the API returns (OpenAI's fine-tuning job statuses plus ``paused``)."""

    VALIDATING_FILES = "validating_files"  # never assigned: creation validates synchronously
    QUEUED = "queued"
    RUNNING = "running"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE = frozenset(
    {JobStatus.VALIDATING_FILES, JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.PAUSED}
)  # hold a budget reservation (their whole plan)
TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
INITIAL = JobStatus.QUEUED  # what job creation inserts
