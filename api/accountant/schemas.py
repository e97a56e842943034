"""Accountant requests use the library's parameter names; results echo every setting."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, field_validator

from dprc_core.noise import canonical_mechanism

Number = StrictFloat | StrictInt


class _Job(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mechanism: Literal["gaussian", "nu_dpftrl", "dp-sgd", "nu-dpftrl"] = Field(
        default="gaussian",
        description="gaussian: Poisson-subsampled Gaussian (DP-SGD); nu_dpftrl: correlated "
        "noise, fixed order, no amplification (needs nu, participations, min_separation; no "
        "sample_rate). The names are those of the job's privacy.noise.mechanism; the earlier "
        "spellings dp-sgd and nu-dpftrl are accepted (deprecated) and answered with the names.",
    )
    sample_rate: Number | None = None
    steps: StrictInt
    nu: Number | None = None
    bands: StrictInt | None = None
    participations: StrictInt | None = None
    min_separation: StrictInt | None = None
    clipping: str = "exact"
    k: StrictInt | None = None
    rank: StrictInt | None = Field(
        default=None, description="hutch only: total rank D; null = dimension-free envelope"
    )
    sketch: Literal["shared", "per_example"] = Field(
        default="shared",
        description="randomized clipping's projections: shared (one per layer per step for "
        "the batch; revealed-scale model) or per_example (independent per example; "
        "hidden-scale model, docs/accounting.md §10); per_example is refused with exact "
        "clipping and with nu_dpftrl",
    )

    @field_validator("mechanism")
    @classmethod
    def _one_name(cls, value: str) -> str:
        return canonical_mechanism(value)


class EpsilonRequest(_Job):
    noise_multiplier: Number
    delta: Number


class NoiseMultiplierRequest(_Job):
    target_epsilon: Number
    target_delta: Number
    rel_tol: Number = 0.005


class AccountantResult(BaseModel):
    object: Literal["accountant.epsilon", "accountant.noise_multiplier"]
    epsilon: float | None = Field(
        description="upper bound on epsilon at delta (add/remove, Poisson); null when no "
        "finite epsilon reaches delta"
    )
    noise_multiplier: float
    delta: float
    mechanism: str = "gaussian"
    sample_rate: float | None
    steps: int
    nu: float | None = None
    bands: int | None = None
    participations: int | None = None
    min_separation: int | None = None
    sensitivity: float | None = None
    clipping: str
    k: int | None
    rank: int | None
    target_epsilon: float | None = None
    rel_tol: float | None = None
    sketch: str = Field(default="shared", description="the sketch accounted (the request's)")
    sketch_model: str = Field(
        default="none (exact norms draw no sketch)",
        description="how the accountant modelled the sketch, in words",
    )
    envelope: str
    adjacency: str
    accountant: dict[str, Any]


class PlanBudget(BaseModel):
    """The training file's budget if the job were created now (composed ε's at its δ)."""

    epsilon: float
    delta: float
    committed: float | None = Field(description="composed ε of the file's jobs now")
    committed_with_job: float | None = Field(description="the same with this job's plan")
    remaining_after: float | None = Field(
        description="epsilon − committed_with_job (negative: the job would be refused)"
    )
    fits: bool


class JobPlanPreview(BaseModel):
    """What ``POST /v1/fine_tuning/jobs`` would plan for the same body, without creating it."""

    object: Literal["accountant.job_plan"] = "accountant.job_plan"
    training_file: str
    n_examples: int = Field(description="N of the accountant: the file's examples, or its users")
    unit: Literal["example", "user"] = Field(
        default="example", description="what ε protects (privacy.unit): n_examples counts these"
    )
    n_epochs: int
    batch_size: int
    sample_rate: float
    steps: int
    target_epsilon: float
    target_delta: float
    noise_multiplier: float
    planned_epsilon: float
    mechanism: str
    norm_method: str = Field(description="the job's norm method (privacy.clipping.norm_method)")
    clipping: str = Field(description="the job's norm method (the same; its earlier name)")
    k: int | None
    sketch: str = Field(description="the job's privacy.clipping.sketch")
    accounting_clipping: str = Field(description="what the accountant charges (auto: hutch)")
    accounting_k: int | None
    accounting_sketch: str = Field(
        description="the sketch the accountant charges (shared for exact clipping)"
    )
    budget: PlanBudget | None = Field(description="null: the file has no budget")
