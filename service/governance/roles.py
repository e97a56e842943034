"""Who may do what: every key has a role, and every use case asks :func:`authorize` before
it reads or changes anything. The table :data:`PERMISSIONS` is the whole policy
(docs/governance.md prints it).

* ``admin`` manages keys, budgets and policy and reads the audit log (and may do all else);
* ``data_owner`` owns the data's budgets: the only role besides admin that creates a budget,
  declares a data set's privacy unit, approves or rejects the uploads of others and changes
  budgets; it uploads, reads and downloads data, and trains nothing (separation of duties);
* ``trainer`` uploads data sets (they wait for a data owner's approval unless the tenant lets
  trainers budget their own), creates and controls jobs, downloads results;
* ``viewer`` reads.

A refusal is :class:`service.base.errors.PermissionDenied` (HTTP 403, ``permission_denied``) and
changes nothing.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

from service.base.errors import InvalidInput, PermissionDenied


class Role(StrEnum):
    ADMIN = "admin"
    DATA_OWNER = "data_owner"
    TRAINER = "trainer"
    VIEWER = "viewer"


DEFAULT_ROLE = Role.TRAINER


class Action(StrEnum):
    READ = "read"  # files, jobs, events, checkpoints' metadata, the accountant, the models
    UPLOAD = "upload"  # a data set (budgeted at once by an owner, else pending approval)
    DELETE_FILE = "delete_file"
    CONTROL_JOB = "control_job"  # create, cancel, pause, resume
    DOWNLOAD = "download"  # a file's content, checkpoints, results, ledgers
    SET_BUDGET = "set_budget"  # a new data set's budget and unit; approve or reject uploads
    CHANGE_BUDGET = "change_budget"  # ε or δ of a data set after its upload
    MANAGE_POLICY = "manage_policy"  # the tenant's settings (service/organization_settings)
    LIFT_FREEZE = "lift_freeze"  # acknowledge a data set frozen by a restore (admins only)
    MANAGE_KEYS = "manage_keys"
    READ_AUDIT_LOG = "read_audit_log"


PERMISSIONS: dict[Role, frozenset[Action]] = {
    Role.ADMIN: frozenset(Action),
    Role.DATA_OWNER: frozenset(
        {
            Action.READ,
            Action.UPLOAD,
            Action.DELETE_FILE,
            Action.DOWNLOAD,
            Action.SET_BUDGET,
            Action.CHANGE_BUDGET,
        }
    ),
    Role.TRAINER: frozenset(
        {Action.READ, Action.UPLOAD, Action.DELETE_FILE, Action.CONTROL_JOB, Action.DOWNLOAD}
    ),
    Role.VIEWER: frozenset({Action.READ}),
}


class HasRole(Protocol):
    @property
    def role(self) -> str: ...

    @property
    def key_id(self) -> str: ...


def parse_role(value: str) -> Role:
    try:
        return Role(value)
    except ValueError:
        raise InvalidInput(
            f"role must be one of {', '.join(r.value for r in Role)}, got {value[:32]!r}",
            param="role",
            code="invalid_value",
        ) from None


def allowed(role: str, action: Action) -> bool:
    try:
        return action in PERMISSIONS[Role(role)]
    except ValueError:  # a role this version does not know may do nothing
        return False


def authorize(caller: HasRole, action: Action) -> None:
    """Refuse ``caller`` (:class:`PermissionDenied`) unless its role may do ``action``."""
    if not allowed(caller.role, action):
        raise PermissionDenied(
            f"the {caller.role} key {caller.key_id} may not {action.value.replace('_', ' ')}; "
            f"ask an admin of the tenant",
            code="permission_denied",
        )
