"""The service's Prometheus metrics (``GET /metrics``, docs/operations.md).

Two kinds:

* counted as things happen in this process (:data:`REGISTRY`): calibration time and budget
  refusals; the API adds its requests (``api/metrics.py``);
* read from the store at each scrape (:class:`StoreCollector`): jobs by status, the queue's
  depth and the age of its oldest job, each running job's steps, steps per second and last
  heartbeat, and the ε committed on each budget group. Workers write their progress to the
  store, so a scrape of any API process sees every worker's jobs (no metrics port per worker,
  no push gateway).

Nothing here carries a key, a seed, a file name or a line of data: labels are ids, statuses and
tenant names."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from service.store.job_status import JobStatus
from service.store.store import Store
from service.store.tables import BudgetGroup, Tenant
from service.store.tables import Job as JobRow

REGISTRY = CollectorRegistry(auto_describe=True)

CALIBRATION_SECONDS = Histogram(
    "dprc_calibration_seconds",
    "Time to calibrate a job's noise multiplier (the accountant's search)",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
    registry=REGISTRY,
)
BUDGET_REFUSALS = Counter(
    "dprc_budget_refusals",
    "Jobs refused because their planned epsilon would exceed the data set's budget",
    registry=REGISTRY,
)


class StoreCollector(Collector):
    """Gauges read from the store at each scrape (see the module docstring)."""

    def __init__(self, store: Callable[[], Store]) -> None:
        self.store = store  # the process's store when scraped (an app opens it at start-up)

    def collect(self) -> Iterator[Metric]:
        now = time.time()
        jobs = GaugeMetricFamily("dprc_jobs", "Jobs by status", labels=["status"])
        depth = GaugeMetricFamily("dprc_queue_depth", "Jobs queued, waiting for a worker")
        oldest = GaugeMetricFamily(
            "dprc_queue_oldest_age_seconds", "Age of the oldest queued job (0: none queued)"
        )
        steps = GaugeMetricFamily(
            "dprc_job_steps_done", "Steps a running job has done", labels=["job_id"]
        )
        rate = GaugeMetricFamily(
            "dprc_job_steps_per_second",
            "A running job's steps per second since it started",
            labels=["job_id"],
        )
        beat = GaugeMetricFamily(
            "dprc_job_heartbeat_age_seconds",
            "Seconds since a running job's worker last renewed its lease",
            labels=["job_id"],
        )
        committed = GaugeMetricFamily(
            "dprc_budget_epsilon_committed",
            "Composed epsilon committed on a budget group (spent plus reserved), at its delta",
            labels=["tenant", "budget_group"],
        )
        budget = GaugeMetricFamily(
            "dprc_budget_epsilon",
            "A budget group's epsilon budget",
            labels=["tenant", "budget_group"],
        )
        with self.store().sessions() as session:
            counts = dict(
                session.execute(select(JobRow.status, func.count()).group_by(JobRow.status)).all()
            )
            for status in JobStatus:
                jobs.add_metric([status.value], float(counts.get(status.value, 0)))
            depth.add_metric([], float(counts.get(JobStatus.QUEUED.value, 0)))
            first = session.scalar(
                select(func.min(JobRow.created_at)).where(JobRow.status == JobStatus.QUEUED.value)
            )
            oldest.add_metric([], max(0.0, now - first) if first is not None else 0.0)
            running = session.execute(
                select(JobRow.id, JobRow.steps_done, JobRow.started_at, JobRow.heartbeat_at).where(
                    JobRow.status == JobStatus.RUNNING.value
                )
            ).all()
            for job_id, done, started, heartbeat in running:
                steps.add_metric([job_id], float(done))
                if started is not None and now > started:
                    rate.add_metric([job_id], done / (now - started))
                if heartbeat is not None:
                    at = heartbeat if heartbeat.tzinfo else heartbeat.replace(tzinfo=UTC)
                    beat.add_metric(
                        [job_id], max(0.0, datetime.now(UTC).timestamp() - at.timestamp())
                    )
            groups = session.execute(
                select(
                    Tenant.name,
                    BudgetGroup.id,
                    BudgetGroup.epsilon_committed,
                    BudgetGroup.epsilon_budget,
                )
                .join(Tenant, Tenant.id == BudgetGroup.tenant_id)
                .where(BudgetGroup.epsilon_budget.is_not(None))
            ).all()
            for tenant, group_id, spent, eps in groups:
                committed.add_metric([tenant, group_id], float(spent))
                budget.add_metric([tenant, group_id], float(eps or 0.0))
        yield from (jobs, depth, oldest, steps, rate, beat, committed, budget)
