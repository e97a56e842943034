"""ε for a noise multiplier and σ for a target ε, with every setting used in the answer; the
plan a job would get (a preview, nothing stored)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Literal, TypeVar

from api.accountant.schemas import (
    AccountantResult,
    EpsilonRequest,
    JobPlanPreview,
    NoiseMultiplierRequest,
    PlanBudget,
)
from api.files import service as files_service
from api.jobs import service as jobs_service
from api.jobs.schemas import JobCreate
from service.keys import Caller
from dprc_core.accounting import DEFAULT_SETTINGS, PrivacyEvent, account, noise_multiplier
from dprc_core.accounting.describe import (
    ADJACENCY,
    NU_DPFTRL_ACCOUNTANT,
    describe_event,
    envelope_words,
)
from dprc_core.accounting.dpftrl import (
    check_bands,
    check_nu,
    dpftrl_epsilon,
    dpftrl_noise_multiplier,
    dpftrl_sensitivity,
)
from dprc_core.accounting.events import (
    CLIPPINGS,
    check_clipping,
    check_delta,
    check_epsilon,
    check_noise_multiplier,
    check_sample_rate,
    check_sketch,
    check_steps,
)
from dprc_core.mechanism_names import NU_DPFTRL
from service import lifecycle, planning
from service import model_registry as models
from service.errors import InvalidInput
from service.store import Store

T = TypeVar("T")

MAX_STEPS = 1_000_000
MAX_RANK = 10**9

ResultKind = Literal["accountant.epsilon", "accountant.noise_multiplier"]


def _check(param: str | None, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, a library check; its ValueError is :class:`InvalidInput` on ``param``."""
    try:
        return fn(*args)
    except ValueError as exc:
        raise InvalidInput(str(exc), param=param, code="invalid_value") from exc


def _clipping(req: EpsilonRequest | NoiseMultiplierRequest) -> tuple[str, int | None, int | None]:
    """The clipping, k and rank, checked one parameter at a time so that a refusal names the
    parameter it is about: the method alone, then k with it, then the rank with both."""
    if req.clipping not in CLIPPINGS:
        _check("clipping", check_clipping, req.clipping, req.k, req.rank)
    _check("k", check_clipping, req.clipping, req.k, None)
    return _check("rank", check_clipping, req.clipping, req.k, req.rank)


def _positive_int(name: str, value: int | None) -> int:
    if value is None or value < 1:
        raise InvalidInput(
            f"{name} must be an integer >= 1, got {value!r}", param=name, code="invalid_value"
        )
    return value


def _job(
    req: EpsilonRequest | NoiseMultiplierRequest,
) -> tuple[float, int, str, int | None, int | None, str]:
    if req.sample_rate is None:
        raise InvalidInput(
            "sample_rate is required for mechanism gaussian",
            param="sample_rate",
            code="invalid_value",
        )
    for name in ("nu", "bands", "participations", "min_separation"):
        if getattr(req, name) is not None:
            raise InvalidInput(
                f"{name} applies to mechanism nu_dpftrl only", param=name, code="invalid_value"
            )
    q = _check("sample_rate", check_sample_rate, req.sample_rate)
    steps = _check("steps", check_steps, req.steps)
    if steps > MAX_STEPS:
        raise InvalidInput(
            f"steps must be at most {MAX_STEPS}", param="steps", code="invalid_value"
        )
    if req.rank is not None and req.rank > MAX_RANK:
        raise InvalidInput(f"rank must be at most {MAX_RANK}", param="rank", code="invalid_value")
    clipping, k, rank = _clipping(req)
    if k is not None and k > 4096:
        raise InvalidInput("k must be at most 4096", param="k", code="invalid_value")
    sketch = _check("sketch", check_sketch, req.sketch, clipping)  # per_example: randomized
    return q, steps, clipping, k, rank, sketch


