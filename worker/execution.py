"""One job, run by a worker: the task body shared by the Celery task and the embedded worker.

The worker takes the job's lease (a live copy elsewhere makes this one exit), renews it from a
heartbeat thread, builds a :class:`dprc_core.training.runner.JobSpec` from the job row (the
service's plan — σ, q, steps, δ — is used as is), runs it with progress, events and
checkpoints going to the store, and ends the job: ``succeeded``, ``cancelled`` (cooperative,
between steps, with a final checkpoint) or ``failed`` with an error code and a message. Ending
settles the file's budget reservation to the steps that ran. A job whose worker dies keeps
``running`` with an expiring lease; the next worker's sweep resumes it from its last
checkpoint (the runner resumes from the job's run folder).

A job with ``devices`` > 1 runs on that many ranks of this host (:mod:`worker.ranks`), one with
``nodes`` > 1 on ``nodes × devices`` ranks of the Ray cluster (``DPRC_LAUNCHER=ray``); the
worker keeps the lease and records what rank 0 reports. A rank that is killed ends the attempt:
the lease is released at once and the next sweep resumes the job from its last checkpoint, up
to ``rank_attempts`` attempts, after which the job fails (``rank_failed``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tarfile
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dprc_core.clipping import Clipping
from dprc_core.mechanism_names import GAUSSIAN
from dprc_core.noise.mechanisms import noise_from_dict, noise_from_request
from dprc_core.training import checkpoint as ckpt_io
from dprc_core.training.models import LoraSpec
from dprc_core.training.ray_launch import Shape
from dprc_core.training.runner import (
    JobData,
    JobResult,
    JobSpec,
    Progress,
    prepare_data_stores,
    run_job,
)
from dprc_core.training.token_store import TokenStore
from service.base.errors import NotFound
from service.base.logging_setup import log_context
from service.budget import budget
from service.data import token_hashes
from service.data.private_data import engine_seed, token_store_dir
from service.jobs import job_runs as runs
from service.jobs import lifecycle
from service.jobs.jobs import SYNTHETIC_RECORD_FORMATS
from service.jobs.lifecycle import WorkerOutcome
from service.models import builtin_models as builtin
from service.models import fine_tuned_models, model_folders
from service.models.model_registry import Model, registry
from service.store.store import Store
from service.synthetic import synthetic_runs
from worker.attempt import Heartbeat, JobFailure, failure_of, run_dir, worker_id
from worker.ranks import (
    RankFailure,
    RanksDied,
    RanksResult,
    RayCluster,
    build_stores,
    builds_in_child,
    run_on_ranks,
)

log = logging.getLogger(__name__)


def build_spec(store: Store, req: runs.JobRequest) -> JobSpec:
    """The runner's spec of a job: the allow-listed model's folder, the job's files on disk,
    its hyperparameters, and the service's plan (σ, δ, the norm method) used as is."""
    settings = store.settings
    model = _ready_model(store, req)
    _check_files_on_disk(req)
    train_file, validation_file = _training_files(store, req)
    return JobSpec(
        model=str(model.path),
        task=model.task,
        train_file=str(train_file),
        validation_file=str(validation_file) if validation_file is not None else None,
        output_dir=str(run_dir(store, req.id)),
        **_hyperparameter_fields(store, req.hyperparameters),
        **_privacy_fields(store, req),
        checkpoint_every=req.checkpoint_every,
        seed=engine_seed(settings.data_dir, req.seed),  # not the API-visible seed
        max_physical_batch_size=settings.max_physical_batch_size,
        device=settings.device,
        token_store=str(token_store_dir(settings.data_dir, req.tenant_id)),
        sharding=req.sharding,
    )


def _training_files(store: Store, req: runs.JobRequest) -> tuple[Path, Path | None]:
    """The files the runner reads: the job's own, or for a generator of synthetic records
    (``synthetic_records``) its text or classification lines rendered as prompt-completion
    lines, line for line with the user field kept (:mod:`dprc_core.synthetic.records`), into
    the job's run folder (written again on every attempt: the same bytes)."""
    if not req.hyperparameters.get("synthetic_records"):
        return req.file_path, req.validation_path
    from dprc_core.synthetic.records import file_format, write_conditioned_file

    if file_format(req.file_path) not in SYNTHETIC_RECORD_FORMATS:
        return req.file_path, req.validation_path
    user_field = unit_fields(req.privacy).get("user_field")
    folder = run_dir(store, req.id)
    folder.mkdir(parents=True, exist_ok=True)
    rendered = folder / "synthetic-train.jsonl"
    write_conditioned_file(req.file_path, rendered, user_field)
    valid = None
    if req.validation_path is not None:
        valid = folder / "synthetic-validation.jsonl"
        write_conditioned_file(req.validation_path, valid)
    return rendered, valid


