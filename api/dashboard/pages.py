"""The dashboard's HTML: a layout around one template per page, every value escaped. Pages
hold no data; their script (``static/<page>.js``) fetches it from the JSON API."""

from __future__ import annotations

import html
from functools import cache
from pathlib import Path
from string import Template

from fastapi.responses import HTMLResponse

from api.dashboard.security import secure
from service.keys import Caller

TEMPLATES = Path(__file__).parent / "templates"
STATIC_URL = "/dashboard/static"

NAV = (
    ("/data-sets", "Data sets"),
    ("/jobs", "Jobs"),
    ("/jobs/new", "New job"),
    ("/accountant", "Accountant"),
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
    ``data`` become ``data-*`` attributes of ``<main>`` (escaped); ``fill`` are HTML
    fragments for the template's ``$names`` (already safe)."""
    main = _template(page).substitute(fill or {})
    scripts = [f"{STATIC_URL}/common.js", f"{STATIC_URL}/chart.js"]
    if script:
        scripts.append(f"{STATIC_URL}/{page}.js")
    attrs = "".join(
        f' data-{html.escape(k, quote=True)}="{html.escape(v, quote=True)}"'
        for k, v in (data or {}).items()
    )
    nav = "" if caller is None else "".join(f'<a href="{u}">{html.escape(t)}</a>' for u, t in NAV)
    account = (
        ""
        if caller is None
        else '<form method="post" action="/sign-out" class="account">'
        f'<span class="tenant" id="tenant">{html.escape(caller.tenant_name)}</span>'
        '<button type="submit" id="sign-out">Sign out</button></form>'
    )
    body = _template("layout").substitute(
        title=html.escape(title),
        scripts="\n".join(f'<script src="{s}" defer></script>' for s in scripts),
        nav=nav,
        account=account,
        page=html.escape(page, quote=True),
        data=attrs,
        main=main,
    )
    return secure(HTMLResponse(body, status_code=status))


def not_found(caller: Caller | None, message: str) -> HTMLResponse:
    return render(
        "not_found",
        "Not found",
        caller,
        fill={"message": html.escape(message)},
        status=404,
        script=False,
    )
