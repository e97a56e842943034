"""Fine-tuning job requests and objects (OpenAI's shape; privacy fields are extras)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dprc_core.noise import NoiseMechanism
from dprc_core.noise.mechanisms import mechanism_names, noise_from_request
from dprc_core.norm_methods import offered_names
from service.store.job_status import JobStatus

SUFFIX = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class Strict(BaseModel):
    """Request bodies: unknown fields and wrong JSON types are 422 (``true`` is not a batch
    size, ``"16"`` not a number); an integer is still accepted where a float is expected."""

    model_config = ConfigDict(extra="forbid", strict=True)


class Lora(Strict):
    r: int = Field(default=8, ge=1, le=256)
    alpha: float = Field(default=16.0, gt=0, le=1e4, allow_inf_nan=False)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "v_proj"], min_length=1, max_length=64
    )

    @field_validator("target_modules")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not re.fullmatch(r"[A-Za-z0-9_.]{1,128}", name):
                raise ValueError(f"invalid module name {name[:40]!r}")
        return v


class Hyperparameters(Strict):
    n_epochs: int | Literal["auto"] = Field(default="auto", description="'auto' = 3")
    batch_size: int | Literal["auto"] = Field(
        default="auto",
        description="expected Poisson batch size B (q = B/N); 'auto' = min(32, N)",
    )
    learning_rate_multiplier: float | Literal["auto"] | None = Field(default=None)
    learning_rate: float | None = Field(default=None, gt=0, le=10, allow_inf_nan=False)
    max_seq_len: int = Field(default=128, ge=8, le=8192)
    lora: Lora | None = None
    train_only: list[str] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="train only parameters whose names contain one of these parts (e.g. "
        "['classifier'] for a DP linear probe); the rest stays frozen",
    )

    @field_validator("train_only")
    @classmethod
    def _parts(cls, v: list[str] | None) -> list[str] | None:
        for name in v or []:
            if not re.fullmatch(r"[A-Za-z0-9_.]{1,128}", name):
                raise ValueError(f"invalid parameter name part {name[:40]!r}")
        return v

    @field_validator("n_epochs")
    @classmethod
    def _epochs(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 1000:
            raise ValueError("n_epochs must be between 1 and 1000")
        return v

    @field_validator("batch_size")
    @classmethod
    def _batch(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 1_000_000:
            raise ValueError("batch_size must be between 1 and 1000000")
        return v

    @field_validator("learning_rate_multiplier")
    @classmethod
    def _lrm(cls, v: float | str | None) -> float | str | None:
        if isinstance(v, float | int) and not (0 < v <= 100):
            raise ValueError("learning_rate_multiplier must be in (0, 100]")
        return v

    @model_validator(mode="after")
    def _one_lr(self) -> Hyperparameters:
        if self.learning_rate is not None and self.learning_rate_multiplier not in (None, "auto"):
            raise ValueError("give learning_rate or learning_rate_multiplier, not both")
        return self


class DpoHyperparameters(Hyperparameters):
    beta: float | Literal["auto"] = Field(
        default="auto",
        description="DPO's β: how far the policy may move from the reference (the starting "
        "model); 'auto' = 0.1",
    )

    @field_validator("beta")
    @classmethod
    def _beta(cls, v: float | str) -> float | str:
        if isinstance(v, float | int) and not (0 < v <= 100 and v == v):
            raise ValueError("beta must be in (0, 100]")
        return v


class SupervisedMethod(Strict):
    hyperparameters: Hyperparameters | None = None


class DpoMethod(Strict):
    hyperparameters: DpoHyperparameters | None = None


class Method(Strict):
    """OpenAI's ``method``: ``supervised`` (the default) or ``dpo`` (preference pairs; the
    training file holds preference lines, docs/data.md "Preference lines"). ``reinforcement``
    is not offered."""

    type: Literal["supervised", "dpo"]
    supervised: SupervisedMethod | None = None
    dpo: DpoMethod | None = None

    @model_validator(mode="after")
    def _one_type(self) -> Method:
        other = "dpo" if self.type == "supervised" else "supervised"
        if getattr(self, other) is not None:
            raise ValueError(f"method.type is {self.type!r}: give method.{self.type}, not {other}")
        return self

    def hyperparameters(self) -> Hyperparameters | None:
        given = self.dpo if self.type == "dpo" else self.supervised
        return given.hyperparameters if given is not None else None


# the registered norm methods offered to service users (dprc_core/norm_methods.py): a new
# method is one registration
NormMethodName = Literal[tuple(offered_names())]  # type: ignore[valid-type]  # from the registry
# the registered noise mechanisms (dprc_core/noise/mechanisms.py): a new one is one subclass
MechanismName = Literal[mechanism_names()]  # type: ignore[valid-type]  # from the registry


# how randomized clipping draws its projections (dprc_core/sketches.py)
SketchName = Literal["shared", "per_example"]

# how a job's ranks hold the model (dprc_core.sharding.SHARDINGS)
ShardingName = Literal["none", "fsdp"]


class Clipping(Strict):
    """How per-example norms are computed (``norm_method``) and clipped. ``method`` is the
    deprecated name of ``norm_method``, accepted for one release: give either (both only if
    equal); after validation both hold the method the job runs."""

    norm_method: NormMethodName | None = Field(  # type: ignore[valid-type]  # NormMethodName
        default=None, description="how per-example norms are computed (default: auto)"
    )
    method: NormMethodName = Field(  # type: ignore[valid-type]  # see NormMethodName
        default="auto", description="deprecated name of norm_method"
    )
    k: int | None = Field(
        default=None, ge=1, le=4096, description="projection dimension (hutch, hutchpp, auto)"
    )
    sketch: SketchName | None = Field(
        default=None,
        description="randomized clipping's projections: 'per_example' (independent per "
        "example, layer and step; hidden-scale accounting, a smaller noise multiplier for the "
        "same epsilon) or 'shared' (one per layer per step for the whole batch; revealed-scale "
        "accounting). Omitted: per_example for a randomized method (hutch, hutchpp, auto), "
        "shared for exact and for nu_dpftrl (nothing is drawn); the job echoes what it runs. "
        "per_example is refused with exact. auto is planned and charged as hutch with this "
        "sketch until the worker resolves it; a run whose layers all resolve to exact norms "
        "draws no sketch and the job is then re-accounted as exact, shared (one event says so)",
    )

    @model_validator(mode="after")
    def _one_norm_method(self) -> Clipping:
        if self.norm_method is None:
            self.norm_method = self.method
        elif "method" in self.model_fields_set and self.method != self.norm_method:
            raise ValueError(
                f"norm_method={self.norm_method!r} and method={self.method!r} disagree: "
                "method is the deprecated name of norm_method; give norm_method alone"
            )
        else:
            self.method = self.norm_method
        return self


class Noise(Strict):
    mechanism: MechanismName = Field(  # type: ignore[valid-type]  # see MechanismName
        default="gaussian",
        description="gaussian: DP-SGD, Poisson sampling, independent noise; nu_dpftrl: "
        "correlated noise (ν-DP-FTRL), fixed-order batches, no amplification, exact "
        "clipping only",
    )
    nu: float | None = Field(
        default=None, ge=0, le=1, allow_inf_nan=False, description="nu_dpftrl damping ν in [0, 1]"
    )
    bands: int | None = Field(
        default=None, ge=1, le=100_000, description="nu_dpftrl banding (null: un-banded)"
    )

    @model_validator(mode="after")
    def _fields(self) -> Noise:
        self.mechanism_object()  # the mechanism's own fields, checked by its class
        return self

    def mechanism_object(self) -> NoiseMechanism:
        """The mechanism this names, without σ (a ValueError names what it refuses)."""
        return noise_from_request(self.mechanism, nu=self.nu, bands=self.bands)


class PrivacyUnit(Strict):
    """What ε protects (docs/privacy_unit.md): ``example`` (a line), or ``user``: all the lines
    of one user, named in each line's ``field`` (the training file's user field: ``user_id``
    or the field it was uploaded with); a sampled user contributes at most
    ``max_examples_per_user`` of their lines a step."""

    type: Literal["example", "user"] = "example"
    field: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="user: the field naming each line's user (default: the file's)",
    )
    max_examples_per_user: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="user: the most lines a sampled user contributes a step (default: "
        "min(8, the service's micro-batch)); it does not change ε",
    )


class PrivacyRequest(Strict):
    target_epsilon: float = Field(gt=0, le=100, allow_inf_nan=False)
    target_delta: float | None = Field(default=None, gt=0, lt=1, allow_inf_nan=False)
    max_grad_norm: float = Field(default=1.0, gt=0, le=1e4, allow_inf_nan=False)
    clipping: Clipping = Field(default_factory=Clipping)
    noise: Noise = Field(default_factory=Noise)
    unit: PrivacyUnit | Literal["example", "user"] = Field(
        default_factory=PrivacyUnit,
        description="what ε protects: 'example' (default) or 'user' (a data set whose lines "
        "name their users must train per user), or an object {type, field, "
        "max_examples_per_user}; the job echoes the object with n_users",
    )
    report_train_loss: bool = Field(
        default=True,
        description="training loss is computed on private data and is NOT covered by DP; "
        "false turns it off in events and checkpoints",
    )


class JobCreate(Strict):
    model: str = Field(min_length=1, max_length=256)
    training_file: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    hyperparameters: Hyperparameters = Field(
        default_factory=Hyperparameters,
        description="deprecated by OpenAI in favour of method.<type>.hyperparameters; give "
        "one of them",
    )
    method: Method | None = Field(
        default=None,
        description="OpenAI's method: {type: supervised | dpo, <type>: {hyperparameters}}; "
        "dpo trains preference lines with β (method.dpo.hyperparameters.beta)",
    )
    privacy: PrivacyRequest
    checkpoint_every: int | None = Field(default=None, ge=1, le=1_000_000)
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)
    suffix: str | None = Field(default=None, max_length=64)
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    validation_file: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="a fine-tune file of the same tenant and format, other than the training "
        "file and without a privacy budget: valid_loss (mean per-example loss on all of it) "
        "at every checkpoint. It costs the training file no privacy budget; valid_loss is not "
        "private with respect to the validation file",
    )
    devices: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="devices of each host the job trains on (data-parallel ranks; one "
        "Poisson batch per step split between all ranks, the noise added once)",
    )
    nodes: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="hosts the job trains on: nodes × devices ranks, launched through Ray "
        "(a deployment with DPRC_LAUNCHER=ray; 400 nodes_unavailable beyond "
        "DPRC_MAX_JOB_NODES). The privacy plan (σ, q, steps, ε) does not depend on the shape",
    )
    sharding: ShardingName = Field(
        default="none",
        description="how the job's ranks hold the model: 'none' (each rank holds the whole "
        "model) or 'fsdp' (FSDP2: each rank holds 1/devices of the parameters, gradients and "
        "optimizer state). fsdp needs devices >= 2 and the gaussian noise mechanism (400 "
        "sharding_needs_devices, sharding_unsupported); the privacy plan is the same",
    )

    @model_validator(mode="after")
    def _hyperparameters_once(self) -> JobCreate:
        if self.method is None:
            return self
        inner = self.method.hyperparameters()
        if inner is not None and "hyperparameters" in self.model_fields_set:
            raise ValueError(
                f"give the hyperparameters once: method.{self.method.type}.hyperparameters "
                "(OpenAI's current place) or hyperparameters (deprecated), not both"
            )
        return self

    def training_hyperparameters(self) -> Hyperparameters:
        """The hyperparameters given: the method's, else the top-level ones."""
        inner = self.method.hyperparameters() if self.method is not None else None
        return inner if inner is not None else self.hyperparameters

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, v: str | None) -> str | None:
        if v is not None and not SUFFIX.match(v):
            raise ValueError("suffix: 1 to 64 characters of A-Z a-z 0-9 _ -")
        return v

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        for key, value in (v or {}).items():
            if not 0 < len(key) <= 64 or len(value) > 512 or "\x00" in key + value:
                raise ValueError("metadata: keys of 1-64 and values of up to 512 characters")
        return v


