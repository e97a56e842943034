"""``dprc jobs get --follow``: status, step, training loss and ε of a job, live, until it ends.

One line (or, with ``--json``, one JSON object) each time the status or the step changes. The
exit status says how the job ended: 0 succeeded, 1 failed or cancelled, 3 paused (following
stops: a paused job waits for ``dprc jobs resume``)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from dprc.client.api import Client
from dprc.client.tables import number

EXIT_CODES = {"succeeded": 0, "failed": 1, "cancelled": 1, "paused": 3}


def _latest_loss(client: Client, job_id: str) -> float | None:
    """The training loss of the newest step event (None when not reported)."""
    for event in client.events(job_id, limit=10)["data"]:  # newest first
        data = event.get("data") or {}
        if event.get("type") == "metrics" and "train_loss" in data:
            return float(data["train_loss"])
    return None


def snapshot(client: Client, job: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": job["id"],
        "status": job["status"],
        "step": job["steps_done"],
        "steps_total": job["steps_total"],
        "train_loss": _latest_loss(client, job["id"]) if job["steps_done"] else None,
        "epsilon": job["privacy"].get("epsilon_spent"),
    }


def line(s: dict[str, Any]) -> str:
    return (
        f"{time.strftime('%H:%M:%S')}  {s['status']:<10}  step {s['step']}/{s['steps_total']}"
        f"  loss {number(s['train_loss'])}  ε {number(s['epsilon'])}"
    )


def follow(
    client: Client, job_id: str, as_json: bool, interval: float, timeout: float | None
) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    last: tuple[str, int] | None = None
    while True:
        job = client.get_job(job_id)
        now = (job["status"], job["steps_done"])
        if now != last:
            s = snapshot(client, job)
            print(json.dumps(s) if as_json else line(s), flush=True)
            last = now
        status = job["status"]
        if status in EXIT_CODES:
            if status == "failed":
                err = job.get("error") or {}
                print(
                    f"dprc: job {job_id} failed: {err.get('code')}: {err.get('message')}",
                    file=sys.stderr,
                )
            elif status != "succeeded":
                print(f"dprc: job {job_id} is {status}", file=sys.stderr)
            return EXIT_CODES[status]
        if deadline is not None and time.monotonic() > deadline:
            print(f"dprc: job {job_id} still {status} after {timeout:g} s", file=sys.stderr)
            return 4
        time.sleep(interval)
