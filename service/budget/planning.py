"""The privacy plan of a job, from the library's planner
(:func:`dprc_core.training.plan.plan_privacy`), so that the service charges exactly what the
runner computes:

- q = batch_size / N (Poisson sampling with expected batch size B).
- steps = ⌈n_epochs · N / B⌉, computed exactly. Rounding up makes the expected number of
  examples seen, steps·B, at least n_epochs·N; the runner executes exactly ``steps`` noisy
  steps and the ledger records every one of them, so the accounted steps are never fewer than
  the steps run (the runner refuses a plan whose steps differ).
- δ defaults to the δ of the training file's budget group (its budget's δ; a group without a
  budget: 1/N_group^1.1 rounded down), the δ its data set's page states ε at, so that a job,
  its ledger, its checkpoints and its data set state one (ε, δ) (:func:`_steps_and_delta`).
  Without a group (a caller that names none): 1/N^1.1 rounded down to two significant digits.
  A δ above 1/N is refused, and so is a δ above the budget's δ.
- σ = ``dprc_core.accounting.noise_multiplier`` with the dimension-free envelope (rank=None).
  ``auto`` clipping is planned as ``hutch`` (conservative: the service has no model at
  creation); a run whose every layer resolves to exact norms is re-accounted as exact by the
  worker before its first step is recorded (:func:`service.jobs.job_runs.record_accounting`).
- the sketch (``privacy.clipping.sketch``): ``shared`` (revealed-scale model) or
  ``per_example`` (hidden-scale model, docs/accounting.md §10: a smaller σ for the same ε);
  per_example needs a randomized method. The plan carries the sketch it was accounted with
  (``shared`` for exact clipping, which draws no sketch), stored as
  ``jobs.accounting_sketch`` and charged by the budget.
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from dprc_core.accounting import PrivacyEvent
from dprc_core.accounting.accountant_process import AccountantProcess
from dprc_core.accounting.calibration import calibrations_run_by
from dprc_core.accounting.events import SHARED_SKETCH, default_sketch
from dprc_core.accounting.memory import release_if_big
from dprc_core.clipping import DEFAULT_K, Auto, Clipping, norm_from_method
from dprc_core.noise import Gaussian, NoiseMechanism
from dprc_core.norm_methods import get_norm_method
from dprc_core.plan_errors import PlanError
from dprc_core.training.plan import PrivacyPlan, default_delta, plan_privacy
from service.base.errors import InvalidInput
from service.base.settings import Settings
from service.store.metrics import CALIBRATION_SECONDS

MAX_STEPS = 200_000
DEFAULT_EPOCHS = 3
DEFAULT_BATCH = 32

# Calibrations (tenths of a second of accountant work each) run one at a time in a process:
# under the GIL, concurrent ones gain nothing from running together, and one at a time they
# finish in arrival order — each in its own time instead of all at the end of a burst — and
# leave the interpreter to the requests that hold a file's turn (service/jobs/jobs.py).
_CALIBRATION_LANE = threading.Lock()

# The API process's accountant process (started on first use): calibrations and budget leaves
# on a core of their own, one at a time in arrival order (docs/benchmarks/budget.md).
_ACCOUNTANT = AccountantProcess()


def accountant_process(settings: Settings) -> AccountantProcess | None:
    """The accountant process of this API process when ``DPRC_ACCOUNTANT_PROCESS`` is on (the
    default), else None (the accountant runs in the calling thread)."""
    return _ACCOUNTANT if settings.accountant_process else None


@dataclass(frozen=True)
class JobPlan:
    """The service's plan of a job: the library's :class:`PrivacyPlan` with what the job row
    stores around it (the norm method asked, the accounted envelope, the noise)."""

    n_examples: int
    n_epochs: int
    batch_size: int
    sample_rate: float
    steps: int
    target_epsilon: float
    target_delta: float
    method: str
    k: int | None
    accounting_envelope: str  # the accountant's envelope family (auto: hutch)
    accounting_k: int | None
    noise_multiplier: float
    planned_epsilon: float
    mechanism: str = "gaussian"
    nu: float | None = None
    bands: int | None = None
    min_separation: int | None = None  # nu_dpftrl: steps per epoch
    # the sketch the accountant charged (shared | per_example; shared for exact clipping)
    sketch: str = SHARED_SKETCH
    # the library's plan this one was made from: the one plan, which builds the event
    privacy: PrivacyPlan | None = field(default=None, compare=False, repr=False)
    # what ε protects: "example", or "user" (n_examples then counts users, batch_size the
    # expected users a step; docs/privacy_unit.md)
    unit: str = "example"

    @property
    def accounting_clipping(self) -> str:
        """Deprecated name of :attr:`accounting_envelope`."""
        warnings.warn(
            "JobPlan.accounting_clipping is deprecated; use JobPlan.accounting_envelope",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.accounting_envelope

    def event(self) -> PrivacyEvent:
        """The whole plan's privacy event, built by the library's plan."""
        assert self.privacy is not None, "service plans are made by make_plan"
        return self.privacy.event()

    @property
    def noise(self) -> NoiseMechanism:
        """The noise mechanism of this plan, with its σ."""
        assert self.privacy is not None, "service plans are made by make_plan"
        return self.privacy.noise

    def mechanisms(
        self, max_grad_norm: float, max_seq_len: int, sketch: str, *, secure: bool
    ) -> dict[str, Any]:
        """The engine's clipping and noise objects of this plan, serialized (the job row's
        ``privacy.mechanisms``; the worker builds its engine from exactly them): the norm
        method with its k, the run's ``sketch`` (:func:`job_sketch`) and, for ``auto``, the
        ``max_seq_len`` it resolves for; the planned σ; ``secure``: the service's secure mode
        (taken by a mechanism that can draw from the secure stream)."""
        norm = norm_from_method(
            self.method,
            k=self.k if self.k is not None else DEFAULT_K,
            max_seq_len=max_seq_len if self.method == Auto.method else None,
            sketch=sketch,
        )
        noise = self.noise.with_secure(secure)
        return {"clipping": Clipping(max_grad_norm, norm).to_dict(), "noise": noise.to_dict()}

    def accountant(self) -> dict[str, Any]:
        """How the plan is accounted, for people (the job's ``privacy.accountant``)."""
        assert self.privacy is not None, "service plans are made by make_plan"
        return self.noise.accountant_facts(self.privacy)


@dataclass(frozen=True)
class PlanRequest:
    """What a job asks of the planner (the API's ``JobCreate`` gives it)."""

    target_epsilon: float
    target_delta: float | None = None
    n_epochs: int | Literal["auto"] = "auto"
    batch_size: int | Literal["auto"] = "auto"
    method: str = "auto"  # a registered norm method (dprc_core.norm_methods)
    k: int | None = None
    noise: NoiseMechanism = field(default_factory=Gaussian)  # without σ
    sketch: str = SHARED_SKETCH  # shared | per_example (randomized clipping only; job_sketch)
    unit: str = "example"  # example | user (N: the data set's users)
    sharding: str = "none"  # the job's sharding (the mechanism says whether it allows it)


# The library plan's fields as the API names them: a PlanError on a field is a 400 naming it.
API_FIELDS = {
    "dataset_size": "training_file",
    "batch_size": "hyperparameters.batch_size",
    "epochs": "hyperparameters.n_epochs",
    "target_epsilon": "privacy.target_epsilon",
    "noise_multiplier": "privacy.target_epsilon",
    "delta": "privacy.target_delta",
    "clipping": "privacy.clipping.method",
    "k": "privacy.clipping.k",
    "sketch": "privacy.clipping.sketch",
    "scale_width": "privacy.clipping.sketch",  # the hidden-scale law (never asked by the API)
    "noise": "privacy.noise.mechanism",
    "nu": "privacy.noise.nu",
    "bands": "privacy.noise.bands",
    "unit": "privacy.unit",
    "sharding": "sharding",
    "secure": "privacy.noise.mechanism",
}
# the code of a refused δ (the API's long-standing one)
_FIELD_CODES = {"delta": "invalid_delta"}


def refusal(exc: PlanError) -> InvalidInput:
    """A library plan rule's refusal as the API's 400, naming the API's field."""
    code = exc.code if exc.code != "invalid_value" else _FIELD_CODES.get(exc.field, exc.code)
    return InvalidInput(str(exc), param=API_FIELDS[exc.field], code=code)


@lru_cache(maxsize=512)
def library_plan(
    n: int,
    batch: int,
    n_epochs: int,
    clipping: str,
    k: int | None,
    target_epsilon: float,
    delta: float | None,
    noise: NoiseMechanism,
    sketch: str = SHARED_SKETCH,
    unit: str = "example",
    sharding: str = "none",
) -> PrivacyPlan:
    """The library's plan (σ calibrated for the target); cached, as retried and repeated
    jobs ask for the same plan. A calibration of a big job (~10⁴ steps: FFTs of millions of
    points) gives that memory back before the lane is free
    (:func:`dprc_core.accounting.memory.release_if_big`)."""
    with _CALIBRATION_LANE:
        try:
            return plan_privacy(
                dataset_size=n,
                batch_size=batch,
                epochs=n_epochs,
                clipping=clipping,
                k=k,
                target_epsilon=target_epsilon,
                delta=delta,
                mechanism=noise,
                sketch=sketch,
                unit=unit,
                sharding=sharding,
                max_steps=MAX_STEPS,
            )
        finally:
            release_if_big()


def _calibrated(
    req: PlanRequest,
    n: int,
    batch: int,
    n_epochs: int,
    clipping: str,
    k: int | None,
    delta: float | None,
    process: AccountantProcess | None,
) -> PrivacyPlan:
    """The library's plan; its rules' refusals as 400s naming the API's fields, a calibration
    that cannot reach the target as ``calibration_failed``; the Gaussian calibration in the
    accountant ``process`` when there is one."""
    started = time.perf_counter()
    cached = library_plan.cache_info().hits
    try:
        with calibrations_run_by(process.noise_multiplier if process is not None else None):
            plan = library_plan(
                n,
                batch,
                n_epochs,
                clipping,
                k,
                req.target_epsilon,
                delta,
                req.noise,
                req.sketch,
                req.unit,
                req.sharding,
            )
    except PlanError as exc:
        raise refusal(exc) from exc
    except (ValueError, RuntimeError) as exc:
        raise InvalidInput(
            f"cannot calibrate the noise: {exc}",
            param="privacy.target_epsilon",
            code="calibration_failed",
        ) from exc
    if library_plan.cache_info().hits == cached:  # a calibration ran (not a cached plan)
        CALIBRATION_SECONDS.observe(time.perf_counter() - started)
    if not math.isfinite(plan.planned_epsilon) or plan.planned_epsilon > req.target_epsilon:
        raise InvalidInput(  # pragma: no cover - the calibration guarantees it
            "calibration did not reach the target epsilon",
            param="privacy.target_epsilon",
            code="calibration_failed",
        )
    return plan


def make_plan(
    req: PlanRequest,
    n: int,
    default_k: int,
    *,
    group_delta: float | None = None,
    budget_delta: float | None = None,
    process: AccountantProcess | None = None,
) -> JobPlan:
    """The job's plan on ``n`` units: the library's plan (:func:`plan_privacy`, the one home
    of the plan rules), with what the service adds — the defaults of epochs, batch and k, the
    norm method's accounting envelope (``auto`` planned as hutch), and δ: the group's
    (``group_delta``: the δ its budget group states ε's at, the default), at most the budget's
    (``budget_delta``; None: the group has no budget) — :func:`_delta`. ``process``: the
    accountant process that calibrates (:func:`accountant_process`; None: this thread)."""
    n_epochs = DEFAULT_EPOCHS if req.n_epochs == "auto" else req.n_epochs
    batch = min(DEFAULT_BATCH, n) if req.batch_size == "auto" else req.batch_size
    entry = get_norm_method(req.method)  # the registry says what each method needs
    if not entry.randomized and req.k is not None:
        raise InvalidInput(
            "k is only meaningful for hutch, hutchpp and auto clipping",
            param="privacy.clipping.k",
            code="invalid_value",
        )
    k = (req.k if req.k is not None else default_k) if entry.randomized else None
    delta = _delta(n, req.target_delta, group_delta, budget_delta)
    lib = _calibrated(req, n, batch, n_epochs, entry.envelope, k, delta, process)
    return JobPlan(
        n,
        n_epochs,
        batch,
        lib.sample_rate,
        lib.steps,
        req.target_epsilon,
        lib.delta,
        req.method,
        k,
        lib.clipping,
        lib.k,
        lib.noise_multiplier,
        lib.planned_epsilon,
        lib.mechanism,
        lib.nu,
        lib.bands,
        lib.min_separation,
        sketch=lib.sketch,
        privacy=lib,
        unit=lib.unit,
    )


# δ above 1/(DELTA_WARNING_FACTOR·N) is warned about (issue 40): allowed (δ ≤ 1/N is the rule),
# but on a small data set such a δ is a sizable chance of failure for the whole data set.
DELTA_WARNING_FACTOR = 10
DELTA_LARGE = "delta_large"


def delta_warnings(delta: float, n: int, unit: str = "example") -> list[dict[str, str]]:
    """The warnings of a δ for an accounting size ``n`` (examples, or users for user-level DP):
    ``delta_large`` when δ > 1/(10·N) — a mechanism may release each unit whole with
    probability δ, about N·δ of them in expectation. A job object (``privacy.warnings``), the
    CLI and the dashboard show it."""
    if n <= 0 or delta <= 1 / (DELTA_WARNING_FACTOR * n):
        return []
    units = "users" if unit == "user" else "examples"
    return [
        {
            "code": DELTA_LARGE,
            "message": f"delta={delta:g} is above 1/(10*N) = "
            f"{1 / (DELTA_WARNING_FACTOR * n):.2g} for N = {n} {units}: delta is the "
            "probability the guarantee may fail, up to releasing each of the "
            f"{units} whole, N*delta = {n * delta:.2g} of them in expectation. On a data set "
            "this small, name a smaller delta (privacy.target_delta, or the data set's budget "
            "delta)",
        }
    ]


def job_sketch(method: str, noise: NoiseMechanism, sketch: str | None) -> str:
    """The sketch a job runs with: as asked, else the library's default — per-example
    projections for a randomized method, shared (nothing drawn) for exact norms and for a
    mechanism that takes exact norms only."""
    if sketch is not None:
        return sketch
    return default_sketch(get_norm_method(method).randomized and not noise.exact_clipping_only)


def _delta(
    n: int,
    target_delta: float | None,
    group_delta: float | None = None,
    budget_delta: float | None = None,
) -> float | None:
    """δ: the request's (at most the budget's δ; the library refuses one above 1/N), else the
    group's δ, else None (the library's default, 1/N^1.1 rounded down).

    One δ (issue 40): a job's default δ is its budget group's (``group_delta``), not one of its
    own training file's N, so the job's page, its ledger, its checkpoints' metadata and its data
    set's page state ε at the same δ. The budget composes every job's *event* (σ, q, steps) at
    the group's δ whatever δ a job names (service/budget/budget.py), so the group's charge is
    sound for any job δ; a job's δ only says at which δ its own ε is printed. A job may name a
    smaller δ (its ε at that δ is larger than at the budget's: still an upper bound of what it
    states); a larger one is refused (400 ``invalid_delta`` naming ``privacy.target_delta``):
    its printed ε would be smaller than the ε it costs the budget at the budget's δ. A group's
    δ above 1/N of this file (a budget set when the group was smaller than the file that joined
    it later) is no default: the file's 1/N^1.1 (smaller than the group's δ, so again an upper
    bound) is used instead."""
    if target_delta is None:
        if group_delta is not None and group_delta <= 1 / n:
            return group_delta
        return default_delta(n) if n >= 2 else None
    if budget_delta is not None and target_delta > budget_delta:
        raise InvalidInput(
            f"privacy.target_delta={target_delta:g} is above the delta of the data set's budget "
            f"({budget_delta:g}): the budget charges every job at its delta, so a job's "
            "epsilon at a larger delta would understate what it costs. Name a delta at most "
            f"{budget_delta:g}, or leave target_delta out (the budget's delta)",
            param="privacy.target_delta",
            code="invalid_delta",
        )
    return target_delta


def __getattr__(name: str) -> Any:
    if name == "Plan":  # the service's plan's former name, for one release
        warnings.warn(
            "service.budget.planning.Plan is deprecated; use service.budget.planning.JobPlan",
            DeprecationWarning,
            stacklevel=2,
        )
        return JobPlan
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
