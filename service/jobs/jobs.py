"""The jobs use cases a client asks for: creation (plan, budget reservation, idempotency,
limits), reads, and the client's moves (cancel, pause, resume) through
:mod:`service.jobs.lifecycle`. The budget's rules are :mod:`service.budget.budget`'s; the worker
side is
:mod:`service.jobs.job_runs`.

Creation takes a :class:`JobRequest` (domain values; the API builds it from its schema) and
returns the job's row; reads return rows (:class:`service.store.tables.Job`, :class:`JobEvent`,
:class:`Checkpoint`) and :class:`JobLedger`."""

from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from dprc_core.accounting import PrivacyEvent, PrivacyLedger
from dprc_core.accounting.accountant_process import AccountantProcess
from dprc_core.accounting.events import SHARED_SKETCH
from dprc_core.mechanism_names import GAUSSIAN
from dprc_core.noise import NoiseMechanism
from dprc_core.noise.mechanisms import noise_from_dict, noise_from_request
from dprc_core.plan_errors import PlanError
from dprc_core.preference import DEFAULT_BETA
from dprc_core.sharding import SHARDINGS
from dprc_core.training.data import PREFERENCE_FORMAT, DataError, label_names, read_examples
from service.base.clock import now
from service.base.errors import Conflict, InvalidInput, LimitReached, NotFound
from service.base.ids import new_id
from service.base.pagination import cursor_page
from service.base.settings import Settings
from service.budget import budget, planning
from service.budget.job_units import JobUnit, UnitRequest, resolve_unit
from service.data import files
from service.governance import audit
from service.governance.audit import Act
from service.governance.keys import Caller
from service.governance.roles import Action, authorize
from service.jobs import job_runs, lifecycle, model_checks
from service.jobs.job_events import add_event
from service.jobs.lifecycle import Actor
from service.models import fine_tuned_models
from service.models import model_registry as models
from service.store.db import locked_session
from service.store.job_status import ACTIVE, INITIAL, JobStatus
from service.store.store import Store
from service.store.tables import BudgetGroup, Checkpoint, File, IdempotencyKey, JobEvent, Tenant
from service.store.tables import Job as JobRow

log = logging.getLogger("dprc.jobs")

FORMATS_FOR_TASK = {
    "causal_lm": ("text", "chat", "prompt_completion"),
    "classification": ("classification",),
}
DPO = "dpo"
METHODS = ("supervised", DPO)
# the hyperparameters JSON keys of the method (shown as the job's ``method``, not among its
# hyperparameters); a row without them is supervised
METHOD_KEYS = ("method", "beta", "synthetic_records")
# a job that trains a generator of synthetic records (docs/synthetic.md): its text or
# classification lines are rendered as prompt-completion lines by the worker
SYNTHETIC_RECORD_FORMATS = ("text", "classification")


def formats_for(task: str, method: str) -> tuple[str, ...]:
    """The line formats a job of ``method`` trains on a model of ``task``."""
    return (PREFERENCE_FORMAT,) if method == DPO else FORMATS_FOR_TASK[task]


def method_object(row: JobRow) -> dict[str, Any]:
    """OpenAI's ``method`` of the job: ``{type, <type>: {hyperparameters}}``, with β for dpo."""
    hp = public_hyperparameters(row)
    kind = str(row.hyperparameters.get("method") or "supervised")
    if kind == DPO:
        hp["beta"] = row.hyperparameters.get("beta")
    return {"type": kind, kind: {"hyperparameters": hp}}


# -- requests ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hyperparameters:
    """A job's training settings (``auto``: the planner's default)."""

    n_epochs: int | Literal["auto"] = "auto"
    batch_size: int | Literal["auto"] = "auto"
    learning_rate_multiplier: float | Literal["auto"] | None = None
    learning_rate: float | None = None
    max_seq_len: int = 128
    lora: dict[str, Any] | None = None  # r, alpha, target_modules (what the worker gets)
    train_only: list[str] | None = None


@dataclass(frozen=True)
class PrivacySettings:
    """What a job asks of its privacy: the target, the norm method and the noise."""

    target_epsilon: float
    target_delta: float | None = None
    max_grad_norm: float = 1.0
    norm_method: str = "auto"  # a registered norm method (dprc_core.norm_methods)
    k: int | None = None
    sketch: str | None = None  # None: the library's default (job_sketch)
    # the noise mechanism (without σ); or named flat: mechanism with its own fields
    noise: NoiseMechanism | None = None
    mechanism: str | None = None
    nu: float | None = None
    bands: int | None = None
    report_train_loss: bool = True
    unit: UnitRequest = field(default_factory=UnitRequest)  # what ε protects

    def __post_init__(self) -> None:
        if self.noise is None:
            try:
                noise = noise_from_request(self.mechanism or GAUSSIAN, nu=self.nu, bands=self.bands)
            except PlanError as exc:
                raise planning.refusal(exc) from exc
            object.__setattr__(self, "noise", noise)

    @property
    def mechanism_object(self) -> NoiseMechanism:
        """The noise mechanism asked (without σ)."""
        assert self.noise is not None  # set by __post_init__
        return self.noise


