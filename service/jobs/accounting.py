"""The accountant's use cases: ε for a noise multiplier and σ for a target ε, with every
setting used in the answer (:class:`AccountantAnswer`); the plan a job would get and its fit
in the training file's budget (:class:`JobPlanPreview`, nothing stored).

Requests are :class:`AccountantQuery` (the mechanism's parameters, as the library names them)
with the ε or σ side given separately; each refusal is an :class:`InvalidInput` naming the
parameter it is about."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, TypeVar

from dprc_core.accounting import DEFAULT_SETTINGS, PrivacyEvent, SubsampledGaussianEvent, account
from dprc_core.accounting import noise_multiplier as calibrated_noise_multiplier
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
    ENVELOPES,
    NuDPFTRLEvent,
    check_delta,
    check_envelope,
    check_epsilon,
    check_noise_multiplier,
    check_sample_rate,
    check_sketch,
    check_steps,
)
from dprc_core.mechanism_names import NU_DPFTRL
from service.base.errors import InvalidInput
from service.budget import budget, planning
from service.budget.job_units import resolve_unit
from service.data import files
from service.governance.keys import Caller
from service.jobs import jobs
from service.models import model_registry as models
from service.store.store import Store

T = TypeVar("T")

MAX_STEPS = 1_000_000
MAX_RANK = 10**9


@dataclass(frozen=True)
class AccountantQuery:
    """A mechanism to account: Poisson-subsampled Gaussian (``sample_rate``, the envelope
    ``clipping`` with ``k``/``rank`` and ``sketch``) or ν-DP-FTRL (``nu``, ``bands``,
    ``participations``, ``min_separation``), for ``steps`` steps."""

    steps: int
    mechanism: str = "gaussian"
    sample_rate: float | None = None
    nu: float | None = None
    bands: int | None = None
    participations: int | None = None
    min_separation: int | None = None
    clipping: str = "exact"
    k: int | None = None
    rank: int | None = None
    sketch: str = "shared"


@dataclass(frozen=True)
class AccountantAnswer:
    """An accountant's answer with every setting it used."""

    epsilon: float | None  # None: no finite ε reaches δ
    noise_multiplier: float
    delta: float
    sample_rate: float | None
    steps: int
    clipping: str
    k: int | None
    rank: int | None
    envelope: str
    adjacency: str
    accountant: dict[str, Any]
    mechanism: str = "gaussian"
    nu: float | None = None
    bands: int | None = None
    participations: int | None = None
    min_separation: int | None = None
    sensitivity: float | None = None
    target_epsilon: float | None = None
    rel_tol: float | None = None
    sketch: str = "shared"
    sketch_model: str = "none (exact norms draw no sketch)"


