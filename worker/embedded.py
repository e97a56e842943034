"""The embedded worker: with no broker configured, jobs run in a thread of the API process —
the same task code (:func:`worker.execution.execute_job`) as the Celery workers.

Jobs run one at a time, in submission order. At start-up and every ``sweep_seconds`` the
worker also picks up queued jobs and jobs whose lease expired (a previous process died), so a
restarted ``dprc serve`` resumes interrupted jobs from their last checkpoint. On shutdown the
running job stops after its current step, writes a checkpoint and stays ``running``; it
resumes when the service comes back.
"""

from __future__ import annotations

import logging
import queue
import threading

from service.base.logging_setup import log_context
from service.jobs.lifecycle import runnable_jobs
from service.store.store import Store
from service.synthetic import synthetic_runs
from worker.attempt import worker_id
from worker.execution import execute_job

log = logging.getLogger(__name__)


class EmbeddedWorker:
    def __init__(self, store: Store):
        self.store = store
        self.owner = worker_id()
        self._queue: queue.Queue[str] = queue.Queue()
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._work, daemon=True, name="dprc-embedded-worker"),
            threading.Thread(target=self._sweep, daemon=True, name="dprc-embedded-sweep"),
        ]

    def start(self) -> EmbeddedWorker:
        for t in self._threads:
            t.start()
        log.info("embedded worker %s started", self.owner)
        return self

    def submit(self, job_id: str, devices: int = 1, nodes: int = 1) -> None:
        if nodes > self.store.settings.worker_nodes:
            log.warning(
                "job %s needs %d hosts, this worker launches on %d: left for another worker",
                job_id,
                nodes,
                self.store.settings.worker_nodes,
            )
            return
        if nodes == 1 and devices > self.store.settings.worker_devices:
            log.warning(
                "job %s needs %d devices, this worker has %d: left for another worker",
                job_id,
                devices,
                self.store.settings.worker_devices,
            )
            return
        with self._lock:
            if job_id in self._pending:
                return
            self._pending.add(job_id)
        self._queue.put(job_id)

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        self._queue.put("")  # wake the worker
        for t in self._threads:
            t.join(timeout=timeout)

    def _sweep(self) -> None:
        while not self._stop.is_set():
            try:
                for job_id, devices, nodes in runnable_jobs(self.store):
                    self.submit(job_id, devices, nodes)
                for job_id in synthetic_runs.runnable(self.store):
                    self.submit(job_id)
            except Exception:
                log.exception("embedded worker sweep failed")
            self._stop.wait(self.store.settings.sweep_seconds)

    def _work(self) -> None:
        while not self._stop.is_set():
            job_id = self._queue.get()
            if not job_id or self._stop.is_set():
                continue
            try:
                with log_context(job_id=job_id):
                    try:
                        outcome = execute_job(self.store, job_id, self.owner, stop=self._stop)
                        log.info("job %s: %s", job_id, outcome)
                    except Exception:
                        log.exception("job %s crashed the embedded worker's task", job_id)
            finally:
                with self._lock:
                    self._pending.discard(job_id)
            try:  # the synthetic-data jobs that waited for this one
                for waiting in synthetic_runs.waiting_on(self.store, job_id):
                    self.submit(waiting)
            except Exception:
                log.exception("looking up the synthetic-data jobs of %s failed", job_id)
