"""the planned privacy event: ``jobs.privacy.event``, the one stored form of what a job charges

A job created from this revision on stores its planned privacy event (the event class's JSON,
``to_dict``) in ``privacy.event``; the budget, the ledger files and the consistency check read
it (a job's spent event is its first ``steps_done`` steps: ``first_steps``), and ``privacy.noise``
is no longer stored (a read derives it from ``privacy.mechanisms``). This revision writes the
event of every older job from what its row held: the plan's columns (σ, q, steps, the
accountant's envelope, k and sketch) and ``privacy.noise`` (ν-DP-FTRL's ν, bands and epoch
length). It reads the mechanism's stored name: a data migration of history, frozen here; the
code reads only the event.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06 04:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

jobs = sa.table(
    "jobs",
    sa.column("id", sa.String()),
    sa.column("privacy", sa.JSON()),
    sa.column("noise_multiplier", sa.Float()),
    sa.column("sample_rate", sa.Float()),
    sa.column("steps_total", sa.Integer()),
    sa.column("accounting_clipping", sa.String()),
    sa.column("accounting_k", sa.Integer()),
    sa.column("accounting_sketch", sa.String()),
)


def _event(row: sa.Row) -> dict:
    noise = (row.privacy or {}).get("noise") or {}
    sigma, steps = float(row.noise_multiplier), int(row.steps_total)
    if noise.get("mechanism") == "nu_dpftrl":  # the only other mechanism ever stored
        separation = int(noise["min_separation"])
        return {
            "noise_multiplier": sigma,
            "steps": steps,
            "clipping": "exact",
            "k": None,
            "rank": None,
            "mechanism": "nu_dpftrl",
            "nu": float(noise["nu"]),
            "bands": noise.get("bands"),
            "participations": -(-steps // separation),
            "min_separation": separation,
        }
    event = {
        "noise_multiplier": sigma,
        "sample_rate": float(row.sample_rate),
        "steps": steps,
        "clipping": row.accounting_clipping,
        "k": row.accounting_k,
        "rank": None,
        "mechanism": "gaussian",
    }
    if (row.accounting_sketch or "shared") != "shared":
        event["sketch"] = row.accounting_sketch
    return event


def upgrade() -> None:
    conn = op.get_bind()
    for row in conn.execute(sa.select(jobs)).all():
        privacy = dict(row.privacy or {})
        if "event" in privacy:
            continue
        privacy["event"] = _event(row)
        conn.execute(sa.update(jobs).where(jobs.c.id == row.id).values(privacy=privacy))


def downgrade() -> None:
    """Older code reads ``privacy.noise``: a job created since 0012 gets it back from its
    stored mechanism and plan; ``privacy.event`` is left in place (older code ignores it)."""
    conn = op.get_bind()
    for row in conn.execute(sa.select(jobs)).all():
        privacy = dict(row.privacy or {})
        if "noise" in privacy:
            continue
        event = privacy.get("event") or {}
        noise = {"mechanism": event.get("mechanism", "gaussian")}
        if "nu" in event:
            noise.update(
                nu=event["nu"], bands=event.get("bands"), min_separation=event["min_separation"]
            )
        privacy["noise"] = noise
        conn.execute(sa.update(jobs).where(jobs.c.id == row.id).values(privacy=privacy))