@dataclass(frozen=True)
class JobRequest:
    """A job creation request, in domain values (validated for shape by the caller)."""

    model: str
    training_file: str
    privacy: PrivacySettings
    hyperparameters: Hyperparameters = field(default_factory=Hyperparameters)
    checkpoint_every: int | None = None
    seed: int | None = None
    suffix: str | None = None
    metadata: dict[str, str] | None = None
    validation_file: str | None = None
    devices: int = 1  # devices (ranks) a node
    nodes: int = 1  # hosts: nodes × devices ranks, through Ray when > 1
    sharding: str = "none"  # one of SHARDINGS
    method: str = "supervised"  # one of METHODS: dpo trains preference lines
    beta: float | None = None  # dpo's β (None: DEFAULT_BETA)
    # created by a synthetic-data job: a causal LM learns text (or classification) records,
    # rendered as prompt-completion lines (dprc_core.synthetic.records)
    synthetic_records: bool = False


@dataclass(frozen=True)
class Idempotency:
    """An ``Idempotency-Key`` and the fingerprint of the request it was sent with: the same
    key with another fingerprint is refused."""

    key: str
    request_hash: str


# -- the job row's privacy, as a read shows it --------------------------------------------------


def _scale_width(event: Any) -> float | None:
    """The hidden-scale law of a stored planned event (per-example sketches; one stored before
    the law was recorded is on the legacy 0.1 %), else None."""
    if not isinstance(event, dict):
        return None
    return getattr(budget.event_from_dict(event), "scale_width", None)


def privacy_of(row: JobRow) -> dict[str, Any]:
    """The job's ``privacy`` object: what creation stored, with ``epsilon_spent``, the norm
    method under both its names (``norm_method``, and ``method``, its deprecated name, as
    stored), the sketch of a job stored before sketches were offered (shared, migration
    0004), the hidden-scale law of a per-example job stored before it was recorded
    (``accountant.scale_width``: 0.1 %) and ``warnings`` (computed on read: ``delta_large``
    when δ > 1/(10·N), :func:`service.budget.planning.delta_warnings`)."""
    privacy = dict(row.privacy)
    privacy["epsilon_spent"] = row.epsilon_spent
    clipping = privacy["clipping"] = dict(privacy.get("clipping") or {})
    if "method" in clipping:
        clipping.setdefault("norm_method", clipping["method"])
    clipping.setdefault("sketch", SHARED_SKETCH)
    accountant = privacy["accountant"] = dict(privacy.get("accountant") or {})
    accountant.setdefault("sketch", row.accounting_sketch)
    width = _scale_width(privacy.get("event"))
    if width is not None:  # the hidden-scale law it is charged on (before 1 %: 0.1 %)
        accountant.setdefault("scale_width", width)
    unit = str((privacy.get("unit") or {}).get("type", "example"))
    size, delta = privacy.get("dataset_size"), privacy.get("target_delta")
    if "noise" not in privacy and "mechanisms" in privacy and size is not None:
        # what was asked of the noise, and its plan's own fields: from the one stored form
        noise = noise_from_dict(privacy["mechanisms"]["noise"])
        hp = row.hyperparameters
        privacy["noise"] = {
            **noise.request_fields(),
            **noise.plan_fields(int(size), hp["batch_size"], hp["n_epochs"]),
        }
    privacy["warnings"] = (
        planning.delta_warnings(float(delta), int(size), unit)
        if size is not None and delta is not None
        else []
    )
    return privacy


def public_hyperparameters(row: JobRow) -> dict[str, Any]:
    """The job's hyperparameters as the client gave them (the validation file is a field of
    its own: :func:`validation_file`)."""
    hidden = (job_runs.VALIDATION_FILE_KEY, *METHOD_KEYS)
    return {k: v for k, v in row.hyperparameters.items() if k not in hidden}


def validation_file(row: JobRow) -> str | None:
    return job_runs.validation_file_id(row)


def _idempotent(session: Session, caller: Caller, idem: Idempotency) -> JobRow | None:
    row = session.scalar(
        select(IdempotencyKey).where(
            IdempotencyKey.tenant_id == caller.tenant_id, IdempotencyKey.key == idem.key
        )
    )
    if row is None:
        return None
    if row.request_hash != idem.request_hash:
        raise Conflict(
            "this Idempotency-Key was already used with a different request",
            param="Idempotency-Key",
            code="idempotency_key_reused",
        )
    job = session.scalar(select(JobRow).where(JobRow.id == row.job_id))
    assert job is not None
    return job


# -- create -----------------------------------------------------------------------------------