def _result(kind: ResultKind, event: PrivacyEvent, delta: float) -> AccountantResult:
    try:
        res = account([event], delta, DEFAULT_SETTINGS)
    except ValueError as exc:  # e.g. "parameters too extreme" for the loss grid
        raise InvalidInput(
            f"cannot account these parameters: {exc}", param=None, code="accounting_failed"
        ) from exc
    words = describe_event(event)
    return AccountantResult(
        object=kind,
        epsilon=res.epsilon if math.isfinite(res.epsilon) else None,
        noise_multiplier=event.noise_multiplier,
        delta=delta,
        sample_rate=event.sample_rate,
        steps=event.steps,
        clipping=event.clipping,
        k=event.k,
        rank=event.rank,
        sketch=event.sketch,
        sketch_model=words["sketch"],
        envelope=words["envelope"],
        adjacency=words["adjacency"],
        accountant={
            "description": res.describe(),
            "grid_interval": res.grid_interval,
            "scale_bins": list(res.scale_bins),
            "tail_budget_per_step": res.tail_budget_per_step,
            "settings": asdict(res.settings),
        },
    )


def _nu_pattern(req: EpsilonRequest | NoiseMultiplierRequest) -> dict[str, Any]:
    if req.sample_rate is not None:
        raise InvalidInput(
            "nu_dpftrl has no amplification by sampling: no sample_rate",
            param="sample_rate",
            code="invalid_value",
        )
    if req.clipping != "exact" or req.k is not None or req.rank is not None:
        raise InvalidInput(
            "nu_dpftrl is accounted for exact clipping only (randomized "
            "clipping with correlated noise has no analysis)",
            param="clipping",
            code="invalid_value",
        )
    if req.sketch != "shared":
        raise InvalidInput(
            "sketch='per_example' applies to randomized clipping, which nu_dpftrl refuses "
            "(exact norms draw no sketch)",
            param="sketch",
            code="invalid_value",
        )
    for name in ("nu", "participations", "min_separation"):
        if getattr(req, name) is None:
            raise InvalidInput(f"nu_dpftrl needs {name}", param=name, code="invalid_value")
    if req.steps > 20_000:
        raise InvalidInput(
            "steps must be at most 20000 for nu_dpftrl", param="steps", code="invalid_value"
        )
    pattern = {
        "nu": _check("nu", check_nu, req.nu),
        "steps": _positive_int("steps", req.steps),
        "participations": _positive_int("participations", req.participations),
        "min_separation": _positive_int("min_separation", req.min_separation),
        "bands": _check("bands", check_bands, req.bands),
    }
    _check(None, dpftrl_sensitivity, *pattern.values())  # what is left: the combination
    return pattern


def _nu_result(
    kind: ResultKind, sigma: float, delta: float, pattern: dict[str, Any]
) -> AccountantResult:
    eps = dpftrl_epsilon(sigma, delta, **pattern)
    sens = dpftrl_sensitivity(**pattern)
    return AccountantResult(
        object=kind,
        epsilon=eps if math.isfinite(eps) else None,
        noise_multiplier=sigma,
        delta=delta,
        mechanism=NU_DPFTRL,
        sample_rate=None,
        steps=pattern["steps"],
        nu=pattern["nu"],
        bands=pattern["bands"],
        participations=pattern["participations"],
        min_separation=pattern["min_separation"],
        sensitivity=sens,
        clipping="exact",
        k=None,
        rank=None,
        envelope=envelope_words("exact", None, None),
        adjacency=ADJACENCY[NU_DPFTRL],
        accountant={"description": NU_DPFTRL_ACCOUNTANT},
    )


def epsilon(req: EpsilonRequest) -> AccountantResult:
    if req.mechanism == NU_DPFTRL:
        pattern = _nu_pattern(req)
        sigma = _check("noise_multiplier", check_noise_multiplier, req.noise_multiplier)
        delta = _check("delta", check_delta, req.delta)
        return _nu_result("accountant.epsilon", sigma, delta, pattern)
    q, steps, clipping, k, rank, sketch = _job(req)
    sigma = _check("noise_multiplier", check_noise_multiplier, req.noise_multiplier)
    if sigma < 1e-3 or sigma > 1e4:
        raise InvalidInput(
            "noise_multiplier must be in [0.001, 10000]",
            param="noise_multiplier",
            code="invalid_value",
        )
    delta = _check("delta", check_delta, req.delta)
    event = PrivacyEvent(sigma, q, steps, clipping, k, rank, sketch=sketch)
    return _result("accountant.epsilon", event, delta)


