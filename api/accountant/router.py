"""``POST /v1/accountant/epsilon``, ``POST /v1/accountant/noise_multiplier`` and
``POST /v1/accountant/job_plan``."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.accountant import views
from api.accountant.schemas import (
    AccountantResult,
    EpsilonRequest,
    JobPlanPreview,
    NoiseMultiplierRequest,
)
from api.app_state import get_store
from api.jobs import views as job_views
from api.jobs.schemas import JobCreate
from api.keys.dependencies import CallerDep
from service.jobs import accounting

router = APIRouter(prefix="/v1/accountant", tags=["accountant"])


@router.post("/epsilon", response_model=AccountantResult)
def epsilon(body: EpsilonRequest, _caller: CallerDep) -> AccountantResult:
    """Upper bound on ε at δ for ``steps`` Poisson-subsampled DP-SGD(-RC) steps."""
    answer = accounting.epsilon(views.query(body), body.noise_multiplier, body.delta)
    return views.result("accountant.epsilon", answer)


@router.post("/noise_multiplier", response_model=AccountantResult)
def noise_multiplier(body: NoiseMultiplierRequest, _caller: CallerDep) -> AccountantResult:
    """Smallest σ (within ``rel_tol``) whose ε at ``target_delta`` is at most the target."""
    answer = accounting.calibrate(
        views.query(body), body.target_epsilon, body.target_delta, body.rel_tol
    )
    return views.result("accountant.noise_multiplier", answer)


@router.post("/job_plan", response_model=JobPlanPreview)
def job_plan(body: JobCreate, request: Request, caller: CallerDep) -> JobPlanPreview:
    """The privacy plan ``POST /v1/fine_tuning/jobs`` would make for the same body (σ, q,
    steps, planned ε) and the training file's budget with it; nothing is created."""
    preview = accounting.job_plan(get_store(request), caller, job_views.job_request(body))
    return views.plan_preview(preview)