def create_job(
    store: Store, caller: Caller, req: JobRequest, idem: Idempotency | None = None
) -> JobRow:
    """Validate, plan, then — under the tenant's and the file's locks — check the active-job
    limit and the file's budget (the composed ε with this job's planned event) and insert.
    With ``idem``, a repeated request answers the job it created."""
    authorize(caller, Action.CONTROL_JOB)
    if idem is not None:
        with store.sessions() as session:
            existing = _idempotent(session, caller, idem)
            if existing is not None:
                return existing

    # an allow-listed model, or one of the tenant's fine-tuned ones (then its root base)
    model = fine_tuned_models.model_for_job(store, caller, req.model)
    _check_devices(store.settings, req.devices)
    _check_nodes(store.settings, req.nodes)
    _check_sharding(req)
    with store.sessions() as session:
        file = _training_file(session, caller, req.training_file)
        fmt, group_id = file.data_format, file.group_id
        train = _StoredData.of(file)
        unit = resolve_unit(file, req.privacy.unit, store.settings)
        assert group_id is not None
        group = budget.group_of(session, file)
        assert group is not None
        deltas = plan_deltas(session, group)
    _check_method(req, model.name, model.task)
    formats = formats_for(model.task, req.method)
    if req.synthetic_records:
        if model.task != "causal_lm":
            raise InvalidInput(
                f"synthetic records are generated by a causal language model; {model.name!r} "
                f"is a {model.task} model",
                param="fine_tuning.model",
                code="model_not_generative",
            )
        formats = (*SYNTHETIC_RECORD_FORMATS, "chat")
    if fmt not in formats:
        what = (
            "method dpo trains preference lines"
            if req.method == DPO
            else f"model {model.name!r} ({model.task}) needs lines of format "
            + " or ".join(formats)
            + (" (preference lines train with method dpo)" if fmt == PREFERENCE_FORMAT else "")
        )
        raise InvalidInput(
            f"{what}; file {req.training_file} is {fmt}",
            param="training_file",
            code="invalid_file",
        )
    if req.validation_file is not None:
        valid = _check_validation_file(store, caller, req, formats)
        if model.task == "classification":
            _check_validation_labels(train, valid)
    process = planning.accountant_process(store.settings)
    plan = planning.make_plan(
        plan_request(req), unit.n, store.settings.default_k, **deltas, process=process
    )
    hp = req.hyperparameters
    model_checks.check_model_settings(
        models.ensure_local(model), model.task, hp.max_seq_len, hp.lora, hp.train_only
    )
    privacy_event = plan.event()  # built before the locks (ν-DP-FTRL's needs its sensitivity)
    # The budget's composition (seconds of accountant work on a long history) runs outside
    # the locks on a snapshot of the file's events; under the locks the snapshot is checked
    # and, if another job changed the file meanwhile, composed again outside them (then, on
    # the last attempt, under them: always the composed ε of the file's current events).
    # Creates on one file take turns in this process (a lock per file, not the database's):
    # each composes once, on a snapshot no one here changes meanwhile; the database's write
    # lock is held only to check the snapshot and insert. Other processes (API replicas) are
    # caught by the snapshot check.
    pr = req.privacy
    mechanisms = plan.mechanisms(
        pr.max_grad_norm,
        req.hyperparameters.max_seq_len,
        planning.job_sketch(pr.norm_method, pr.mechanism_object, pr.sketch),
        secure=store.settings.secure_rng,
    )
    new = _NewJob(req, plan, privacy_event, idem, mechanisms, unit)
    # Before the file's turn: this job's leaf of the file's history (tens of milliseconds for
    # randomized clipping's hidden scale) is built and cached here, in the leaf lane (one at a
    # time in this process), while other creates calibrate or hold their file's turn; in the
    # turn, its snapshot composes the blocks around it (those the jobs committed meanwhile
    # changed too: composing them here would mostly be wasted).
    with _LEAF_LANE:
        _budget_leaf(store, group_id, privacy_event, process)
    with _group_turn(group_id):
        known = _budget_snapshot(store, group_id, privacy_event, process)
        deadline = time.monotonic() + OPTIMISTIC_SECONDS
        while True:
            last = time.monotonic() > deadline  # then composed under the locks, whatever it costs
            done, stale = _create_locked(store, caller, new, known, last, process)
            if done is not None:
                return done
            known = stale


@dataclass(frozen=True)
class _NewJob:
    """A job being created: its request, its plan and the plan's privacy event."""

    req: JobRequest
    plan: planning.JobPlan
    privacy_event: PrivacyEvent
    idem: Idempotency | None
    mechanisms: dict[str, Any]  # the engine's clipping and noise objects, serialized
    unit: JobUnit  # what ε protects, and its N


def _check_devices(settings: Settings, devices: int) -> None:
    """A job no worker can ever fit is refused now, not left queued for ever."""
    largest = settings.max_job_devices or settings.worker_devices
    if devices > largest:
        raise InvalidInput(
            f"devices={devices}: the largest worker of this service has {largest} device(s) "
            "(DPRC_MAX_JOB_DEVICES / DPRC_WORKER_DEVICES)",
            param="devices",
            code="devices_unavailable",
        )


