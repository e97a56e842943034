"""Synthetic-data jobs, the client's side: create, read, list, cancel, the owner's report.

A synthetic-data job generates ``n`` records in the format of a private data set from the
``ft:`` model of a DP fine-tuning job (docs/synthetic.md, "The service"):

* **From a model**: the tenant's ``ft:`` model of a succeeded job that trained a generator of
  records — a job created by a synthetic-data job (``synthetic_records``: text or
  classification lines rendered as prompt-completion lines) or a chat fine-tune (records are
  then public prompts with generated answers).
* **From a training file**: the job creates that fine-tuning job first (``fine_tuning``: the
  body of ``POST /v1/fine_tuning/jobs`` without its file), charged to the file's budget as
  any job, and generates once it has succeeded.

What steers generation from the private data is released under DP and charged to the group:
a classification data set's labels are drawn from a label histogram released with Gaussian
noise (:mod:`dprc_core.synthetic.labels`; its event is this job's reservation in the group's
budget, :func:`service.budget.budget.release_committed`), unless the caller states a public
distribution. The data set's (ε, δ) is the composition, at the group's δ, of the fine-tuning
job's events and the histogram's: the one pair every surface shows
(:func:`privacy_summary`). The report reads the private data and is not DP: only roles that
own budgets (admin, data_owner) read it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from dprc_core.accounting import PrivacyEvent
from dprc_core.generation import SamplingSettings
from dprc_core.seeding import fresh_seed
from dprc_core.synthetic.labels import histogram_event, histogram_sigma
from dprc_core.synthetic.records import check_prompts
from service.base.clock import now
from service.base.errors import Conflict, InvalidInput, NotFound
from service.base.ids import new_id
from service.base.pagination import cursor_page
from service.budget import budget
from service.governance import audit
from service.governance.keys import Caller
from service.governance.roles import Action, authorize
from service.jobs import jobs as fine_tuning
from service.jobs.jobs import JobRequest
from service.models import fine_tuned_models
from service.store.db import locked_session
from service.store.job_status import ACTIVE, TERMINAL, JobStatus
from service.store.store import Store
from service.store.tables import BudgetGroup, File, SyntheticJob
from service.store.tables import Job as JobRow

SYNTHETIC_PREFIX = "synth"
MAX_RECORDS = 100_000
MAX_PROMPTS = 1_000
MAX_PROMPT_CHARS = 200_000  # all prompts together
DEFAULT_LABEL_SHARE = 0.1  # the histogram's ε, as a share of the fine-tuning's target ε
LABEL_CHOICES = ("dp", "uniform")
GENERATOR_FORMATS = ("text", "classification", "chat")
# who may download the records (admin always): the roles that download files, until the data
# owner says otherwise (:func:`share`)
DEFAULT_DOWNLOAD_ROLES = ("data_owner", "trainer")
SHAREABLE_ROLES = ("data_owner", "trainer", "viewer")


@dataclass(frozen=True)
class SyntheticRequest:
    """A synthetic-data job request in domain values: ``model`` (an ``ft:`` model) or
    ``training_file`` with ``fine_tuning`` (a fine-tuning request whose ``training_file`` is
    that file); ``labels``: ``"dp"``, ``"uniform"`` or ``{label: weight}``; ``label_epsilon``:
    the histogram's ε alone (default a tenth of the fine-tuning's target ε)."""

    n: int
    model: str | None = None
    training_file: str | None = None
    fine_tuning: JobRequest | None = None
    labels: str | Mapping[str, float] = "dp"
    label_epsilon: float | None = None
    prompts: Sequence[Sequence[dict[str, Any]]] = ()
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    seed: int | None = None
    holdout_file: str | None = None


def _refuse(message: str, param: str, code: str = "invalid_value") -> InvalidInput:
    return InvalidInput(message, param=param, code=code)


def _check_request(req: SyntheticRequest) -> None:
    if isinstance(req.n, bool) or not isinstance(req.n, int) or not 1 <= req.n <= MAX_RECORDS:
        raise _refuse(f"n must be an integer from 1 to {MAX_RECORDS}", "n")
    if (req.model is None) == (req.training_file is None):
        raise _refuse("give exactly one of model (an ft: model) and training_file", "model")
    if req.training_file is not None and req.fine_tuning is None:
        raise _refuse("a synthetic job from a training file needs fine_tuning", "fine_tuning")
    if req.model is not None and req.fine_tuning is not None:
        raise _refuse("fine_tuning is for a job from a training file", "fine_tuning")
    if isinstance(req.labels, str) and req.labels not in LABEL_CHOICES:
        raise _refuse('labels must be "dp", "uniform" or an object {label: weight}', "labels")
    if isinstance(req.labels, Mapping):
        if not req.labels or len(req.labels) > 1000:
            raise _refuse("labels: 1 to 1000 weights", "labels")
        weights = list(req.labels.values())
        if any(not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0 for w in weights):
            raise _refuse("label weights must be finite numbers >= 0", "labels")
        if sum(weights) <= 0:
            raise _refuse("label weights need a positive sum", "labels")
    if req.label_epsilon is not None and not (
        math.isfinite(req.label_epsilon) and 0 < req.label_epsilon <= 100
    ):
        raise _refuse("label_epsilon must be in (0, 100]", "label_epsilon")
    if len(req.prompts) > MAX_PROMPTS:
        raise _refuse(f"at most {MAX_PROMPTS} prompts", "prompts")
    if sum(len(str(m.get("content", ""))) for p in req.prompts for m in p) > MAX_PROMPT_CHARS:
        raise _refuse(f"the prompts hold more than {MAX_PROMPT_CHARS} characters", "prompts")


@dataclass(frozen=True)
class _Source:
    job_id: str
    training_file: File
    fmt: str
    target_epsilon: float


def _source_of_model(session: Session, store: Store, caller: Caller, name: str) -> _Source:
    if not fine_tuned_models.is_fine_tuned(name):
        raise _refuse(
            f"model {name[:80]!r} is not a fine-tuned model: give the ft: model of a DP job, or "
            "a training_file with fine_tuning",
            "model",
            "model_not_found",
        )
    ft = fine_tuned_models.lookup(store, caller.tenant_id, name)  # NotFound: 404
    job = session.scalar(select(JobRow).where(JobRow.id == ft.job_id))
    assert job is not None
    file = session.scalar(select(File).where(File.id == job.training_file_id))
    assert file is not None
    fmt = str(file.data_format)
    if ft.base.task != "causal_lm":
        raise _refuse(
            f"{name} is a {ft.base.task} model: it does not generate",
            "model",
            "model_not_generative",
        )
    rendered = bool(job.hyperparameters.get("synthetic_records"))
    if not (fmt == "chat" or (rendered and fmt in ("text", "classification"))):
        raise _refuse(
            f"{name} was not trained to generate records: its job trained on {fmt} lines "
            + ("" if rendered else "without synthetic_records")
            + "; create the synthetic job from the training file instead",
            "model",
            "model_not_a_generator",
        )
    if job.status != JobStatus.SUCCEEDED:
        raise _refuse(f"{name}: its job is {job.status}", "model", "model_not_ready")
    target = float(job.privacy.get("target_epsilon") or job.privacy.get("planned_epsilon") or 1)
    return _Source(job.id, file, fmt, target)


def _training_source(session: Session, caller: Caller, file_id: str) -> File:
    file = session.scalar(
        select(File).where(
            File.id == file_id, File.tenant_id == caller.tenant_id, File.deleted.is_(False)
        )
    )
    if file is None:
        raise NotFound(
            f"no such file: {file_id[:64]!r}", param="training_file", code="file_not_found"
        )
    if file.data_format not in GENERATOR_FORMATS:
        raise _refuse(
            f"synthetic records are made from text, classification or chat lines; file "
            f"{file.id} is {file.data_format}",
            "training_file",
            "invalid_file",
        )
    return file


def _holdout(session: Session, caller: Caller, file_id: str | None, fmt: str) -> str | None:
    if file_id is None:
        return None
    file = session.scalar(
        select(File).where(
            File.id == file_id, File.tenant_id == caller.tenant_id, File.deleted.is_(False)
        )
    )
    if file is None:
        raise NotFound(
            f"no such file: {file_id[:64]!r}", param="holdout_file", code="file_not_found"
        )
    if file.data_format != fmt:
        raise _refuse(
            f"the holdout file must hold {fmt} lines like the training file",
            "holdout_file",
            "invalid_file",
        )
    return file.id


def _labels_plan(
    req: SyntheticRequest,
    fmt: str,
    target_epsilon: float,
    delta: float,
    classes: frozenset[str] | None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the spec's label settings, the histogram's event or None). ``classes``: the training
    file's (None: too large to read here; the worker checks stated labels against them)."""
    if fmt != "classification":
        if req.labels != "dp" or req.label_epsilon is not None:
            raise _refuse(f"labels are for classification data sets; this one is {fmt}", "labels")
        return {"type": "none"}, None
    if req.labels == "uniform":
        return {"type": "uniform"}, None
    if isinstance(req.labels, Mapping):
        weights = {str(k): float(v) for k, v in req.labels.items()}
        if classes is not None and not set(weights) <= classes:
            extra = sorted(set(weights) - classes)[:3]
            raise _refuse(
                f"labels: {extra} are not classes of the training file (a record's label is "
                "one of its classes)",
                "labels",
            )
        return {"type": "stated", "weights": weights}, None
    eps_h = req.label_epsilon
    if eps_h is None:
        eps_h = DEFAULT_LABEL_SHARE * target_epsilon
    sigma = histogram_sigma(eps_h, delta)
    spec = {"type": "dp", "epsilon": eps_h, "noise_multiplier": sigma}
    return spec, histogram_event(sigma).to_dict()


