"""Bodies and objects of ``/v1/synthetic_data/jobs`` (docs/synthetic.md, "The service")."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from api.jobs.schemas import Hyperparameters, PrivacyRequest, Strict


class FineTuningSettings(Strict):
    """The fine-tuning job a synthetic job from a training file creates: the body of
    ``POST /v1/fine_tuning/jobs`` without its training file (a causal LM; supervised)."""

    model: str = Field(min_length=1, max_length=256)
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    privacy: PrivacyRequest
    checkpoint_every: int | None = Field(default=None, ge=1, le=1_000_000)
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)
    suffix: str | None = Field(default=None, max_length=64, pattern=r"^[A-Za-z0-9_.-]*$")


class Sampling(Strict):
    temperature: float = Field(default=1.0, ge=0, le=2, description="0: greedy")
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: int = Field(default=128, ge=1, le=4096, description="tokens a record at most")


class PromptMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str = Field(max_length=32_768)


class SyntheticCreate(Strict):
    n: int = Field(ge=1, le=100_000, description="records to generate")
    model: str | None = Field(
        default=None,
        max_length=256,
        description="the ft: model of a succeeded job that trained a generator of records "
        "(one from a synthetic job, or a chat fine-tune); or give training_file",
    )
    training_file: str | None = Field(
        default=None,
        max_length=128,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="a fine-tune data set: the job fine-tunes on it first (with fine_tuning)",
    )
    fine_tuning: FineTuningSettings | None = Field(
        default=None, description="with training_file: the fine-tuning job created first"
    )
    labels: Literal["dp", "uniform"] | dict[str, float] = Field(
        default="dp",
        description="classification: 'dp' (a label histogram released under DP, charged to "
        "the data set), 'uniform', or {label: weight} (public: no charge)",
    )
    label_epsilon: float | None = Field(
        default=None,
        gt=0,
        le=100,
        description="the label histogram's own epsilon (default: a tenth of the fine-tuning "
        "job's target epsilon)",
    )
    prompts: list[list[PromptMessage]] = Field(
        default_factory=list,
        max_length=1000,
        description="chat: public prompts (message lists), used in turn; each record is a "
        "prompt with a generated answer",
    )
    sampling: Sampling = Field(default_factory=Sampling)
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)
    holdout_file: str | None = Field(
        default=None,
        max_length=128,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="held-out real records of the same format for the owner's report",
    )


class Sharing(Strict):
    download_roles: list[Literal["data_owner", "trainer", "viewer"]] = Field(
        max_length=3, description="the roles besides admin that may download the records"
    )


class SyntheticPrivacy(BaseModel):
    epsilon: float | None = Field(
        description="the data set's epsilon at delta: the composition of the fine-tuning "
        "job's events and the label histogram's (null: no finite bound)"
    )
    delta: float
    privacy_unit: str
    budget_group: str
    events: list[dict[str, Any]]
    label_histogram: dict[str, Any] | None = Field(
        default=None, description="the released histogram (noised counts), once drawn"
    )


class SyntheticError(BaseModel):
    code: str | None
    message: str | None


class SyntheticJob(BaseModel):
    id: str
    object: Literal["synthetic_data.job"] = "synthetic_data.job"
    created_at: int
    finished_at: int | None
    status: str
    n: int
    records_done: int
    format: str
    model: str | None = Field(description="the ft: model generating (null while it trains)")
    fine_tuning_job: str
    fine_tuning_status: str
    training_file: str
    holdout_file: str | None
    result_file: str | None
    labels: dict[str, Any]
    download_roles: list[str] = Field(description="who besides admin downloads the records")
    sampling: dict[str, Any]
    seed: int
    privacy: SyntheticPrivacy
    error: SyntheticError | None = None


class SyntheticJobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[SyntheticJob]
    has_more: bool


class SyntheticEvent(BaseModel):
    object: Literal["synthetic_data.job.event"] = "synthetic_data.job.event"
    created_at: int
    level: str
    message: str


class SyntheticEventList(BaseModel):
    object: Literal["list"] = "list"
    data: list[SyntheticEvent]
    has_more: bool = False