def _check_nodes(settings: Settings, nodes: int) -> None:
    """A job on more hosts than the deployment may launch is refused now."""
    if nodes > settings.max_job_nodes:
        how = (
            "jobs run on one host (DPRC_LAUNCHER=local)"
            if settings.launcher != "ray"
            else f"a job may span {settings.max_job_nodes} (DPRC_MAX_JOB_NODES)"
        )
        raise InvalidInput(
            f"nodes={nodes}: this service launches jobs on at most {settings.max_job_nodes} "
            f"host(s): {how}",
            param="nodes",
            code="nodes_unavailable",
        )


def _check_sharding(req: JobRequest) -> None:
    """``sharding: fsdp`` shards the model over the job's ranks: it needs two of them at least
    (whether the noise mechanism allows sharding is the plan's rule, refused by the planner).
    The privacy plan does not depend on the sharding."""
    if req.sharding not in SHARDINGS:
        raise InvalidInput(
            f"sharding={req.sharding!r}: one of {', '.join(SHARDINGS)}",
            param="sharding",
            code="invalid_value",
        )
    if req.sharding != "fsdp":
        return
    if req.devices * req.nodes < 2:
        raise InvalidInput(
            f"sharding=fsdp shards the model over the job's devices: it needs nodes × devices "
            f">= 2, the job has devices={req.devices} (on one device, leave sharding at none)",
            param="sharding",
            code="sharding_needs_devices",
        )


def _check_method(req: JobRequest, model_name: str, task: str) -> None:
    """``method: dpo`` optimises a causal LM's answers: a classification model is refused."""
    if req.method not in METHODS:
        raise InvalidInput(
            f"method.type={req.method!r}: one of {', '.join(METHODS)}",
            param="method.type",
            code="invalid_value",
        )
    if req.method == DPO and task != "causal_lm":
        raise InvalidInput(
            f"method dpo trains a causal language model's answers; model {model_name!r} is a "
            f"{task} model",
            param="method.type",
            code="method_unsupported",
        )


# Leaves are built one at a time in a process, as calibrations are (service/budget/planning.py):
# a burst's leaves built all at once share the interpreter and the cores with one another and
# cost more CPU each; one at a time, the accountant's work of a create runs in at most three
# threads at once (its calibration lane, the leaf lane, a file's turn). Measured in
# docs/benchmarks/budget.md ("The leaf lane").
_LEAF_LANE = threading.Lock()
_TURNS: dict[str, threading.Lock] = {}
_TURNS_GUARD = threading.Lock()


@contextmanager
def _group_turn(group_id: str) -> Iterator[None]:
    with _TURNS_GUARD:
        turn = _TURNS.setdefault(group_id, threading.Lock())
    with turn:
        yield


# How long a create keeps composing outside the locks while other creates change its group
# (each retry means another job was committed: progress); after that it composes under them.
OPTIMISTIC_SECONDS = 120.0


def _group_events(store: Store, group_id: str) -> tuple[budget.GroupEvents, float, float] | None:
    """A budgeted group's events, its δ and its ε budget, read under no lock (None: no
    budget)."""
    with store.sessions() as session:
        group = session.scalar(select(BudgetGroup).where(BudgetGroup.id == group_id))
        assert group is not None
        if group.epsilon_budget is None or group.delta is None:
            return None
        return budget.group_events(session, group), group.delta, group.epsilon_budget


def _budget_leaf(
    store: Store,
    group_id: str,
    privacy_event: PrivacyEvent,
    process: AccountantProcess | None,
) -> None:
    """``privacy_event``'s leaf of the group's history, built (in the accountant ``process``
    when there is one) and cached under no lock."""
    read = _group_events(store, group_id)
    if read is not None:
        budget.build_leaf(read[0], read[1], privacy_event, process)


def _budget_snapshot(
    store: Store, group_id: str, privacy_event: PrivacyEvent, process: AccountantProcess | None
) -> budget.Snapshot:
    """The group's events and their totals with ``privacy_event``, composed under no lock (a
    new tail's leaves built in the accountant ``process`` first, when there is one)."""
    read = _group_events(store, group_id)
    if read is None:
        return None
    events, delta, epsilon_budget = read
    return budget.snapshot(events, delta, privacy_event, epsilon_budget, process)