class JobError(BaseModel):
    code: str
    message: str
    param: str | None = None


class Job(BaseModel):
    """An OpenAI fine-tuning job plus ``privacy``, ``steps_done``/``steps_total``."""

    id: str
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    created_at: int
    error: JobError | None
    fine_tuned_model: str | None
    finished_at: int | None
    hyperparameters: dict[str, Any]
    method: dict[str, Any] | None = Field(
        default=None,
        description="OpenAI's method: {type, <type>: {hyperparameters}} (dpo: with beta)",
    )
    model: str
    organization_id: str
    result_files: list[str]
    seed: int
    status: JobStatus  # the lifecycle's statuses (service/jobs/lifecycle.py), as their strings
    trained_tokens: int | None
    training_file: str
    validation_file: str | None = None
    estimated_finish: int | None = None
    integrations: list[Any] | None = None
    metadata: dict[str, str] | None = None
    user_provided_suffix: str | None = None
    privacy: dict[str, Any]
    steps_done: int
    steps_total: int
    checkpoint_every: int | None
    cancel_requested: bool
    pause_requested: bool = False
    nodes: int = Field(default=1, description="hosts it trains on (nodes × devices ranks)")
    devices: int = Field(default=1, description="devices (ranks) on each of its nodes")
    sharding: ShardingName = Field(
        default="none",
        description="'fsdp': the model sharded over the devices (FSDP2); 'none': whole on each",
    )
    created_by: str | None = Field(default=None, description="the id of the key that created it")


class JobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Job]
    has_more: bool


class Event(BaseModel):
    """A job event. ``data`` may carry metrics (step, epsilon_spent, and — unless the job has
    ``privacy.report_train_loss: false`` — train_loss). Training loss is computed on the
    private data and is **not** covered by the differential-privacy guarantee."""

    id: str
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    created_at: int
    level: Literal["info", "warn", "error"]
    message: str
    type: Literal["message", "metrics"]
    data: dict[str, Any] | None = None


class EventList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Event]
    has_more: bool


class Checkpoint(BaseModel):
    """``metrics``: ``step``, ``epsilon`` (spent up to the step), ``valid_loss`` (with a
    validation file), ``train_loss`` and ``clipped_fraction`` (unless
    ``report_train_loss: false``), ``batch_size``, ``dropped``."""

    id: str
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    created_at: int
    fine_tuned_model_checkpoint: str
    fine_tuning_job_id: str
    metrics: dict[str, Any]
    step_number: int
    epsilon: float = Field(description="privacy spent up to this step, at the job's delta")
    file_id: str = Field(description="archive: safetensors weights, config, tokenizer, ledger")


class CheckpointList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Checkpoint]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None


class Ledger(BaseModel):
    object: Literal["privacy.ledger"] = "privacy.ledger"
    job_id: str
    delta: float
    epsilon_spent: float
    ledger: dict[str, Any] = Field(description="dprc-privacy-ledger JSON of the steps that ran")
    planned: dict[str, Any] = Field(description="the planned event (reservation)")
    unit: Literal["example", "user"] = Field(
        default="example",
        description="what each ε protects: one example, or one user with all their lines",
    )