def calibrate(req: NoiseMultiplierRequest) -> AccountantResult:
    if req.mechanism == NU_DPFTRL:
        pattern = _nu_pattern(req)
        target = _check("target_epsilon", check_epsilon, req.target_epsilon)
        delta = _check("target_delta", check_delta, req.target_delta)
        try:
            sigma = dpftrl_noise_multiplier(target, delta, **pattern)
        except ValueError as exc:
            raise InvalidInput(str(exc), param="target_epsilon", code="calibration_failed") from exc
        out = _nu_result("accountant.noise_multiplier", sigma, delta, pattern)
        return out.model_copy(update={"target_epsilon": target})
    q, steps, clipping, k, rank, sketch = _job(req)
    target = _check("target_epsilon", check_epsilon, req.target_epsilon)
    delta = _check("target_delta", check_delta, req.target_delta)
    if not 1e-6 <= req.rel_tol <= 0.5:
        raise InvalidInput("rel_tol must be in [1e-6, 0.5]", param="rel_tol", code="invalid_value")
    try:
        sigma = noise_multiplier(
            target, delta, q, steps, clipping, k, rank, rel_tol=float(req.rel_tol), sketch=sketch
        )
    except ValueError as exc:
        raise InvalidInput(str(exc), param="target_epsilon", code="calibration_failed") from exc
    event = PrivacyEvent(sigma, q, steps, clipping, k, rank, sketch=sketch)
    out = _result("accountant.noise_multiplier", event, delta)
    return out.model_copy(update={"target_epsilon": target, "rel_tol": float(req.rel_tol)})


def job_plan(store: Store, caller: Caller, req: JobCreate) -> JobPlanPreview:
    """The plan job creation would make for ``req`` (:func:`service.planning.make_plan`, the
    same call) and the training file's composed budget with it; nothing is stored."""
    models.get_model(store.settings, req.model)
    with store.sessions() as session:
        file = files_service.get_row(session, caller, req.training_file)
        if file.purpose != "fine-tune" or file.n_examples is None:
            raise InvalidInput(
                f"file {file.id} is not a fine-tune data set",
                param="training_file",
                code="invalid_file",
            )
        n = file.n_examples
        events = lifecycle.file_events(session, file)
        eps_b, delta_b = file.epsilon_budget, file.delta
    plan = planning.make_plan(jobs_service.plan_request(req), n, store.settings.default_k)
    preview_budget = None
    if eps_b is not None and delta_b is not None:
        committed = lifecycle.totals(events, delta_b)[1]
        with_job = lifecycle.totals(events, delta_b, plan.event())[1]
        preview_budget = PlanBudget(
            epsilon=eps_b,
            delta=delta_b,
            committed=committed if math.isfinite(committed) else None,
            committed_with_job=with_job if math.isfinite(with_job) else None,
            remaining_after=eps_b - with_job if math.isfinite(with_job) else None,
            fits=with_job <= eps_b,
        )
    return JobPlanPreview(
        training_file=req.training_file,
        n_examples=n,
        n_epochs=plan.n_epochs,
        batch_size=plan.batch_size,
        sample_rate=plan.sample_rate,
        steps=plan.steps,
        target_epsilon=plan.target_epsilon,
        target_delta=plan.target_delta,
        noise_multiplier=plan.noise_multiplier,
        planned_epsilon=plan.planned_epsilon,
        mechanism=plan.mechanism,
        clipping=plan.method,
        k=plan.k,
        sketch=planning.job_sketch(
            req.privacy.clipping.method, req.privacy.noise.mechanism, req.privacy.clipping.sketch
        ),
        accounting_clipping=plan.accounting_clipping,
        accounting_k=plan.accounting_k,
        accounting_sketch=plan.sketch,
        budget=preview_budget,
    )
