"""What every job attempt of a worker shares, fine-tuning or synthetic data: the worker's id,
the job's private run folder, the lease's heartbeat, and the error (code, message) an exception
ends a job with."""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from dprc_core.training.data import DataError
from dprc_core.training.models import ModelLoadError
from dprc_core.training.validation import ValidationDataError
from service.data.private_data import run_folder
from service.jobs import lifecycle
from service.store.store import Store

log = logging.getLogger(__name__)


class JobFailure(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def run_dir(store: Store, job_id: str) -> Path:
    """Private per-job folder (checkpoints with their resume state); never served."""
    return run_folder(store.settings.data_dir, job_id)


class Heartbeat:
    """Renews the lease every ``lease/3`` seconds; ``lost`` turns true if the lease is gone."""

    def __init__(
        self,
        store: Store,
        job_id: str,
        owner: str,
        lease_seconds: int,
        renew: Callable[[Store, str, str, int], bool] = lifecycle.renew_lease,
    ):
        self.store, self.job_id, self.owner, self.lease = store, job_id, owner, lease_seconds
        self.renew = renew
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"lease-{job_id}")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(max(self.lease / 3, 0.5)):
            try:
                if not self.renew(self.store, self.job_id, self.owner, self.lease):
                    self.lost = True
                    return
            except Exception:  # a transient store error: try again at the next beat
                log.exception("lease renewal failed for %s", self.job_id)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def failure_of(exc: BaseException) -> tuple[str, str]:
    """The job error (code, message) for an exception raised while running a job."""
    if isinstance(exc, JobFailure):
        return exc.code, str(exc)
    if isinstance(exc, ValidationDataError):
        return "invalid_validation_file", str(exc)
    if isinstance(exc, DataError):
        return "invalid_training_file", str(exc)
    if isinstance(exc, ModelLoadError):
        return "model_not_found", str(exc)
    if isinstance(exc, (ValueError, RuntimeError)):
        return "training_error", f"{type(exc).__name__}: {exc}"
    return "internal_error", f"{type(exc).__name__}: {exc}"  # still ends the job, with a message
