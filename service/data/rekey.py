"""Moving a tenant's example hashes from the raw text to the canonical key
(:func:`service.data.example_hashes.canonical_text`), once, at start-up.

Before migration 0010 an example's hash covered its raw bytes, so a copy with an edit that the
model cannot see (a trailing space, another case) started a new budget. A tenant whose
``hash_version`` is 1 is re-keyed under its lock: every file of a budget group whose content is
still on disk is hashed again, its canonical digests are added to its group, and the raw-text
rows are removed from ``example_hashes``. Where a file's content is gone (deleted, or lost),
the raw-text rows cannot be re-keyed: they move to ``legacy_example_hashes`` and the tenant
keeps ``legacy_hashes``, so that a re-upload of that data is also looked up by its raw-text
hash and still finds its group. A group's ``n_examples`` (the N of the δ ≤ 1/N rule) is kept:
re-keying can only merge examples, never add any.

Two groups whose examples become equal under the canonical key keep their budgets (budgets
are never merged); the shared canonical digest stays with the older group, and an upload of
that data is refused as sharing examples with both (409), as before for raw copies.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from service.base.errors import InvalidInput
from service.base.settings import Settings
from service.data.budget_groups import add_digests
from service.data.example_hashes import hash_file, tenant_secret
from service.store.db import locked_session
from service.store.store import Store, open_store
from service.store.tables import BudgetGroup, ExampleHash, File, LegacyExampleHash, Tenant

log = logging.getLogger(__name__)
CANONICAL = 2
MOVE_CHUNK = 5000


def open_current_store(settings: Settings) -> Store:
    """The store as the service runs on it: migrated to head
    (:func:`service.store.store.open_store`)
    and every tenant's example hashes on the canonical key (:func:`rekey_store`)."""
    store = open_store(settings)
    rekey_store(store)
    return store


def rekey_store(store: Store) -> int:
    """Re-key every tenant still at ``hash_version`` 1; the number re-keyed by this call."""
    with store.sessions() as session:
        tenants = list(session.scalars(select(Tenant.id).where(Tenant.hash_version < CANONICAL)))
    return sum(_rekey_tenant(store, tenant_id) for tenant_id in tenants)


def _rekey_tenant(store: Store, tenant_id: int) -> bool:
    secret = tenant_secret(store.settings.data_dir, tenant_id)
    with locked_session(store.sessions) as session:
        tenant = session.get(Tenant, tenant_id, with_for_update=True)
        if tenant is None or tenant.hash_version >= CANONICAL:
            return False  # another process did it
        rows = list(
            session.scalars(
                select(File)
                .where(File.tenant_id == tenant_id, File.group_id.is_not(None))
                .order_by(File.seq)
            )
        )
        groups = {
            g.id: g
            for g in session.scalars(select(BudgetGroup).where(BudgetGroup.tenant_id == tenant_id))
        }
        sizes = {gid: g.n_examples for gid, g in groups.items()}
        _move_raw_rows(session, tenant_id)  # kept unless every file is re-keyed
        session.execute(delete(ExampleHash).where(ExampleHash.tenant_id == tenant_id))
        rekeyed = 0
        for row in rows:
            path = Path(row.storage_path)
            if row.deleted or not path.exists():
                continue
            assert row.group_id is not None
            try:
                with hash_file(path, secret, path.parent, None, row.user_field) as hashed:
                    add_digests(session, tenant_id, groups[row.group_id], hashed)
            except InvalidInput as exc:  # a rule added since its upload: keep its raw hashes
                log.warning("file %s could not be re-keyed: %s", row.id, exc)
                continue
            rekeyed += 1
        legacy = rekeyed < len(rows)
        if not legacy:
            session.execute(
                delete(LegacyExampleHash).where(LegacyExampleHash.tenant_id == tenant_id)
            )
        for gid, group in groups.items():
            group.n_examples = sizes[gid]
        tenant.hash_version, tenant.legacy_hashes = CANONICAL, legacy
        session.commit()
    log.info(
        "re-keyed tenant %s's example hashes on the canonical text (%d of %d files%s)",
        tenant_id,
        rekeyed,
        len(rows),
        "; the others' raw-text hashes kept for lookups" if legacy else "",
    )
    return True


def _move_raw_rows(session: Session, tenant_id: int) -> None:
    last = 0
    while True:
        chunk = list(
            session.execute(
                select(ExampleHash.id, ExampleHash.digest, ExampleHash.group_id)
                .where(ExampleHash.tenant_id == tenant_id, ExampleHash.id > last)
                .order_by(ExampleHash.id)
                .limit(MOVE_CHUNK)
            )
        )
        if not chunk:
            return
        session.execute(
            insert(LegacyExampleHash),
            [{"tenant_id": tenant_id, "digest": d, "group_id": g} for _, d, g in chunk],
        )
        last = chunk[-1][0]