def _ready_model(store: Store, req: runs.JobRequest) -> Model:
    """The job's model and its folder on disk: an allow-listed one (a buildable one built
    first), or one of the tenant's fine-tuned models, unpacked from its last checkpoint."""
    name = req.model
    if fine_tuned_models.is_fine_tuned(name):
        return _fine_tuned_model(store, req.tenant_id, name)
    model = registry(store.settings).get(name)
    if model is None:
        raise JobFailure("model_not_found", f"model {name!r} is no longer in the allow-list")
    if model.buildable and not model.ready:
        builtin.build_tiny_llama(model.path)
    if not model.ready:
        raise JobFailure(
            "model_not_found",
            f"model {name!r}: its folder {model.path} has "
            "no config.json (was it removed from disk?)",
        )
    return model


def _fine_tuned_model(store: Store, tenant_id: int, name: str) -> Model:
    try:
        ft = fine_tuned_models.lookup(store, tenant_id, name)
    except NotFound as exc:
        raise JobFailure(
            "model_not_found",
            f"the fine-tuned model {name!r} is gone (its job's last checkpoint was deleted, or "
            "its base left the allow-list)",
        ) from exc
    try:  # a LoRA fine-tune: its adapter merged into the model its job started from
        path = model_folders.whole_folder(store, tenant_id, name)
    except (NotFound, ValueError) as exc:
        raise JobFailure("model_not_found", f"the model {name!r}: {exc}") from exc
    return Model(name, ft.base.task, path, False)


def _check_files_on_disk(req: runs.JobRequest) -> None:
    """The training file's data, and the validation file's when the job has one."""
    if not req.file_path.is_file():
        raise JobFailure("training_file_missing", "the training file's data is missing on disk")
    if req.validation_file is not None and (
        req.validation_path is None or not req.validation_path.is_file()
    ):
        raise JobFailure(
            "validation_file_missing",
            f"the validation file {req.validation_file} was deleted or its data is missing",
        )


def _hyperparameter_fields(store: Store, hp: dict[str, Any]) -> dict[str, Any]:
    """The spec's training fields from the job's hyperparameters (the learning rate: given,
    else the service's base rate times the multiplier)."""
    lr = hp.get("learning_rate")
    if lr is None:
        lr = store.settings.base_learning_rate * float(hp.get("learning_rate_multiplier") or 1.0)
    return {
        "epochs": int(hp["n_epochs"]),
        "batch_size": int(hp["batch_size"]),
        "learning_rate": float(lr),
        "optimizer": "adam",
        "max_seq_len": int(hp.get("max_seq_len") or 128),
        "lora": LoraSpec(**hp["lora"]) if hp.get("lora") else None,
        "train_only": hp.get("train_only"),
        "method": hp.get("method") or "supervised",
        "beta": hp.get("beta"),
    }


def _privacy_fields(store: Store, req: runs.JobRequest) -> dict[str, Any]:
    """The spec's privacy fields: the engine's mechanism objects the service stored with the
    job (``privacy.mechanisms``), read back and checked against the job's plan; a job stored
    before they were (no ``mechanisms``): from its privacy settings as stored then."""
    pr = req.privacy
    stored = pr.get("mechanisms")
    if stored is None:
        return _legacy_privacy_fields(store, req)
    try:
        clipping, noise = Clipping.from_dict(stored["clipping"]), noise_from_dict(stored["noise"])
    except (KeyError, TypeError, ValueError) as exc:
        raise JobFailure(
            "plan_mismatch", f"the job's stored mechanisms are invalid: {exc}"
        ) from exc
    if noise.noise_multiplier != req.noise_multiplier:
        raise JobFailure(
            "plan_mismatch",
            f"the stored noise multiplier {noise.noise_multiplier} is not the job's "
            f"{req.noise_multiplier}",
        )
    # secure mode is the worker's setting (docs/engine.md), for a mechanism that can take it;
    # an attempt that runs otherwise than the job was created with says so in an event
    # (_attempt_spec)
    noise = noise.with_secure(store.settings.secure_rng)
    return {
        "clipping": clipping,
        "noise": noise,
        "secure_rng": noise.secure,
        **unit_fields(pr),
        "target_epsilon": None,
        "target_delta": float(pr["target_delta"]),
        "report_train_loss": bool(pr.get("report_train_loss", True)),
        "scale_width": charged_scale_width(pr),
    }


