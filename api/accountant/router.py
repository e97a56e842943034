"""``POST /v1/accountant/epsilon``, ``POST /v1/accountant/noise_multiplier`` and
``POST /v1/accountant/job_plan``."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.accountant import service
from api.accountant.schemas import (
    AccountantResult,
    EpsilonRequest,
    JobPlanPreview,
    NoiseMultiplierRequest,
)
from api.app_state import get_store
from api.jobs.schemas import JobCreate
from api.keys.dependencies import CallerDep

router = APIRouter(prefix="/v1/accountant", tags=["accountant"])


@router.post("/epsilon", response_model=AccountantResult)
def epsilon(body: EpsilonRequest, _caller: CallerDep) -> AccountantResult:
    """Upper bound on ε at δ for ``steps`` Poisson-subsampled DP-SGD(-RC) steps."""
    return service.epsilon(body)


@router.post("/noise_multiplier", response_model=AccountantResult)
def noise_multiplier(body: NoiseMultiplierRequest, _caller: CallerDep) -> AccountantResult:
    """Smallest σ (within ``rel_tol``) whose ε at ``target_delta`` is at most the target."""
    return service.calibrate(body)


@router.post("/job_plan", response_model=JobPlanPreview)
def job_plan(body: JobCreate, request: Request, caller: CallerDep) -> JobPlanPreview:
    """The privacy plan ``POST /v1/fine_tuning/jobs`` would make for the same body (σ, q,
    steps, planned ε) and the training file's budget with it; nothing is created."""
    return service.job_plan(get_store(request), caller, body)