def _create_locked(
    store: Store,
    caller: Caller,
    new: _NewJob,
    known: budget.Snapshot,
    last: bool,
    process: AccountantProcess | None,
) -> tuple[JobRow | None, budget.Snapshot]:
    """One locked attempt: (the job, None), or (None, a fresh snapshot) when the file's
    events changed since ``known`` and this is not the ``last`` attempt (``process``: the
    accountant process the snapshot may use)."""
    with locked_session(store.sessions) as session:
        # lock order: tenant row, then the budget group's row, then the audit head (FOR UPDATE
        # on PostgreSQL; BEGIN IMMEDIATE on SQLite holds the write lock for the whole
        # transaction)
        session.get(Tenant, caller.tenant_id, with_for_update=True)
        if new.idem is not None:
            existing = _idempotent(session, caller, new.idem)
            if existing is not None:
                return existing, None
        file = _training_file(session, caller, new.req.training_file)
        assert file.group_id is not None
        group = budget.lock_group(session, file.group_id)
        _check_active_jobs(session, caller, store.settings.max_active_jobs_per_tenant)
        stale = None if last else budget.changed_events(session, group, known)
        if stale is None:
            return _reserve_and_insert(session, caller, group, new, known, not last), None
        delta, epsilon_budget = group.delta, budget.budget_of(group)
        assert delta is not None
        session.rollback()  # leave the locks; compose again outside them
    # under no lock
    return None, budget.snapshot(stale, delta, new.privacy_event, epsilon_budget, process)


def _reserve_and_insert(
    session: Session,
    caller: Caller,
    group: BudgetGroup,
    new: _NewJob,
    known: budget.Snapshot,
    checked: bool,
) -> JobRow:
    """Under the locks: reserve the job's planned event on the group (or refuse it) and insert
    it with its Idempotency-Key and its audit entry, in one commit; ``checked``: the group's
    events were read under these locks and are ``known``'s."""
    plan = new.plan
    if group.epsilon_budget is not None and group.delta is not None:
        if plan.target_delta > group.delta:  # the budget's δ was lowered since the plan
            session.rollback()
            raise InvalidInput(
                f"the delta of the data set's budget changed to {group.delta:g} while this job "
                f"was planned at delta={plan.target_delta:g}: send the request again",
                param="privacy.target_delta",
                code="invalid_delta",
            )
    budget.reserve(
        session, group, new.privacy_event, known, plan.planned_epsilon, plan.target_delta, checked
    )
    row = _insert_job(session, caller, new.req, plan, new.mechanisms, new.unit)
    if new.idem is not None:
        session.add(
            IdempotencyKey(
                tenant_id=caller.tenant_id,
                key=new.idem.key,
                request_hash=new.idem.request_hash,
                job_id=row.id,
                created_at=now(),
            )
        )
    audit.record(
        session,
        caller,
        Act.JOB_CREATE,
        row.id,
        {
            "training_file": row.training_file_id,
            "budget_group": group.id,
            "planned_epsilon": plan.planned_epsilon,
            "target_delta": plan.target_delta,
        },
    )
    session.commit()
    return row


def _training_file(session: Session, caller: Caller, file_id: str) -> File:
    """The caller's (not deleted) fine-tune data set that a job may train on; else 404 or
    400."""
    file = session.scalar(
        select(File).where(
            File.id == file_id, File.tenant_id == caller.tenant_id, File.deleted.is_(False)
        )
    )
    if file is None:
        raise NotFound(
            f"no such file: {file_id[:64]!r}", param="training_file", code="file_not_found"
        )
    if file.approval == files.PENDING:
        raise files.pending_approval(file, "training_file")
    if file.purpose != "fine-tune" or file.n_examples is None or file.group_id is None:
        raise InvalidInput(
            f"file {file.id} is not a fine-tune data set",
            param="training_file",
            code="invalid_file",
        )
    if file.unbudgeted:
        raise InvalidInput(
            f"file {file.id} was uploaded as unbudgeted validation-only data: no job may "
            "train on it (upload it with a budget to train on it)",
            param="training_file",
            code="invalid_file",
        )
    return file


@dataclass(frozen=True)
class _StoredData:
    """Where a data set's lines are and how to read them (copied out of its row)."""

    id: str
    path: str
    bytes: int
    user_field: str | None

    @classmethod
    def of(cls, file: File) -> _StoredData:
        return cls(file.id, file.storage_path, int(file.bytes), file.user_field)


# The largest data set whose labels job creation reads (both files, once each: the labels of
# a file are cached by path, size and modification time); above it the worker still refuses
# a validation label the training file lacks (invalid_validation_file, when the job runs).
LABEL_CHECK_MAX_BYTES = 32 * 1024 * 1024


@functools.lru_cache(maxsize=64)
def _labels_cached(path: str, user_field: str | None, _size: int, _mtime_ns: int) -> frozenset:
    with open(path, "rb") as f:  # a binary file iterates lines at b"\n", as the worker reads
        return frozenset(
            str(ex.label)
            for ex in read_examples(f, "classification", user_field)
            if ex.label is not None
        )


def file_labels(file: File) -> frozenset[str] | None:
    """The distinct labels of a classification data set (None: too large to read here)."""
    return _labels(_StoredData.of(file))


