"""``POST /v1/accountant/epsilon`` and ``POST /v1/accountant/noise_multiplier``."""

from __future__ import annotations

from fastapi import APIRouter

from api.accountant import service
from api.accountant.schemas import AccountantResult, EpsilonRequest, NoiseMultiplierRequest
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