def create(store: Store, caller: Caller, req: SyntheticRequest) -> SyntheticJob:
    """Validate, (from a file: create the fine-tuning job,) then under the group's lock check
    its budget with the label histogram's event and insert the job."""
    authorize(caller, Action.CONTROL_JOB)
    _check_request(req)
    created_job: JobRow | None = None
    with store.sessions() as session:
        if req.model is not None:
            source = _source_of_model(session, store, caller, req.model)
        else:
            assert req.training_file is not None
            file = _training_source(session, caller, req.training_file)
            source = _Source("", file, str(file.data_format), 0.0)
        if req.holdout_file is not None and req.holdout_file == source.training_file.id:
            raise _refuse(
                "the holdout file must hold other records than the training file (the report "
                "compares the synthetic records with real ones the model never saw)",
                "holdout_file",
            )
        holdout = _holdout(session, caller, req.holdout_file, source.fmt)
    if source.fmt == "chat":
        if req.prompts:
            # the prompts are written into a data set that carries no budget: text a trainer
            # could copy from the private data would leave it uncharged, so only the roles
            # that own budgets give them
            authorize(caller, Action.SET_BUDGET)
        if not req.prompts:
            raise _refuse(
                "a chat data set's synthetic records need public prompts: the model learned "
                "the answers only",
                "prompts",
            )
        try:
            prompts = check_prompts([list(p) for p in req.prompts])
        except ValueError as exc:
            raise _refuse(f"prompts: {exc}", "prompts") from exc
    elif req.prompts:
        raise _refuse(f"prompts are for chat data sets; this one is {source.fmt}", "prompts")
    else:
        prompts = []
    if req.training_file is not None:
        assert req.fine_tuning is not None
        ft_req = JobRequest(
            **{
                **req.fine_tuning.__dict__,
                "training_file": req.training_file,
                "synthetic_records": source.fmt != "chat",
            }
        )
        created_job = fine_tuning.create_job(store, caller, ft_req)
        source = _Source(
            created_job.id, source.training_file, source.fmt, float(ft_req.privacy.target_epsilon)
        )
    try:
        return _insert(store, caller, req, source, holdout, prompts)
    except BaseException:
        if created_job is not None:  # the histogram did not fit: the job it came with goes too
            fine_tuning.cancel(store, caller, created_job.id)
        raise