def _check(param: str | None, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, a library check; its ValueError is :class:`InvalidInput` on ``param``."""
    try:
        return fn(*args)
    except ValueError as exc:
        raise InvalidInput(str(exc), param=param, code="invalid_value") from exc


def _clipping(req: AccountantQuery) -> tuple[str, int | None, int | None]:
    """The clipping, k and rank, checked one parameter at a time so that a refusal names the
    parameter it is about: the method alone, then k with it, then the rank with both."""
    if req.clipping not in ENVELOPES:
        _check("clipping", check_envelope, req.clipping, req.k, req.rank)
    _check("k", check_envelope, req.clipping, req.k, None)
    return _check("rank", check_envelope, req.clipping, req.k, req.rank)


def _positive_int(name: str, value: int | None) -> int:
    if value is None or value < 1:
        raise InvalidInput(
            f"{name} must be an integer >= 1, got {value!r}", param=name, code="invalid_value"
        )
    return value


def _job(
    req: AccountantQuery,
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


def _result(event: PrivacyEvent, delta: float) -> AccountantAnswer:
    try:
        res = account([event], delta, DEFAULT_SETTINGS)
    except ValueError as exc:  # e.g. "parameters too extreme" for the loss grid
        raise InvalidInput(
            f"cannot account these parameters: {exc}", param=None, code="accounting_failed"
        ) from exc
    words = describe_event(event)
    return AccountantAnswer(
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
            # the hidden-scale law (per-example sketches): the one a job created now is on
            **({"scale_width": width} if (width := getattr(event, "scale_width", None)) else {}),
        },
    )


def _nu_pattern(req: AccountantQuery) -> dict[str, Any]:
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


def _nu_result(sigma: float, delta: float, pattern: dict[str, Any]) -> AccountantAnswer:
    eps = dpftrl_epsilon(sigma, delta, **pattern)
    sens = dpftrl_sensitivity(**pattern)
    return AccountantAnswer(
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


def _gaussian_epsilon(req: AccountantQuery, noise_multiplier: Any, delta: Any) -> AccountantAnswer:
    q, steps, clipping, k, rank, sketch = _job(req)
    sigma = _check("noise_multiplier", check_noise_multiplier, noise_multiplier)
    if sigma < 1e-3 or sigma > 1e4:
        raise InvalidInput(
            "noise_multiplier must be in [0.001, 10000]",
            param="noise_multiplier",
            code="invalid_value",
        )
    delta = _check("delta", check_delta, delta)
    event = SubsampledGaussianEvent(sigma, q, steps, clipping, k, rank, sketch=sketch)
    return _result(event, delta)


def _nu_epsilon(req: AccountantQuery, noise_multiplier: Any, delta: Any) -> AccountantAnswer:
    pattern = _nu_pattern(req)
    sigma = _check("noise_multiplier", check_noise_multiplier, noise_multiplier)
    delta = _check("delta", check_delta, delta)
    return _nu_result(sigma, delta, pattern)


def _gaussian_calibrate(
    req: AccountantQuery, target_epsilon: Any, target_delta: Any, rel_tol: float
) -> AccountantAnswer:
    q, steps, clipping, k, rank, sketch = _job(req)
    target = _check("target_epsilon", check_epsilon, target_epsilon)
    delta = _check("target_delta", check_delta, target_delta)
    if not 1e-6 <= rel_tol <= 0.5:
        raise InvalidInput("rel_tol must be in [1e-6, 0.5]", param="rel_tol", code="invalid_value")
    try:
        sigma = calibrated_noise_multiplier(
            target, delta, q, steps, clipping, k, rank, rel_tol=float(rel_tol), sketch=sketch
        )
    except ValueError as exc:
        raise InvalidInput(str(exc), param="target_epsilon", code="calibration_failed") from exc
    event = SubsampledGaussianEvent(sigma, q, steps, clipping, k, rank, sketch=sketch)
    out = _result(event, delta)
    return replace(out, target_epsilon=target, rel_tol=float(rel_tol))


def _nu_calibrate(
    req: AccountantQuery, target_epsilon: Any, target_delta: Any, rel_tol: float
) -> AccountantAnswer:
    pattern = _nu_pattern(req)
    target = _check("target_epsilon", check_epsilon, target_epsilon)
    delta = _check("target_delta", check_delta, target_delta)
    try:
        sigma = dpftrl_noise_multiplier(target, delta, **pattern)
    except ValueError as exc:
        raise InvalidInput(str(exc), param="target_epsilon", code="calibration_failed") from exc
    out = _nu_result(sigma, delta, pattern)
    return replace(out, target_epsilon=target)


# The accountant's questions per event class, keyed by the class's mechanism name (the classes
# are the accountant's registered ones; docs/extending.md says where a new one goes).
_EPSILON = {
    SubsampledGaussianEvent.mechanism: _gaussian_epsilon,
    NuDPFTRLEvent.mechanism: _nu_epsilon,
}
_CALIBRATE = {
    SubsampledGaussianEvent.mechanism: _gaussian_calibrate,
    NuDPFTRLEvent.mechanism: _nu_calibrate,
}


def epsilon(req: AccountantQuery, noise_multiplier: Any, delta: Any) -> AccountantAnswer:
    """ε at ``delta`` of ``req``'s mechanism with ``noise_multiplier``."""
    return _EPSILON[req.mechanism](req, noise_multiplier, delta)


def calibrate(
    req: AccountantQuery, target_epsilon: Any, target_delta: Any, rel_tol: float = 0.005
) -> AccountantAnswer:
    """The smallest σ (within ``rel_tol``) whose ε at ``target_delta`` is at most
    ``target_epsilon`` for ``req``'s mechanism."""
    return _CALIBRATE[req.mechanism](req, target_epsilon, target_delta, rel_tol)


@dataclass(frozen=True)
class JobPlanPreview:
    """What job creation would plan for a request, and its fit in the training file's budget
    (None: the file has none)."""

    training_file: str
    n_examples: int
    plan: planning.JobPlan
    sketch: str  # the job's sketch (privacy.clipping.sketch, or its default)
    budget: budget.PlanFit | None


def job_plan(store: Store, caller: Caller, req: jobs.JobRequest) -> JobPlanPreview:
    """The plan job creation would make for ``req`` (:func:`service.budget.planning.make_plan`, the
    same call) and the training file's composed budget with it; nothing is stored."""
    models.get_model(store.settings, req.model)
    with store.sessions() as session:
        file = files.get_row(session, caller, req.training_file)
        if file.purpose != "fine-tune" or file.n_examples is None:
            raise InvalidInput(
                f"file {file.id} is not a fine-tune data set",
                param="training_file",
                code="invalid_file",
            )
        unit = resolve_unit(file, req.privacy.unit, store.settings)
        n = unit.n
        group = budget.group_of(session, file)
        assert group is not None
        events = budget.group_events(session, group)
        eps_b, delta_b = group.epsilon_budget, group.delta
        deltas = jobs.plan_deltas(session, group)
    plan = planning.make_plan(
        jobs.plan_request(req),
        n,
        store.settings.default_k,
        **deltas,
        process=planning.accountant_process(store.settings),
    )
    fit = None
    if eps_b is not None and delta_b is not None:
        fit = budget.plan_fit(events, eps_b, delta_b, plan.event())
    pr = req.privacy
    return JobPlanPreview(
        training_file=req.training_file,
        n_examples=n,
        plan=plan,
        sketch=planning.job_sketch(pr.norm_method, pr.mechanism_object, pr.sketch),
        budget=fit,
    )
