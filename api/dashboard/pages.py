"""The dashboard's HTML: a layout around one template per page, every value escaped. Pages
hold no data; their script (``static/<page>.js``) fetches it from the JSON API. The layout
shows the signed-in key's tenant and role, and the admin pages in the menu to admins only;
``<main data-role>`` tells the scripts the role (the server enforces it regardless)."""

from __future__ import annotations

import html
from functools import cache
from pathlib import Path
from string import Template

from fastapi.responses import HTMLResponse

from api.dashboard.security import secure
from service.governance.audit import Act
from service.governance.keys import Caller
from service.governance.roles import Action, allowed

TEMPLATES = Path(__file__).parent / "templates"
STATIC_URL = "/dashboard/static"

NAV = (
    ("/data-sets", "Data sets"),
    ("/jobs", "Jobs"),
    ("/jobs/new", "New job"),
    ("/accountant", "Accountant"),
    ("/playground", "Playground"),
    ("/synthetic", "Synthetic data"),
)
# (url, title, the action its role must be allowed)
ADMIN_NAV = (
    ("/keys", "Keys", Action.MANAGE_KEYS),
    ("/audit", "Audit log", Action.READ_AUDIT_LOG),
)


@cache
def _template(name: str) -> Template:
    return Template((TEMPLATES / f"{name}.html").read_text(encoding="utf-8"))


def render(
    page: str,
    title: str,
    caller: Caller | None,
    *,
    data: dict[str, str] | None = None,
    fill: dict[str, str] | None = None,
    status: int = 200,
    script: bool = True,
) -> HTMLResponse:
    """The page ``page`` (template ``templates/<page>.html``, script ``static/<page>.js``).
    ``data`` become ``data-*`` attributes of ``<main>`` (escaped; ``data-role`` is the
    caller's role when signed in); ``fill`` are HTML
    fragments for the template's ``$names`` (already safe)."""
    main = _template(page).substitute(fill or {})
    scripts = [f"{STATIC_URL}/common.js", f"{STATIC_URL}/chart.js"]
    if script:
        scripts.append(f"{STATIC_URL}/{page}.js")
    attributes = {**({"role": caller.role} if caller is not None else {}), **(data or {})}
    attrs = "".join(
        f' data-{html.escape(k, quote=True)}="{html.escape(v, quote=True)}"'
        for k, v in attributes.items()
    )
    return secure(
        HTMLResponse(
            _template("layout").substitute(
                title=html.escape(title),
                scripts="\n".join(f'<script src="{s}" defer></script>' for s in scripts),
                nav=_nav(caller),
                account=_account(caller),
                page=html.escape(page, quote=True),
                data=attrs,
                main=main,
            ),
            status_code=status,
        )
    )


def _nav(caller: Caller | None) -> str:
    if caller is None:
        return ""
    links = list(NAV)
    links += [(u, t) for u, t, action in ADMIN_NAV if allowed(caller.role, action)]
    return "".join(f'<a href="{u}">{html.escape(t)}</a>' for u, t in links)


def _account(caller: Caller | None) -> str:
    if caller is None:
        return ""
    return (
        '<form method="post" action="/sign-out" class="account">'
        f'<span class="tenant" id="tenant">{html.escape(caller.tenant_name)}</span>'
        f'<span class="role" id="role" title="the role of the signed-in API key">'
        f"{html.escape(caller.role)}</span>"
        '<button type="submit" id="sign-out">Sign out</button></form>'
    )


def not_found(caller: Caller | None, message: str) -> HTMLResponse:
    return render(
        "not_found",
        "Not found",
        caller,
        fill={"message": html.escape(message)},
        status=404,
        script=False,
    )


def forbidden(caller: Caller, message: str) -> HTMLResponse:
    return render(
        "forbidden",
        "Not allowed",
        caller,
        fill={"message": html.escape(message)},
        status=403,
        script=False,
    )


def action_options() -> str:
    """``<option>``s of the audit log's actions (:class:`service.governance.audit.Act`)."""
    acts = sorted(v for k, v in vars(Act).items() if k.isupper() and isinstance(v, str))
    return "".join(
        f'<option value="{html.escape(a, quote=True)}">{html.escape(a)}</option>' for a in acts
    )


def budget_form() -> str:
    """The data-set page's budget change, for the roles that may change a budget."""
    return _template("budget_form").substitute()


def budget_note() -> str:
    return (
        '<p class="muted small" id="budget-read-only">The budget is read-only here: an admin '
        "of the tenant can change it.</p>"
    )