def _insert(
    store: Store,
    caller: Caller,
    req: SyntheticRequest,
    source: _Source,
    holdout: str | None,
    prompts: list[list[dict[str, str]]],
) -> SyntheticJob:
    with locked_session(store.sessions) as session:
        file = session.scalar(select(File).where(File.id == source.training_file.id))
        assert file is not None and file.group_id is not None
        group = budget.lock_group(session, file.group_id)
        delta = budget.group_delta(session, group)
        classes = fine_tuning.file_labels(file) if source.fmt == "classification" else frozenset()
        labels, event = _labels_plan(req, source.fmt, source.target_epsilon, delta, classes)
        if event is not None:
            planned = PrivacyEvent.from_dict(event)
            budget.reserve(session, group, planned, None, float(labels["epsilon"]), delta)
        row = SyntheticJob(
            id=new_id(SYNTHETIC_PREFIX),
            tenant_id=caller.tenant_id,
            created_at=now(),
            created_by=caller.key_id,
            status=JobStatus.QUEUED.value,
            source_job_id=source.job_id,
            training_file_id=file.id,
            group_id=group.id,
            holdout_file_id=holdout,
            n=req.n,
            spec={
                "format": source.fmt,
                "labels": labels,
                "prompts": prompts,
                "download_roles": list(DEFAULT_DOWNLOAD_ROLES),
                "sampling": {
                    "temperature": req.sampling.temperature,
                    "top_p": req.sampling.top_p,
                    "max_new_tokens": req.sampling.max_new_tokens,
                },
            },
            privacy={"event": event, "released": None, "delta": delta},
            seed=req.seed if req.seed is not None else fresh_seed(),
            records_done=0,
            events=[],
            cancel_requested=False,
            attempts=0,
        )
        session.add(row)
        session.flush()
        add_event(
            row,
            f"Synthetic data job created: {req.n} {source.fmt} records from the "
            f"model of job {source.job_id}",
        )
        audit.record(
            session,
            caller,
            "synthetic_job.create",
            row.id,
            {"source_job": source.job_id, "n": req.n, "labels": labels["type"]},
        )
        session.commit()
        session.refresh(row)
        return row


