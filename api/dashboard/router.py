"""The dashboard's pages: sign in and out, home, data sets, jobs, a job, new job, accountant,
the playground (``?model=`` preselects a model), synthetic-data jobs and one of them, and for
admins the tenant's keys and audit log.

A page checks the session cookie (:mod:`api.dashboard.session`), the caller's role for the
admin pages (:func:`service.governance.roles.authorize`: a 403 page) and, for one data set or job,
that
the caller owns it (the same service functions as the JSON API: another tenant's is a 404
page); everything else on a page is fetched by its script from the JSON API, which enforces
the roles again."""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from api.app_state import get_store
from api.dashboard import pages
from api.dashboard.security import SecureStaticFiles, secure
from api.dashboard.session import COOKIE, clear_cookie, same_origin, session_caller, set_cookie
from service.base.errors import NotFound, PermissionDenied, Unauthenticated
from service.data import files
from service.governance import dashboard_sessions
from service.governance.keys import Caller
from service.governance.roles import Action, allowed, authorize
from service.jobs import jobs
from service.synthetic import synthetic_jobs

router = APIRouter(include_in_schema=False)
STATIC = Path(__file__).parent / "static"


def _to_sign_in(request: Request, clear: bool = False) -> Response:
    response = secure(RedirectResponse("/sign-in", status_code=303))
    if clear:
        clear_cookie(response, request, get_store(request).settings)
    return response


def _caller(request: Request) -> Caller | Response:
    """The signed-in caller, or a redirect to the sign-in page (clearing a cookie that no
    longer counts)."""
    try:
        caller = session_caller(request)
    except Unauthenticated:
        return _to_sign_in(request, clear=True)
    return caller if caller is not None else _to_sign_in(request)


def _request_id(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


def _sign_in_page(error: str | None, status: int = 200) -> HTMLResponse:
    box = "" if error is None else f'<p class="error" id="sign-in-error">{html.escape(error)}</p>'
    return pages.render("sign_in", "Sign in", None, fill={"error": box}, status=status)


@router.get("/sign-in")
def sign_in_form() -> HTMLResponse:
    return _sign_in_page(None)


@router.post("/sign-in")
def sign_in(request: Request, api_key: Annotated[str, Form(max_length=256)] = "") -> Response:
    if not same_origin(request):
        return _sign_in_page("sign-in refused: the form was posted from another site", 403)
    store = get_store(request)
    try:
        signed_in = dashboard_sessions.sign_in(store, api_key, _request_id(request))
    except Unauthenticated as exc:
        return _sign_in_page(f"Sign-in failed: {exc.message}", 401)
    response = secure(RedirectResponse("/", status_code=303))
    set_cookie(response, request, store.settings, signed_in.cookie)
    return response


@router.post("/sign-out")
def sign_out(request: Request) -> Response:
    """End the session on the server (its cookie no longer counts anywhere) and clear it."""
    if not same_origin(request):
        return _sign_in_page("sign-out refused: the form was posted from another site", 403)
    value = request.cookies.get(COOKIE)
    if value is not None:
        dashboard_sessions.sign_out(get_store(request), value, _request_id(request))
    return _to_sign_in(request, clear=True)


def _simple(page: str, title: str) -> Callable[[Request], Response]:
    def view(request: Request) -> Response:
        caller = _caller(request)
        if isinstance(caller, Response):
            return caller
        return pages.render(page, title, caller)

    return view


for _path, _page, _title in (
    ("/", "home", "Home"),
    ("/data-sets", "data_sets", "Data sets"),
    ("/jobs", "jobs", "Jobs"),
    ("/jobs/new", "new_job", "New job"),
    ("/accountant", "accountant", "Accountant"),
    ("/playground", "playground", "Playground"),
    ("/synthetic", "synthetic", "Synthetic data"),
):
    router.add_api_route(_path, _simple(_page, _title), methods=["GET"], name=f"page_{_page}")


def _admin(page: str, title: str, action: Action) -> Callable[[Request], Response]:
    """A page for the roles that may do ``action`` (a 403 page for the others); its script
    fetches what it shows from the JSON API, which checks the role again."""

    def view(request: Request) -> Response:
        caller = _caller(request)
        if isinstance(caller, Response):
            return caller
        try:
            authorize(caller, action)
        except PermissionDenied as exc:
            return pages.forbidden(caller, exc.message)
        fill = {"actions": pages.action_options()} if page == "audit" else None
        return pages.render(page, title, caller, data={"key-id": caller.key_id}, fill=fill)

    return view


router.add_api_route(
    "/keys", _admin("keys", "API keys", Action.MANAGE_KEYS), methods=["GET"], name="page_keys"
)
router.add_api_route(
    "/audit",
    _admin("audit", "Audit log", Action.READ_AUDIT_LOG),
    methods=["GET"],
    name="page_audit",
)


@router.get("/data-sets/{file_id}")
def data_set_page(file_id: str, request: Request) -> Response:
    caller = _caller(request)
    if isinstance(caller, Response):
        return caller
    try:
        file = files.retrieve(get_store(request), caller, file_id).row
    except NotFound as exc:
        return pages.not_found(caller, exc.message)
    may_change = allowed(caller.role, Action.CHANGE_BUDGET)
    form = pages.budget_form() if may_change else pages.budget_note()
    return pages.render(
        "data_set", file.filename, caller, data={"file-id": file.id}, fill={"budget": form}
    )


@router.get("/jobs/{job_id}")
def job_page(job_id: str, request: Request) -> Response:
    caller = _caller(request)
    if isinstance(caller, Response):
        return caller
    try:
        job = jobs.retrieve(get_store(request), caller, job_id)
    except NotFound as exc:
        return pages.not_found(caller, exc.message)
    return pages.render("job", job.id, caller, data={"job-id": job.id})


@router.get("/synthetic/{job_id}")
def synthetic_job_page(job_id: str, request: Request) -> Response:
    caller = _caller(request)
    if isinstance(caller, Response):
        return caller
    try:
        job = synthetic_jobs.retrieve(get_store(request), caller, job_id).row
    except NotFound as exc:
        return pages.not_found(caller, exc.message)
    return pages.render("synthetic_job", job.id, caller, data={"job-id": job.id})


def mount_dashboard(app: FastAPI) -> None:
    """The pages and their static files (``/dashboard/static``) on ``app``."""
    app.include_router(router)
    app.mount(pages.STATIC_URL, SecureStaticFiles(directory=STATIC), name="dashboard-static")