def _labels(data: _StoredData) -> frozenset[str] | None:
    """The distinct labels of a classification data set as the worker compares them
    (:func:`dprc_core.training.data.label_names`: ``1`` and ``"1"`` are one class); None when
    it is too large to read here or cannot be read (the worker then checks)."""
    if data.bytes > LABEL_CHECK_MAX_BYTES:
        return None
    try:
        stat = os.stat(data.path)
        return _labels_cached(data.path, data.user_field, stat.st_size, stat.st_mtime_ns)
    except (OSError, DataError):
        return None


def _check_validation_labels(train: _StoredData, valid: _StoredData) -> None:
    """400 ``invalid_validation_file`` naming a label of the classification validation file
    that the training file lacks: the worker's classifier has the training file's classes
    only, so the job would fail when it first scores the validation file."""
    classes, wanted = _labels(train), _labels(valid)
    if classes is None or wanted is None:
        return
    missing = label_names(list(wanted - classes))
    if not missing:
        return
    known = label_names(list(classes))
    shown = ", ".join(repr(c) for c in known[:20]) + (", ..." if len(known) > 20 else "")
    raise InvalidInput(
        f"validation file {valid.id} has the label {missing[0]!r}"
        + (f" (and {len(missing) - 1} more labels)" if len(missing) > 1 else "")
        + f", which training file {train.id} does not have: the model learns the training "
        f"file's classes only ({shown})",
        param="validation_file",
        code="invalid_validation_file",
    )


def _check_validation_file(
    store: Store, caller: Caller, req: JobRequest, formats: tuple[str, ...]
) -> _StoredData:
    """The validation file: the caller's fine-tune data set (else 404), of a format the model's
    task reads, not the training file (its loss would be a non-private statistic of the training
    data) and without a privacy budget (valid_loss is not a DP release of it); where its lines
    are."""
    assert req.validation_file is not None
    param = "validation_file"
    with store.sessions() as session:
        file = session.scalar(
            select(File).where(
                File.id == req.validation_file,
                File.tenant_id == caller.tenant_id,
                File.deleted.is_(False),
            )
        )
        if file is None:
            raise NotFound(
                f"no such file: {req.validation_file[:64]!r}", param=param, code="file_not_found"
            )
        if file.approval == files.PENDING:
            raise files.pending_approval(file, param)
        if file.purpose != "fine-tune" or file.n_examples is None:
            raise InvalidInput(
                f"file {file.id} is not a fine-tune data set", param=param, code="invalid_file"
            )
        if file.id == req.training_file:
            raise InvalidInput(
                "the validation file is the training file: its valid_loss would be a "
                "statistic of the training data that differential privacy does not cover",
                param=param,
                code="invalid_file",
            )
        if file.data_format not in formats:
            raise InvalidInput(
                f"file {file.id} is {file.data_format}; the model needs {' or '.join(formats)}",
                param=param,
                code="invalid_file",
            )
        group = budget.group_of(session, file)
        if group is not None and group.epsilon_budget is not None:
            raise InvalidInput(
                f"file {file.id} has a privacy budget: valid_loss on it is not a "
                "differentially private release, so it cannot be a validation file",
                param=param,
                code="invalid_file",
            )
        return _StoredData.of(file)


def _check_active_jobs(session: Session, caller: Caller, limit: int) -> None:
    active = (
        session.scalar(
            select(func.count())
            .select_from(JobRow)
            .where(JobRow.tenant_id == caller.tenant_id, JobRow.status.in_(ACTIVE))
        )
        or 0
    )
    if active >= limit:
        raise LimitReached(
            f"too many active fine-tuning jobs ({active}, limit {limit}); "
            "wait for one to end or cancel one",
            code="too_many_active_jobs",
        )


def plan_deltas(session: Session, group: BudgetGroup) -> dict[str, float | None]:
    """The δ's :func:`service.budget.planning.make_plan` takes from the training file's budget
    group:
    the default (the δ the group states ε's at) and the largest a job may name (its budget's
    δ; None without a budget)."""
    return {
        "group_delta": budget.group_delta(session, group),
        "budget_delta": group.delta if group.epsilon_budget is not None else None,
    }


def plan_request(req: JobRequest) -> planning.PlanRequest:
    hp, pr = req.hyperparameters, req.privacy
    return planning.PlanRequest(
        target_epsilon=pr.target_epsilon,
        target_delta=pr.target_delta,
        n_epochs=hp.n_epochs,
        batch_size=hp.batch_size,
        method=pr.norm_method,
        k=pr.k,
        noise=pr.mechanism_object,
        sketch=planning.job_sketch(pr.norm_method, pr.mechanism_object, pr.sketch),
        unit=pr.unit.type,
        sharding=req.sharding,
    )