def add_event(row: SyntheticJob, message: str, level: str = "info") -> None:
    """Append an event to the job's log (kept in its row; the caller commits)."""
    row.events = [
        *list(row.events or []),
        {"created_at": now(), "level": level, "message": message},
    ]


# -- reads ------------------------------------------------------------------------------------


def get_row(session: Session, caller: Caller, job_id: str) -> SyntheticJob:
    authorize(caller, Action.READ)
    row = session.scalar(
        select(SyntheticJob).where(
            SyntheticJob.id == job_id, SyntheticJob.tenant_id == caller.tenant_id
        )
    )
    if row is None:  # another tenant's is unknown here
        raise NotFound(f"no such synthetic data job: {job_id[:64]!r}", code="job_not_found")
    return row


@dataclass(frozen=True)
class SyntheticView:
    """A job with what its object shows besides its row: the source job's status, the
    composed (ε, δ) of the data set and the unit."""

    row: SyntheticJob
    source_status: str
    model: str | None  # the source job's ft: model (None until it has succeeded)
    epsilon: float | None
    delta: float
    unit: str
    events: list[dict[str, Any]]


def privacy_summary(session: Session, row: SyntheticJob) -> tuple[float | None, str, list[dict]]:
    """(ε of the data set at the group's δ, its unit, the events composed): the fine-tuning
    job's (the steps that ran once it ended, its plan before) and the histogram's (released or
    planned). None: no finite bound."""
    job = session.scalar(select(JobRow).where(JobRow.id == row.source_job_id))
    assert job is not None
    group = session.scalar(select(BudgetGroup).where(BudgetGroup.id == row.group_id))
    assert group is not None
    events: list[PrivacyEvent] = []
    train = budget.committed_event(job)  # its plan while active, the steps that ran after
    if train is not None:
        events.append(train)
    release = budget.release_planned(row)
    if release is not None and (JobStatus(row.status) in ACTIVE or row.privacy.get("released")):
        events.append(release)
    delta = float(row.privacy.get("delta") or budget.group_delta(session, group))
    eps = budget.compose(events, delta) if events else 0.0
    unit = str((job.privacy.get("unit") or {}).get("type") or "example")
    return (eps if math.isfinite(eps) else None), unit, [e.to_dict() for e in events]


