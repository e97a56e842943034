"""Fine-tuned models, as in OpenAI's API: a succeeded job names its model
``ft:<base>:<tenant>:<suffix>:<job id>`` (``fine_tuned_model``), ``GET /v1/models`` lists it for
its tenant only, and a later job of that tenant may start from it.

Its weights are the model folder of the job's last checkpoint archive (a file of the tenant,
released under the job's differential-privacy guarantee: training on from it is
post-processing of that release, and the new job's ε covers the new training file). A worker
unpacks them once into ``DATA_DIR/models/fine-tuned/<job id>`` (a LoRA job's adapter merged
into its base), safetensors only. Another tenant's name, an unknown one and one whose archive
was deleted are all 404 ``model_not_found``."""

from __future__ import annotations

import re
import shutil
import tarfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.base.errors import InvalidInput, NotFound
from service.base.settings import Settings, Task
from service.governance.keys import Caller
from service.governance.roles import Action, authorize
from service.models import model_registry
from service.models.model_registry import Model
from service.store.job_status import JobStatus
from service.store.store import Store
from service.store.tables import Checkpoint, File, Tenant
from service.store.tables import Job as JobRow

PREFIX = "ft:"
NAME_LENGTH = 255  # jobs.fine_tuned_model
FINE_TUNED_NAME = re.compile(r"^ft:[A-Za-z0-9._:-]{1,252}$")
MAX_DEPTH = 32  # a fine-tune of a fine-tune of …: how far a name is followed to its base


def is_fine_tuned(name: str) -> bool:
    return name.startswith(PREFIX)


def _slug(text: str, limit: int) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return (slug or "tenant")[:limit].strip("-") or "tenant"


def fine_tuned_name(base: str, tenant_name: str, suffix: str | None, job_id: str) -> str:
    """``ft:<base>:<tenant>:<suffix>:<job id>`` (the tenant's name as a slug of at most 40
    characters; an empty suffix when none was given). The job id makes it unique; a base name
    too long for the column is shortened (the name is an identifier, looked up whole)."""
    tail = f":{_slug(tenant_name, 40)}:{suffix or ''}:{job_id}"
    room = NAME_LENGTH - len(PREFIX) - len(tail)
    return f"{PREFIX}{base[:room]}{tail}"


def root_base_name(session: Session, tenant_id: int, name: str) -> str:
    """The allow-listed model at the root of a chain of the tenant's fine-tunes (``name``
    itself when it is not a fine-tuned name; the last name found when the chain breaks)."""
    current = name
    for _ in range(MAX_DEPTH):
        if not is_fine_tuned(current):
            return current
        parent = session.scalar(
            select(JobRow.model).where(
                JobRow.tenant_id == tenant_id, JobRow.fine_tuned_model == current
            )
        )
        if parent is None:
            return current
        current = parent
    return current


@dataclass(frozen=True)
class FineTuned:
    """A tenant's fine-tuned model: its name, the job that made it, the allow-listed model at
    the root of its chain (task, tokenizer, positions) and its weights' archive."""

    name: str
    job_id: str
    created_at: int
    base: Model
    archive: Path
    lora: bool  # its job trained LoRA adapters: its checkpoint holds the adapter only
    start_model: str = ""  # the model its job started from (allow-listed, or a full ft: one)


@dataclass(frozen=True)
class ModelInfo:
    """A model as ``GET /v1/models`` shows it."""

    id: str
    created: int
    task: Task
    ready: bool
    owned_by: str


ALLOW_LIST_CREATED = 1735689600  # 2025-01-01: the allow-list has no creation time of its own


def _lookup(session: Session, settings: Settings, tenant_id: int, name: str) -> FineTuned:
    """The tenant's succeeded job named ``name``, its root base and its last archive."""
    missing = NotFound(
        f"the model {name[:300]!r} does not exist (see GET /v1/models)",
        param="model",
        code="model_not_found",
    )
    if not FINE_TUNED_NAME.match(name):
        raise missing
    current, job, chain = name, None, []
    for _ in range(MAX_DEPTH):
        row = session.scalar(
            select(JobRow).where(
                JobRow.tenant_id == tenant_id,
                JobRow.fine_tuned_model == current,
                JobRow.status == JobStatus.SUCCEEDED.value,
            )
        )
        if row is None:
            raise missing
        job = job or row
        chain.append(row)
        if not is_fine_tuned(row.model):
            base = model_registry.registry(settings).get(row.model)
            if base is None:
                raise missing  # its base left the allow-list
            break
        current = row.model
    else:
        raise missing
    assert job is not None
    last = session.scalar(
        select(Checkpoint).where(Checkpoint.job_id == job.id).order_by(Checkpoint.step.desc())
    )
    archive = (
        session.scalar(select(File).where(File.id == last.file_id)) if last is not None else None
    )
    # the final checkpoint's archive deleted: its weights are gone
    if archive is None or archive.deleted or not Path(archive.storage_path).is_file():
        raise missing
    lora = bool((job.hyperparameters or {}).get("lora"))  # the start's are merged
    return FineTuned(
        name,
        job.id,
        job.finished_at or job.created_at,
        base,
        Path(archive.storage_path),
        lora,
        job.model,
    )