def _stored_hyperparameters(req: JobRequest, plan: planning.JobPlan) -> dict[str, Any]:
    """The job row's ``hyperparameters``: the plan's epochs and batch, the learning rate the
    worker uses, and the validation file when there is one."""
    hp = req.hyperparameters
    lrm = hp.learning_rate_multiplier
    hyper: dict[str, Any] = {
        "n_epochs": plan.n_epochs,
        "batch_size": plan.batch_size,
        "learning_rate_multiplier": None
        if hp.learning_rate is not None
        else (1.0 if lrm in (None, "auto") else lrm),
        "learning_rate": hp.learning_rate,
        "max_seq_len": hp.max_seq_len,
        "lora": hp.lora,
        "train_only": hp.train_only,
    }
    if req.validation_file is not None:
        hyper[job_runs.VALIDATION_FILE_KEY] = req.validation_file
    if req.method == DPO:
        hyper["method"] = DPO
        hyper["beta"] = req.beta if req.beta is not None else DEFAULT_BETA
    if req.synthetic_records:
        hyper["synthetic_records"] = True
    return hyper


def _stored_privacy(
    req: JobRequest, plan: planning.JobPlan, mechanisms: dict[str, Any], unit: JobUnit
) -> dict[str, Any]:
    """The job row's ``privacy``: what was asked, what was planned and how it is accounted
    (read back by budgets and :func:`privacy_of`), and ``mechanisms``, the engine's clipping
    and noise objects serialized (``Clipping.to_dict``, ``Gaussian | NuDPFTRL.to_dict``),
    which the worker builds its engine from."""
    pr = req.privacy
    return {
        "target_epsilon": pr.target_epsilon,
        "target_delta": plan.target_delta,
        "max_grad_norm": pr.max_grad_norm,
        "clipping": {
            "method": plan.method,
            "k": plan.k,
            "sketch": planning.job_sketch(pr.norm_method, pr.mechanism_object, pr.sketch),
        },
        "report_train_loss": pr.report_train_loss,
        "unit": unit.stored(),
        "dataset_size": plan.n_examples,
        "sample_rate": plan.sample_rate,
        "steps": plan.steps,
        "noise_multiplier": plan.noise_multiplier,
        "planned_epsilon": plan.planned_epsilon,
        "accountant": plan.accountant(),
        "mechanisms": mechanisms,
        # the planned privacy event, the one form the budget, the ledgers and the consistency
        # check read (re-accounted in place when an auto job resolves to exact norms)
        "event": plan.event().to_dict(),
    }


def _insert_job(
    session: Session,
    caller: Caller,
    req: JobRequest,
    plan: planning.JobPlan,
    mechanisms: dict[str, Any],
    unit: JobUnit,
) -> JobRow:
    row = JobRow(
        id=new_id("ftjob"),
        tenant_id=caller.tenant_id,
        model=req.model,
        training_file_id=req.training_file,
        status=INITIAL.value,
        created_at=now(),
        hyperparameters=_stored_hyperparameters(req, plan),
        privacy=_stored_privacy(req, plan, mechanisms, unit),
        seed=req.seed if req.seed is not None else secrets.randbits(63),  # secret: 63 bits
        suffix=req.suffix,
        job_metadata=req.metadata,
        checkpoint_every=req.checkpoint_every,
        noise_multiplier=plan.noise_multiplier,
        sample_rate=plan.sample_rate,
        steps_total=plan.steps,
        accounting_envelope=plan.accounting_envelope,
        accounting_k=plan.accounting_k,
        accounting_sketch=plan.sketch,
        steps_done=0,
        epsilon_spent=0.0,
        result_files=[],
        cancel_requested=False,
        attempts=0,
        devices=req.devices,
        nodes=req.nodes,
        sharding=req.sharding,
        created_by=caller.key_id,
    )
    session.add(row)
    session.flush()
    _log_creation(session, row.id, plan)
    return row


def _log_creation(session: Session, job_id: str, plan: planning.JobPlan) -> None:
    """The job events of a new job: created, its privacy plan, queued."""
    add_event(session, job_id, f"Created fine-tuning job: {job_id}")
    add_event(
        session,
        job_id,
        f"Privacy plan: noise multiplier {plan.noise_multiplier:.4g}, sample rate "
        f"{plan.sample_rate:.4g}, {plan.steps} steps, planned epsilon "
        f"{plan.planned_epsilon:.4g} at delta {plan.target_delta:g}"
        + (
            " per user (users sampled, each user's lines clipped together)"
            if plan.unit == "user"
            else ""
        )
        + (", per-example sketches" if plan.sketch != SHARED_SKETCH else ""),
        data={
            "noise_multiplier": plan.noise_multiplier,
            "sample_rate": plan.sample_rate,
            "steps": plan.steps,
            "planned_epsilon": plan.planned_epsilon,
            "target_delta": plan.target_delta,
            "sketch": plan.sketch,
            "unit": plan.unit,
        },
    )
    add_event(session, job_id, "Job queued")


# -- reads ------------------------------------------------------------------------------------