def view(session: Session, row: SyntheticJob) -> SyntheticView:
    job = session.scalar(select(JobRow).where(JobRow.id == row.source_job_id))
    assert job is not None
    eps, unit, events = privacy_summary(session, row)
    delta = float(row.privacy.get("delta") or 0.0)
    return SyntheticView(row, job.status, job.fine_tuned_model, eps, delta, unit, events)


def retrieve(store: Store, caller: Caller, job_id: str) -> SyntheticView:
    with store.sessions() as session:
        return view(session, get_row(session, caller, job_id))


def list_jobs(
    store: Store, caller: Caller, after: str | None, limit: int
) -> tuple[list[SyntheticView], bool]:
    authorize(caller, Action.READ)
    with store.sessions() as session:
        query = select(SyntheticJob).where(SyntheticJob.tenant_id == caller.tenant_id)
        rows, more = cursor_page(session, query, SyntheticJob, after, limit, "synthetic_job")
        return [view(session, r) for r in rows], more


def cancel(store: Store, caller: Caller, job_id: str) -> SyntheticView:
    """A queued job ends at once (its histogram, never drawn, is not charged); a running one
    stops at its next batch (a drawn histogram stays charged)."""
    authorize(caller, Action.CONTROL_JOB)
    with locked_session(store.sessions) as session:
        row = get_row(session, caller, job_id)
        if JobStatus(row.status) in TERMINAL:
            raise Conflict(
                f"synthetic data job {row.id} is already {row.status}",
                code="job_not_cancellable",
            )
        if row.status == JobStatus.QUEUED:
            row.status = JobStatus.CANCELLED.value
            row.finished_at = now()
            add_event(row, "Synthetic data job cancelled")
            group = budget.lock_group(session, row.group_id)
            session.flush()
            budget.settle(session, group)
        else:
            row.cancel_requested = True
            add_event(row, "Cancellation requested: the job stops after its current batch")
        audit.record(session, caller, "synthetic_job.cancel", row.id)
        session.commit()
        return view(session, row)


def share(store: Store, caller: Caller, job_id: str, roles: Sequence[str]) -> SyntheticView:
    """The roles (besides admin) that may download the job's records: the data owner's choice
    (admin and data_owner keys), kept in the job and in its data set's provenance."""
    with locked_session(store.sessions) as session:
        row = get_row(session, caller, job_id)
        authorize(caller, Action.SET_BUDGET)
        unknown = sorted(set(roles) - set(SHAREABLE_ROLES))
        if unknown:
            raise _refuse(
                f"download_roles: {unknown[0]!r} is not one of {', '.join(SHAREABLE_ROLES)}",
                "download_roles",
            )
        kept = sorted(set(roles))
        row.spec = {**dict(row.spec), "download_roles": kept}
        if row.result_file_id is not None:
            file = session.scalar(select(File).where(File.id == row.result_file_id))
            if file is not None:
                file.synthetic = {**dict(file.synthetic or {}), "download_roles": kept}
        add_event(row, f"Records shared with: admin, {', '.join(kept) or 'no other role'}")
        audit.record(session, caller, "synthetic_job.share", row.id, {"download_roles": kept})
        session.commit()
        return view(session, row)


def report(store: Store, caller: Caller, job_id: str) -> dict[str, Any]:
    """The owner's report (not DP: it reads the private data). Only the roles that own budgets
    read it; to anyone else it is 403 (the job itself is readable)."""
    with store.sessions() as session:
        row = get_row(session, caller, job_id)
        authorize(caller, Action.SET_BUDGET)
        if row.report is None:
            raise NotFound(
                f"synthetic data job {row.id} has no report yet (status {row.status})",
                code="report_not_ready",
            )
        return dict(row.report)
