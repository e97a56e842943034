"""The domain in-process: a fresh store on a temporary SQLite file (migrations applied), a tenant
with a key of each role (made as ``dprc keys create`` makes them, authenticated as a request's
key is), another tenant, and helpers that upload small JSONL data sets and create jobs through
the same ``service`` functions the API's routers call. No server, no PostgreSQL, no Redis, no
Celery: these tests run in ``make check``."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from service.base.settings import Settings
from service.data import files
from service.data.budget_groups import BudgetWish
from service.governance import keys
from service.governance.caller import Caller
from service.governance.roles import Role
from service.jobs import jobs
from service.store.store import Store, open_store
from service.store.tables import AuditEntry, Job

SQLITE_NAME = "dprc.sqlite3"
MODEL = "minilm-l6-v2"  # the built-in classifier: a job's settings are checked on its config


def settings_for(data_dir: Path, **overrides: Any) -> Settings:
    """The service's settings for a test's store: SQLite under ``data_dir``, no worker."""
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "database_url": None,
        "broker_url": None,
        "embedded_worker": False,
        "builtin_models": True,
        "models": {},
        "require_budget": True,
        "default_epsilon_budget": None,
        "keep_checkpoints": None,
        "max_active_jobs_per_tenant": 16,
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory) -> Path:
    """A SQLite file at the migrations' head, made once and copied for each store."""
    folder = tmp_path_factory.mktemp("dprc-template")
    store = open_store(settings_for(folder))
    store.engine.dispose()  # the last connection checkpoints the write-ahead log
    return folder / SQLITE_NAME


@dataclass
class Tenant:
    """A tenant's callers, one per role, as the API authenticates them."""

    name: str
    callers: dict[Role, Caller]

    @property
    def admin(self) -> Caller:
        return self.callers[Role.ADMIN]

    @property
    def owner(self) -> Caller:
        return self.callers[Role.DATA_OWNER]

    @property
    def trainer(self) -> Caller:
        return self.callers[Role.TRAINER]

    @property
    def viewer(self) -> Caller:
        return self.callers[Role.VIEWER]


def make_tenant(store: Store, name: str) -> Tenant:
    """A key of each role for ``name`` (``dprc keys create --tenant NAME --role R``), each
    authenticated from its secret (``Authorization: Bearer …``)."""
    callers = {}
    for role in Role:
        with store.sessions() as session:
            _key_id, secret = keys.create_key(session, name, role, name=f"{name} {role.value}")
        with store.sessions() as session:
            callers[role] = keys.authenticate(session, f"Bearer {secret}")
    return Tenant(name, callers)


@dataclass
class Domain:
    """One fresh store and two tenants."""

    store: Store
    acme: Tenant
    globex: Tenant

    @property
    def data_dir(self) -> Path:
        return self.store.settings.data_dir

    # -- data ----------------------------------------------------------------------------

    def upload(
        self,
        caller: Caller,
        data: bytes,
        epsilon: float | None = None,
        delta: float | None = None,
        filename: str = "data.jsonl",
    ) -> files.DataSet:
        """``POST /v1/files`` (purpose fine-tune) as its router calls the domain."""
        wish = BudgetWish(epsilon_budget=epsilon, delta=delta)
        return files.create_file(self.store, caller, data, filename, "fine-tune", wish)

    # -- jobs ----------------------------------------------------------------------------

    def create_job(self, caller: Caller, file_id: str, epsilon: float = 1.0) -> Job:
        """``POST /v1/fine_tuning/jobs`` as its router calls the domain (:func:`job_request`)."""
        return jobs.create_job(self.store, caller, job_request(file_id, epsilon))

    def job(self, job_id: str) -> Job:
        with self.store.sessions() as session:
            row = session.scalar(select(Job).where(Job.id == job_id))
            assert row is not None
            return row

    # -- the audit log -------------------------------------------------------------------

    def audit(self, tenant: Tenant, action: str | None = None) -> list[AuditEntry]:
        """The tenant's audit entries (of ``action``), oldest first, read from the store."""
        with self.store.sessions() as session:
            q = select(AuditEntry).where(AuditEntry.tenant_id == tenant.admin.tenant_id)
            if action is not None:
                q = q.where(AuditEntry.action == action)
            return list(session.scalars(q.order_by(AuditEntry.seq)))


def open_domain(migrated: Path, data_dir: Path, **overrides: Any) -> Domain:
    data_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(migrated, data_dir / SQLITE_NAME)
    store = open_store(settings_for(data_dir, **overrides))
    return Domain(store, make_tenant(store, "acme"), make_tenant(store, "globex"))


@pytest.fixture()
def make_domain(migrated_sqlite, tmp_path) -> Iterator[Callable[..., Domain]]:
    """``make_domain(**settings)``: a fresh store with these settings changed, and its tenants."""
    opened: list[Domain] = []

    def make(**overrides: Any) -> Domain:
        domain = open_domain(migrated_sqlite, tmp_path / f"data-{len(opened)}", **overrides)
        opened.append(domain)
        return domain

    yield make
    for domain in opened:
        domain.store.engine.dispose()


@pytest.fixture()
def domain(make_domain) -> Domain:
    """A fresh store with the default settings and its two tenants."""
    return make_domain()


# -- data and requests ----------------------------------------------------------------------


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


def reviews(n: int = 40, tag: str = "a") -> bytes:
    """``n`` distinct labelled lines (a classification data set); ``tag`` makes another one."""
    verdict = ("bad", "good")
    return jsonl(
        [
            {"text": f"review {tag}{i} of the {tag} shop was {verdict[i % 2]}", "label": i % 2}
            for i in range(n)
        ]
    )


def job_request(file_id: str, epsilon: float = 1.0) -> jobs.JobRequest:
    """A one-epoch MiniLM job with exact clipping and batch 20: cheap to plan (exact norms:
    the plain Poisson-subsampled Gaussian)."""
    return jobs.JobRequest(
        model=MODEL,
        training_file=file_id,
        privacy=jobs.PrivacySettings(target_epsilon=epsilon, norm_method="exact"),
        hyperparameters=jobs.Hyperparameters(n_epochs=1, batch_size=20),
    )