def get_row(session: Session, caller: Caller, job_id: str) -> JobRow:
    row = session.scalar(
        select(JobRow).where(JobRow.id == job_id, JobRow.tenant_id == caller.tenant_id)
    )
    if row is None:
        raise NotFound(
            f"no such fine-tuning job: {job_id[:64]!r}",
            param="fine_tuning_job_id",
            code="job_not_found",
        )
    return row


def retrieve(store: Store, caller: Caller, job_id: str) -> JobRow:
    authorize(caller, Action.READ)
    with store.sessions() as session:
        return get_row(session, caller, job_id)


def list_jobs(
    store: Store, caller: Caller, after: str | None, limit: int
) -> tuple[list[JobRow], bool]:
    authorize(caller, Action.READ)
    with store.sessions() as session:
        q = select(JobRow).where(JobRow.tenant_id == caller.tenant_id)
        return cursor_page(session, q, JobRow, after, limit, "job")


def list_events(
    store: Store, caller: Caller, job_id: str, after: str | None, limit: int
) -> tuple[list[JobEvent], bool]:
    authorize(caller, Action.READ)
    with store.sessions() as session:
        job = get_row(session, caller, job_id)
        q = select(JobEvent).where(JobEvent.job_id == job.id)
        return cursor_page(session, q, JobEvent, after, limit, "event")


def list_checkpoints(
    store: Store, caller: Caller, job_id: str, after: str | None, limit: int
) -> tuple[JobRow, list[Checkpoint], bool]:
    """The job and a page of its checkpoints whose archive is still there (retention or a
    deletion removes it: :mod:`service.jobs.retention`)."""
    authorize(caller, Action.READ)
    with store.sessions() as session:
        job = get_row(session, caller, job_id)
        kept = select(File.id).where(File.id == Checkpoint.file_id, File.deleted.is_(False))
        q = select(Checkpoint).where(Checkpoint.job_id == job.id, kept.exists())
        rows, more = cursor_page(session, q, Checkpoint, after, limit, "checkpoint")
        return job, rows, more


@dataclass(frozen=True)
class JobLedger:
    """The privacy ledger of the steps a job ran and its planned event, at the job's δ."""

    job_id: str
    delta: float
    epsilon_spent: float
    ledger: dict[str, Any]  # dprc-privacy-ledger JSON
    planned: dict[str, Any]  # the planned event (the reservation)
    unit: str = "example"  # what each ε protects: one example, or one user (all their lines)


def ledger(store: Store, caller: Caller, job_id: str) -> JobLedger:
    """The job's privacy ledger (its ε, not its data: every role may read it); audited."""
    authorize(caller, Action.READ)
    with locked_session(store.sessions) as session:
        job = get_row(session, caller, job_id)
        audit.record(session, caller, Act.LEDGER_DOWNLOAD, job.id)
        session.commit()
        spent = budget.spent_event(job)
        led = PrivacyLedger([spent] if spent is not None else [])
        delta = float(job.privacy["target_delta"])
        return JobLedger(
            job_id=job.id,
            delta=delta,
            epsilon_spent=led.epsilon(delta),
            ledger=json.loads(led.to_json()),
            planned=budget.planned_event(job).to_dict(),
            unit=str((job.privacy.get("unit") or {}).get("type", "example")),
        )


# -- the client's moves -----------------------------------------------------------------------


def _client_move(
    store: Store,
    caller: Caller,
    job_id: str,
    target: JobStatus,
    act: str,
    message: str,
    **changes: Any,
) -> JobRow:
    """A move the client asks for (:func:`service.jobs.lifecycle.move`), audited in its
    transaction."""
    authorize(caller, Action.CONTROL_JOB)

    def recorded(session: Session, job: JobRow) -> None:
        audit.record(session, caller, act, job.id, {"status": job.status})

    row = lifecycle.move(
        store,
        job_id,
        target,
        by=Actor.CLIENT,
        tenant_id=caller.tenant_id,
        message=message,
        on_change=recorded,
        **changes,
    )
    assert row is not None
    return row


def cancel(store: Store, caller: Caller, job_id: str) -> JobRow:
    """Queued and paused jobs end now (their reservation is released); a running job is asked
    to stop and its worker ends it, settling to the steps that ran."""
    return _client_move(
        store,
        caller,
        job_id,
        JobStatus.CANCELLED,
        Act.JOB_CANCEL,
        "Job cancelled",
        finished_at=now(),
    )


def pause(store: Store, caller: Caller, job_id: str) -> JobRow:
    """A queued job is paused at once; a running one is asked to stop after the current step
    with a checkpoint (its worker marks it ``paused``). The reservation stays."""
    return _client_move(store, caller, job_id, JobStatus.PAUSED, Act.JOB_PAUSE, "Job paused")


def resume(store: Store, caller: Caller, job_id: str) -> JobRow:
    """A paused job goes back to the queue; its worker resumes from the last checkpoint."""
    return _client_move(
        store,
        caller,
        job_id,
        JobStatus.QUEUED,
        Act.JOB_RESUME,
        "Job resumed; queued",
        pause_requested=False,
    )