def lookup(store: Store, tenant_id: int, name: str) -> FineTuned:
    with store.sessions() as session:
        return _lookup(session, store.settings, tenant_id, name)


def model_for_job(store: Store, caller: Caller, name: str) -> Model:
    """The model a new job of ``caller`` names: an allow-listed one, or one of the tenant's
    fine-tuned models — then its root base (task, tokenizer, positions: what create checks)."""
    if not is_fine_tuned(name):
        return model_registry.get_model(store.settings, name)
    ft = lookup(store, caller.tenant_id, name)
    if ft.lora and ft.base.task != "causal_lm":
        raise InvalidInput(
            f"the model {name!r} is a classification model trained with LoRA: its adapter "
            "(with the head it saved) is not merged into a model to train on; start from "
            f"{ft.base.name!r}",
            param="model",
            code="model_unavailable",
        )
    return ft.base  # a LoRA fine-tune starts a job merged (service/models/model_folders.py)


def list_models(store: Store, caller: Caller) -> list[ModelInfo]:
    """The allow-list, then the tenant's fine-tuned models (oldest first) whose weights are
    still there."""
    authorize(caller, Action.READ)
    out = [
        ModelInfo(m.name, ALLOW_LIST_CREATED, m.task, m.ready, "dprc")
        for m in model_registry.registry(store.settings).values()
    ]
    with store.sessions() as session:
        tenant = session.get(Tenant, caller.tenant_id)
        assert tenant is not None
        names = session.scalars(
            select(JobRow.fine_tuned_model)
            .where(
                JobRow.tenant_id == caller.tenant_id,
                JobRow.status == JobStatus.SUCCEEDED.value,
                JobRow.fine_tuned_model.is_not(None),
            )
            .order_by(JobRow.finished_at, JobRow.id)
        ).all()
        for name in names:
            assert name is not None
            try:
                ft = _lookup(session, store.settings, caller.tenant_id, name)
            except NotFound:
                continue  # its weights were deleted, or its base left the allow-list
            out.append(ModelInfo(name, ft.created_at, ft.base.task, True, tenant.name))
    return out


def get_model_info(store: Store, caller: Caller, name: str) -> ModelInfo:
    authorize(caller, Action.READ)
    if not is_fine_tuned(name):
        m = model_registry.get_model(store.settings, name)
        return ModelInfo(m.name, ALLOW_LIST_CREATED, m.task, m.ready, "dprc")
    with store.sessions() as session:
        ft = _lookup(session, store.settings, caller.tenant_id, name)
        tenant = session.get(Tenant, caller.tenant_id)
        assert tenant is not None
        return ModelInfo(name, ft.created_at, ft.base.task, True, tenant.name)


def weights_dir(settings: Settings, job_id: str) -> Path:
    return settings.models_dir / "fine-tuned" / job_id


def unpack(ft: FineTuned, target: Path) -> Path:
    """The archive's ``model/`` folder unpacked into ``target`` once (into a folder of its
    own, then renamed: concurrent workers never see half a model); only regular files under
    ``model/`` are taken (no links, no paths that climb out). A LoRA job's folder holds its
    adapter (``adapter_config.json``), a full fine-tune's a model (``config.json``)."""
    if _unpacked(target):
        return target
    tmp = target.with_name(f"{target.name}.{uuid.uuid4().hex}.tmp")
    tmp.mkdir(parents=True)
    try:
        with tarfile.open(ft.archive) as tar:
            for member in tar.getmembers():
                parts = Path(member.name).parts
                if not member.isfile() or len(parts) < 2 or parts[0] != "model" or ".." in parts:
                    continue
                dest = tmp.joinpath(*parts[1:])
                dest.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None
                with source, dest.open("wb") as out:
                    shutil.copyfileobj(source, out)
        if not _unpacked(tmp):
            raise RuntimeError(
                f"the archive of {ft.name} holds no model/config.json (nor an adapter's)"
            )
        if target.exists() and not _unpacked(target):
            shutil.rmtree(target)  # a folder left half-made by an older writer
        try:
            tmp.rename(target)
        except OSError:  # another worker renamed its copy first
            if not _unpacked(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _unpacked(folder: Path) -> bool:
    return (folder / "config.json").is_file() or (folder / "adapter_config.json").is_file()