def charged_scale_width(privacy: dict[str, Any]) -> float | None:
    """The hidden-scale law the job was planned and charged on, which the runner plans and
    accounts it on (one law per job: its budget, ledger and live ε): the scale width of its
    stored planned event (``privacy.event``; a per-example event stored before the law was
    recorded is on the legacy 0.1 % law, :meth:`SubsampledGaussianEvent.from_json_fields`).
    None for a job without a hidden scale (shared sketches, exact norms, ν-DP-FTRL)."""
    stored = privacy.get("event")
    if stored is None:  # pragma: no cover - migration 0012 wrote it for every job
        return None
    try:
        event = budget.event_from_dict(stored)
    except ValueError as exc:
        raise JobFailure("plan_mismatch", f"the job's stored event is invalid: {exc}") from exc
    width = getattr(event, "scale_width", None)
    return None if width is None else float(width)


def unit_fields(privacy: dict[str, Any]) -> dict[str, Any]:
    """The spec's privacy-unit fields from the job's stored ``privacy.unit`` (absent: a job
    stored before units, per example)."""
    unit = privacy.get("unit") or {"type": "example"}
    if unit.get("type") != "user":
        return {"privacy_unit": "example"}
    return {
        "privacy_unit": "user",
        "user_field": str(unit["field"]),
        "max_examples_per_user": int(unit["max_examples_per_user"]),
    }


def _legacy_privacy_fields(store: Store, req: runs.JobRequest) -> dict[str, Any]:
    """The spec's privacy fields of a job stored without ``privacy.mechanisms``."""
    settings, pr = store.settings, req.privacy
    clip = pr["clipping"]
    # what was asked of the noise: as stored then, or as the planned event (migration 0012)
    # names the mechanism and its own fields
    asked = pr.get("noise") or pr.get("event") or {}
    noise = noise_from_request(
        asked.get("mechanism", GAUSSIAN), nu=asked.get("nu"), bands=asked.get("bands")
    ).with_secure(settings.secure_rng)
    return {
        "target_epsilon": None,
        "target_delta": float(pr["target_delta"]),
        "noise_multiplier": req.noise_multiplier,
        "max_grad_norm": float(pr["max_grad_norm"]),
        "norm_method": clip["method"],
        "k": int(clip.get("k") or settings.default_k),
        # the request's sketch (a job stored before sketches were offered: shared); the runner
        # accounts shared for a plan that resolves to exact norms only
        "sketch": str(clip.get("sketch", "shared")),
        "scale_width": charged_scale_width(pr),
        "report_train_loss": bool(pr.get("report_train_loss", True)),
        "noise": noise,
        "secure_rng": noise.secure,
    }


def _archive(ckpt: Path) -> Path:
    """A tar of the checkpoint's released files (weights, config, tokenizer, ledger,
    metadata): never its ``resume/`` folder."""
    fd, name = tempfile.mkstemp(suffix=".tar", dir=ckpt.parent)
    os.close(fd)
    with tarfile.open(name, "w") as tar:
        for path in ckpt_io.release_files(ckpt):
            tar.add(path, arcname=str(path.relative_to(ckpt)))
    return Path(name)


def execute_job(
    store: Store, job_id: str, owner: str | None = None, stop: threading.Event | None = None
) -> WorkerOutcome:
    """Run or resume ``job_id`` (:func:`_execute_job`; a synthetic-data job's id:
    :func:`worker.synthesis.execute_synthetic`), its log lines carrying its id."""
    with log_context(job_id=job_id):
        if synthetic_runs.is_synthetic(job_id):
            from worker.synthesis import execute_synthetic

            return execute_synthetic(store, job_id, owner or worker_id(), stop)
        return _execute_job(store, job_id, owner, stop)


def _execute_job(
    store: Store, job_id: str, owner: str | None, stop: threading.Event | None
) -> WorkerOutcome:
    """Run or resume ``job_id``. Returns what happened (:class:`WorkerOutcome`).

    Phases: take the lease (a live copy elsewhere: skipped) and start the heartbeat; run the
    attempt; end the job by how the attempt ended."""
    owner = owner or worker_id()
    lease = store.settings.lease_seconds
    settings = store.settings
    if not runs.start_job(
        store, job_id, owner, lease, settings.worker_devices, settings.worker_nodes
    ):
        return WorkerOutcome.SKIPPED
    beat = Heartbeat(store, job_id, owner, lease)
    try:
        spec, result = _run_attempt(store, job_id, beat, stop)
    except RankFailure as exc:
        return _fail(store, job_id, exc.code, str(exc), beat)
    except RanksDied as exc:
        return _rank_died(store, job_id, owner, str(exc), beat)
    except Exception as exc:
        code, message = failure_of(exc)
        if code in ("training_error", "internal_error"):
            log.exception("job %s failed", job_id)
        return _fail(store, job_id, code, message, beat)
    finally:
        beat.stop()
    _record_missed_checkpoint(store, job_id, Path(spec.output_dir))
    return _end_attempt(store, job_id, owner, result.status, beat)


def _run_attempt(
    store: Store, job_id: str, beat: Heartbeat, stop: threading.Event | None
) -> tuple[JobSpec, Any]:
    """The job's spec and the runner's result (on one device or on ``devices`` ranks), with
    progress and checkpoints recorded in the store as they come."""
    req = runs.job_request(store, job_id)
    spec = _attempt_spec(store, req)
    on_progress = _progress_recorder(store, req)
    should_stop = _stop_check(store, job_id, beat, stop)
    result: Any

    def on_event(message: str) -> None:
        runs.record_event(store, job_id, message)

    def on_data(data: JobData) -> None:
        check_token_sequences(store, req, data)

    # a big file's stores are built by a child process, whose memory goes back on exit
    if builds_in_child(spec) and not build_stores(spec, should_stop, on_event):
        return spec, RanksResult(status="stopped", steps=0)  # asked to stop while building
    if req.devices > 1 or req.nodes > 1:
        on_data(prepare_data_stores(spec, on_event))  # once, before the ranks open it
        ray = None
        if req.nodes > 1:
            settings = store.settings
            ray = RayCluster(str(settings.ray_address), settings.ray_wait_seconds)
        shape = Shape(req.nodes, req.devices)
        result = run_on_ranks(spec, shape, on_progress, should_stop, on_event, ray=ray)
    else:
        result = run_job(
            spec,
            on_progress=on_progress,
            should_stop=should_stop,
            on_event=on_event,
            on_data=on_data,
        )
    if result.steps != req.steps_total:
        raise JobFailure(
            "plan_mismatch",
            f"the runner planned {result.steps} steps, the job {req.steps_total}",
        )
    if isinstance(result, JobResult):
        check_sampling(req, result.plan.dataset_size, result.plan.sample_rate)
    else:
        check_sampling(req, result.units, result.sample_rate)
    return spec, result


def check_token_sequences(store: Store, req: runs.JobRequest, data: JobData) -> None:
    """Before the job's first step: its data's token-id sequences against those of the
    tenant's other budget groups for this tokenizer (:mod:`service.data.token_hashes`). One that
    another group holds fails the job (``budget_group_overlap``); else the group's new ones are
    recorded. A file without a budget group (validation-only data) is not checked."""
    group_id = token_hashes.job_group(store, req.id)
    if group_id is None or not isinstance(data.train, TokenStore):
        return
    outcome = token_hashes.check_and_record(store, req.tenant_id, group_id, data.train)
    if isinstance(outcome, token_hashes.Overlap):
        raise JobFailure(
            "budget_group_overlap",
            token_hashes.overlap_message(outcome, data.train, req.file_path, req.model),
        )
    runs.record_event(
        store,
        req.id,
        f"Checked the data's {outcome.sequences:,} distinct token sequences against the other "
        f"data sets: none shared ({outcome.added:,} newly recorded for this one)",
    )


def check_sampling(req: runs.JobRequest, units: int | None, sample_rate: float | None) -> None:
    """The runner's N (examples, or users) and sampling rate q against the job's plan, which
    the budget charged (``privacy.dataset_size``, ``sample_rate``): a runner that read another
    N from the training file (a file changed on disk, a different user key) samples at another
    q than the one accounted for. Checked at the first step, before it is recorded, and at the
    end; ``None``: not reported (a runner before they were)."""
    planned_n = req.privacy.get("dataset_size")
    unit = str((req.privacy.get("unit") or {}).get("type", "example"))
    if units is not None and planned_n is not None and int(units) != int(planned_n):
        raise JobFailure(
            "plan_mismatch",
            f"the runner reads N={units} {unit}s from the training file, the job was planned "
            f"and charged for N={planned_n} (sampling rate {req.sample_rate:g}); the training "
            "data changed since the job was created",
        )
    if sample_rate is not None and float(sample_rate) != req.sample_rate:
        raise JobFailure(
            "plan_mismatch",
            f"the runner samples at q={sample_rate!r}, the job was planned and charged at "
            f"q={req.sample_rate!r}",
        )


def _attempt_spec(store: Store, req: runs.JobRequest) -> JobSpec:
    """The spec this attempt runs: the job's, in its checkpoint's randomness mode; what it
    runs with that the settings do not say (and a resume) told in the job's events."""
    spec = build_spec(store, req)
    if spec.task == "causal_lm" and req.n_examples < 2:
        raise JobFailure("invalid_training_file", "the training file needs >= 2 examples")
    spec = _keep_checkpoint_mode(spec)
    if settings_secure_but_not(store, spec):
        runs.record_event(
            store,
            req.id,
            f"Secure mode covers Gaussian noise only: this job's {spec.mechanism.title} noise and "
            "batch order come from torch's generator, seeded from the OS"
            if not spec.mechanism.secure_capable
            else "Secure mode is on, but this job resumes from a checkpoint written without "
            "it: its noise and batches continue from torch's generator",
        )
    stored_noise = (req.privacy.get("mechanisms") or {}).get("noise")
    stored = noise_from_dict(stored_noise) if stored_noise else spec.mechanism
    if stored.secure_capable and stored.secure != spec.secure_rng:
        runs.record_event(
            store,
            req.id,
            f"Secure mode is {'on' if spec.secure_rng else 'off'} on this worker and was "
            f"{'on' if stored.secure else 'off'} where the job was created: the "
            "worker's setting decides where its noise and batches come from",
        )
    latest = ckpt_io.latest_checkpoint(Path(spec.output_dir))
    if latest is not None and (latest / "resume").is_dir():
        step = ckpt_io.read_metadata(latest)["step"]
        runs.record_event(store, req.id, f"Resuming from the checkpoint at step {step}")
    return spec


def _progress_recorder(store: Store, req: runs.JobRequest) -> Callable[[Progress], None]:
    """The runner's progress callback: the runner's N and q against the plan and the
    accounting the runner resolved (first progress: :func:`check_sampling`,
    :func:`service.jobs.job_runs.record_accounting`), each step's metrics, and each checkpoint's
    archive."""

    accounted = sampled = False
    job_id = req.id

    def on_progress(p: Progress) -> None:
        nonlocal accounted, sampled
        if not sampled:  # before the step is recorded
            check_sampling(req, p.units, p.sample_rate)
            sampled = True
        if not accounted and p.envelope is not None and p.sketch is not None:
            # before the step is recorded: the job is charged what the runner accounts
            try:
                runs.record_accounting(store, job_id, p.envelope, p.sketch, p.scale_width)
            except runs.AccountingMismatch as exc:
                raise JobFailure("plan_mismatch", str(exc)) from exc
            accounted = True
        metrics: dict[str, Any] = {"batch_size": p.batch_size, "dropped": p.dropped}
        if p.loss is not None:
            metrics["train_loss"] = p.loss
        if p.clipped_fraction is not None:
            metrics["clipped_fraction"] = p.clipped_fraction
        if p.valid_loss is not None:
            metrics["valid_loss"] = p.valid_loss
        for name in ("valid_reward_margin", "valid_reward_accuracy"):  # method dpo
            if getattr(p, name) is not None:
                metrics[name] = getattr(p, name)
        runs.record_progress(store, job_id, p.step, p.epsilon or 0.0, metrics)
        if p.checkpoint is not None:
            runs.record_checkpoint(
                store, job_id, p.step, p.epsilon or 0.0, _archive(Path(p.checkpoint)), metrics
            )

    return on_progress


def _stop_check(
    store: Store, job_id: str, beat: Heartbeat, stop: threading.Event | None
) -> Callable[[], bool]:
    """The runner's ``should_stop``: the lease lost, the worker stopping, or a cancel or a
    pause asked for."""

    def should_stop() -> bool:
        return (
            beat.lost
            or (stop is not None and stop.is_set())
            or any(lifecycle.stop_requested(store, job_id))
        )

    return should_stop


def _end_attempt(
    store: Store, job_id: str, owner: str, status: str, beat: Heartbeat
) -> WorkerOutcome:
    """End the job by how the runner returned: succeeded; stopped for a lost lease, a cancel
    or a pause; else interrupted (the next sweep resumes it)."""
    if status == "succeeded":
        runs.end_job(store, job_id, lifecycle.JobStatus.SUCCEEDED)
        return WorkerOutcome.SUCCEEDED
    if beat.lost:
        return WorkerOutcome.LEASE_LOST
    cancel, pause = lifecycle.stop_requested(store, job_id)
    if cancel:
        runs.end_job(store, job_id, lifecycle.JobStatus.CANCELLED)
        return WorkerOutcome.CANCELLED
    if pause and runs.mark_paused(store, job_id, owner):
        return WorkerOutcome.PAUSED
    return WorkerOutcome.INTERRUPTED


def _record_missed_checkpoint(store: Store, job_id: str, out: Path) -> None:
    """A worker killed after writing a checkpoint but before recording it leaves it on disk
    only; the next attempt resumes from it (and, if it was the last, runs no step): record it
    now, so that every ended job's last checkpoint is a downloadable one."""
    latest = ckpt_io.latest_checkpoint(out)
    if latest is None:
        return
    meta = ckpt_io.read_metadata(latest)
    step, eps = int(meta["step"]), float(meta["epsilon"])
    done, recorded = runs.recorded_progress(store, job_id)
    if step in recorded:
        return
    if step > done:
        runs.record_progress(store, job_id, step, eps, {})
    runs.record_checkpoint(store, job_id, step, eps, _archive(latest), {})


def _keep_checkpoint_mode(spec: JobSpec) -> JobSpec:
    """A job resumes in the randomness mode its checkpoint was written in, even if the
    worker's ``DPRC_SECURE_RNG`` changed meanwhile (the resume state holds that mode's keys)."""
    latest = ckpt_io.latest_checkpoint(Path(spec.output_dir))
    written = ckpt_io.written_secure_rng(latest) if latest is not None else None
    if written is None or written == spec.secure_rng:
        return spec
    return dataclasses.replace(spec, secure_rng=written)


def settings_secure_but_not(store: Store, spec: JobSpec) -> bool:
    """Secure mode is on but does not cover this job's mechanism (said in an event)."""
    return store.settings.secure_rng and not spec.secure_rng


def _rank_died(
    store: Store, job_id: str, owner: str, message: str, beat: Heartbeat
) -> WorkerOutcome:
    """A rank was killed: fail the job after ``rank_attempts`` attempts, else release the
    lease so that the next sweep resumes it from its last checkpoint."""
    beat.stop()
    if beat.lost:
        return WorkerOutcome.LEASE_LOST
    attempts = runs.job_request(store, job_id).attempts
    log.warning("job %s: attempt %d ended: %s", job_id, attempts, message[:500])
    if attempts >= store.settings.rank_attempts:
        return _fail(store, job_id, "rank_failed", f"attempt {attempts}: {message}", beat)
    runs.record_event(store, job_id, f"A rank ended early (attempt {attempts}); resuming")
    lifecycle.release_lease(store, job_id, owner)
    return WorkerOutcome.INTERRUPTED


def _fail(store: Store, job_id: str, code: str, message: str, beat: Heartbeat) -> WorkerOutcome:
    beat.stop()
    if beat.lost:
        return WorkerOutcome.LEASE_LOST
    try:
        runs.end_job(
            store, job_id, lifecycle.JobStatus.FAILED, error_code=code, error_message=message[:2000]
        )
    except lifecycle.TransitionRefused:  # no longer running (e.g. it has already ended)
        pass
    return WorkerOutcome.FAILED
