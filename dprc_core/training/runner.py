"""The job runner: one DP fine-tuning job, end to end, usable without the service.

``run_job(spec)`` loads the local model and tokenizer (safetensors, no remote code), optionally
wraps LoRA, tokenizes the JSONL file, plans the privacy (q, steps, δ, σ — see
:mod:`dprc_core.training.plan`), and trains with **real Poisson sampling** at rate q for the
planned steps; a logical batch is split into micro-batches of at most
``max_physical_batch_size`` and noise is added once per logical batch. Every step is recorded
in the privacy ledger as it runs; checkpoints (:mod:`dprc_core.training.checkpoint`) are written
every ``checkpoint_every`` steps, when asked to stop, and at the end. Each step's row goes to
``results.csv`` in ``output_dir`` (:mod:`dprc_core.training.results`); with a
``validation_file`` every checkpoint also scores ``valid_loss`` on it
(:mod:`dprc_core.training.validation`, evaluation only).

Resume: a run whose ``output_dir`` holds a checkpoint continues at the next step with the
saved weights, optimizer, sampler and generator states. Steps after the last checkpoint of a
crashed run were never released; they are replayed with the same randomness. The ledger counts
every step of the released chain exactly once, so a run that completes — resumed or not — ends
with ε equal to the planned ε.

Several processes (``torchrun`` or ``dprc train --nproc-per-node N``, see
:mod:`dprc_core.training.cli`): inside an initialised process group every rank loads the same
model and data, draws the same Poisson batch from the seed rank 0 chose and trains on its part
(:mod:`dprc_core.distributed`); rank 0 alone writes checkpoints and the ledger and reports
progress, and its stop decision is every rank's. Resume restores every rank from rank 0's
checkpoint (the same folder: one host, or a shared file system).
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from dprc_core.accounting import PrivacyEvent, PrivacyLedger
from dprc_core.accounting.event_checks import check_scale_width, recorded_scale_width
from dprc_core.accounting.step_epsilons import StepEpsilons
from dprc_core.clipping import Auto, Clipping, norm_from_method
from dprc_core.distributed import (
    Ranks,
    all_reduce_max_int,
    broadcast_bytes,
    broadcast_flag,
    broadcast_int,
    current_ranks,
)
from dprc_core.engine import PrivacyEngine, StepStats, accounting_envelope_for, layer_methods
from dprc_core.losses import causal_lm_per_sample_loss, sequence_classification_per_sample_loss
from dprc_core.mechanism_names import GAUSSIAN
from dprc_core.noise import NoiseMechanism, SecureStream
from dprc_core.noise.mechanisms import as_noise_mechanism, mechanism_class, noise_from_dict
from dprc_core.noise.secure_stream import new_key
from dprc_core.norm_methods import get_norm_method, method_names
from dprc_core.preference import DEFAULT_BETA, dpo_loss
from dprc_core.seeding import derive_seed, fresh_seed
from dprc_core.sharding import SHARDINGS
from dprc_core.sketches import PER_EXAMPLE_SKETCH, SHARED_SKETCH, check_sketch_mode
from dprc_core.training import checkpoint as ckpt_io
from dprc_core.training import sharded_run, token_store
from dprc_core.training.chat_template import DEFAULT_CHAT_TEMPLATE, own_chat_template
from dprc_core.training.data import (
    DEFAULT_USER_FIELD,
    PREFERENCE_FORMAT,
    TASKS,
    Batches,
    DataError,
)
from dprc_core.training.learnability import warn_if_unlearnable
from dprc_core.training.models import (
    LoraSpec,
    check_max_seq_len,
    load_model,
    load_tokenizer,
    matches_train_only,
)
from dprc_core.training.plan import PRIVACY_UNITS, PrivacyPlan, plan_privacy
from dprc_core.training.reference import (
    WithReference,
    compute_reference,
    kept_reference,
    model_fingerprint,
    preference_metrics,
    start_model_reference,
)
from dprc_core.training.results import ResultsFile
from dprc_core.training.sampling import FixedOrderSampler, PoissonSampler
from dprc_core.training.secure_sampling import SecurePoissonSampler
from dprc_core.training.token_store import TokenStore
from dprc_core.training.user_sampling import (
    DEFAULT_EXAMPLES_PER_USER,
    SecureUserPoissonSampler,
    UserIndex,
    UserPoissonSampler,
    user_micro_batches,
)
from dprc_core.training.validation import (
    ValidationDataError,
    prepare_validation,
    validation_loss,
)

Sampler = (
    PoissonSampler
    | FixedOrderSampler
    | SecurePoissonSampler
    | UserPoissonSampler
    | SecureUserPoissonSampler
)

OPTIMIZERS = ("adam", "sgd")
DPO = "dpo"
METHODS = ("supervised", DPO)


@dataclass
class JobSpec:
    """Everything a job needs; ``from_dict`` validates a YAML/JSON mapping."""

    model: str  # a local model directory (the service resolves allow-listed names to it)
    task: str  # causal_lm | classification
    train_file: str
    output_dir: str
    # a held-out JSONL file of the same format: valid_loss at every checkpoint (validation.py)
    validation_file: str | None = None
    epochs: float = 1.0
    batch_size: float = 32  # expected Poisson batch size
    learning_rate: float = 1e-3
    optimizer: str = "adam"
    max_seq_len: int = 128
    lora: LoraSpec | None = None
    target_epsilon: float | None = 8.0
    target_delta: float | None = None  # default 1/N^1.1 rounded down
    noise_multiplier: float | None = None  # when given, used as is instead of calibrating
    max_grad_norm: float = 1.0
    norm_method: str = "hutch"  # exact | fgc | ghost | hutch | hutchpp | auto (the registry)
    k: int = 32
    # randomized clipping's projections: "per_example" (independent per example, hidden-scale
    # accounting; dprc_core/sketches.py) or "shared" by the batch (revealed-scale accounting);
    # None: per_example for a randomized norm method, or what a resumed checkpoint drew
    sketch: str | None = None
    # per-example sketches: the hidden-scale law's bin width the plan is calibrated and
    # accounted on (docs/accounting.md §10); None: the current law (1 %), or on a resume the
    # checkpoint's (0.1 % for a checkpoint written before the law was recorded). A service's
    # worker passes the law the job was charged on.
    scale_width: float | None = None
    checkpoint_every: int | None = None
    seed: int | None = None
    max_physical_batch_size: int = 16
    device: str = "auto"
    dtype: str = "float32"
    report_train_loss: bool = True
    # secure mode: Gaussian noise and Poisson batches from a ChaCha20 stream keyed from the OS
    # (docs/engine.md, "Secure mode"); the seed then drives only the sketches' projections
    secure_rng: bool = False
    # no longer used: the live ε is the exact ε of the steps that ran at every step (an ε
    # curve of the plan, TrainingRun.live_epsilon); accepted, and checked, for compatibility
    epsilon_every: int = 10
    classes: list[str] | None = None  # classification: class names (default: from the file)
    # where the tokenized data is kept and reused (token_store.py); None: $DPRC_TOKEN_STORE or
    # ~/.cache/dprc/tokens
    token_store: str | None = None
    # train only the parameters whose names contain one of these strings (e.g. ["classifier"]
    # for a DP linear probe); None: every parameter (or the LoRA adapters when lora is set)
    train_only: list[str] | None = None
    # the noise mechanism: an object (Gaussian(), NuDPFTRL(nu=..., bands=...)) or its JSON
    # (to_dict); its σ, if set, is the spec's noise_multiplier. A YAML file may name it flat
    # instead: noise_mechanism (a registered name) with that mechanism's own fields (nu,
    # bands). After construction ``noise`` holds the object (without σ) and the flat fields
    # repeat it.
    noise: NoiseMechanism | dict[str, Any] | None = None
    noise_mechanism: str | None = None  # flat spelling: gaussian | nu_dpftrl
    nu: float | None = None  # flat spelling: nu_dpftrl's damping
    bands: int | None = None  # flat spelling: nu_dpftrl's banding (None: un-banded)
    # the privacy unit (docs/privacy_unit.md): "example" (a line), or "user": every line names
    # its user in ``user_field``; users are Poisson-sampled, each contributes at most
    # ``max_examples_per_user`` lines a step (None: the default below, at most the micro-batch)
    # and the user's summed gradient is clipped; batch_size is then the expected users a step
    privacy_unit: str = "example"
    user_field: str = DEFAULT_USER_FIELD
    max_examples_per_user: int | None = None
    # "fsdp": with several ranks, every decoder block and the root are fully_shard-ed (FSDP2):
    # each rank holds 1/W of the parameters, gradients and optimizer state (docs/training.md,
    # "Sharded models"); "none": every rank holds the whole model (data-parallel)
    sharding: str = "none"
    # the clipping object (Clipping(C, norm)) or its JSON (to_dict): sets max_grad_norm,
    # norm_method, k and sketch (and max_seq_len for Auto), which a YAML file may give flat.
    # A string is the deprecated spelling of norm_method.
    clipping: Clipping | dict[str, Any] | str | None = None
    # what the job optimises: "supervised" (the next-token or class loss of each line) or
    # "dpo" (preference lines, docs/data.md "Preference lines": one pair is one example, its
    # sigmoid DPO loss against the starting model as reference, dprc_core/preference.py)
    method: str = "supervised"
    beta: float | None = None  # dpo: β (None: DEFAULT_BETA)

    def __post_init__(self) -> None:
        if isinstance(self.clipping, str):
            warnings.warn(
                "the job field 'clipping' is deprecated; call it 'norm_method'",
                DeprecationWarning,
                stacklevel=3,
            )
            self.norm_method, self.clipping = self.clipping, None
        elif self.clipping is not None:
            self._take_clipping(self.clipping)
        self._take_noise()
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        self._check_method()
        if self.norm_method not in method_names():
            raise ValueError(
                f"norm_method must be one of {method_names()}, got {self.norm_method!r}"
            )
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.sketch is not None:
            check_sketch_mode(self.sketch, get_norm_method(self.norm_method).randomized)
        if self.scale_width is not None:
            check_scale_width(self.scale_width)
            if self.sketch == SHARED_SKETCH:
                raise ValueError(
                    "scale_width applies to per-example sketches (the hidden-scale model) only"
                )
        for flag in ("secure_rng", "report_train_loss"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be true or false, got {getattr(self, flag)!r}")
        for name in ("max_seq_len", "max_physical_batch_size", "k", "epsilon_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        ce = self.checkpoint_every
        if ce is not None and (isinstance(ce, bool) or not isinstance(ce, int) or ce < 1):
            raise ValueError(f"checkpoint_every must be a positive integer, got {ce!r}")
        lr = self.learning_rate
        if (
            isinstance(lr, bool)
            or not isinstance(lr, (int, float))
            or not (math.isfinite(lr) and lr > 0)
        ):
            raise ValueError(f"learning_rate must be a finite number > 0, got {lr!r}")
        if isinstance(self.lora, dict):
            self.lora = LoraSpec(**self.lora)
        if self.train_only is not None and (
            not isinstance(self.train_only, list)
            or not self.train_only
            or not all(isinstance(x, str) and x for x in self.train_only)
        ):
            raise ValueError("train_only must be a non-empty list of parameter-name parts")
        if self.device not in ("auto", "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        self._check_privacy_unit()
        self._check_sharding()
        # what the mechanism allows of the unit and the sharding (its own rules; the clipping
        # it allows is checked by the plan, once the model's norm methods are resolved)
        self.mechanism.check_options(
            randomized=False,
            sketch=None,
            unit=self.privacy_unit,
            sharding=self.sharding,
            secure=self.secure_rng,
        )

    def _take_clipping(self, clipping: Clipping | dict[str, Any]) -> None:
        """The clipping object's fields as the spec's (one form: the flat fields are its)."""
        obj = clipping if isinstance(clipping, Clipping) else Clipping.from_dict(clipping)
        if (obj.clipped_sum, obj.check_independence) != ("bookkeeping", True):
            raise ValueError(
                "a job spec runs bookkeeping clipped sums with the independence check: "
                f"clipped_sum={obj.clipped_sum!r}, check_independence="
                f"{obj.check_independence!r} cannot be run by the runner"
            )
        self.max_grad_norm, self.norm_method = obj.max_grad_norm, obj.norm_method
        self.k = obj.k if obj.k is not None else self.k
        self.sketch = obj.sketch
        if obj.max_seq_len is not None:
            self.max_seq_len = obj.max_seq_len
        self.clipping = None

    def _take_noise(self) -> None:
        """``noise`` as the object (without σ), from itself or from the flat spelling; the
        flat fields then repeat it. Naming both, differently, is refused."""
        flat_given = any(v is not None for v in (self.noise_mechanism, self.nu, self.bands))
        noise = self.noise
        if isinstance(noise, dict):
            noise = noise_from_dict(noise)
        if noise is None:
            asked = self.noise_mechanism or GAUSSIAN
            # what the mechanism cannot run at all is said before its own fields are checked
            mechanism_class(asked).check_options(
                randomized=False,
                sketch=None,
                unit=self.privacy_unit,
                sharding=self.sharding,
                secure=self.secure_rng,
            )
            noise = as_noise_mechanism(asked, self.nu, self.bands, warn=False)
        elif not isinstance(noise, NoiseMechanism):
            raise ValueError(f"noise must be a noise mechanism or its JSON, got {noise!r}")
        elif flat_given and _set_fields(noise.request_fields()) != _flat_request(self):
            raise ValueError(
                f"noise={noise.request_fields()} and the flat noise_mechanism/nu/bands "
                f"({_flat_request(self)}) disagree: give one of them"
            )
        sigma = noise.noise_multiplier
        if sigma is not None:
            if self.noise_multiplier is not None and self.noise_multiplier != sigma:
                raise ValueError(
                    f"noise_multiplier={self.noise_multiplier} and the mechanism's σ={sigma} "
                    "disagree"
                )
            self.noise_multiplier = sigma
        self.noise = noise.with_sigma(None)  # type: ignore[arg-type]  # σ: the spec's field
        fields = noise.request_fields()
        self.noise_mechanism = fields["mechanism"]
        self.nu, self.bands = fields.get("nu"), fields.get("bands")

    @property
    def mechanism(self) -> NoiseMechanism:
        """The noise mechanism (without σ)."""
        assert isinstance(self.noise, NoiseMechanism)  # made so by __post_init__
        return self.noise

    def _check_method(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.method != DPO:
            if self.beta is not None:
                raise ValueError("beta is DPO's: it applies to method: dpo")
            return
        if self.task != "causal_lm":
            raise ValueError(f"method: dpo trains a causal LM (task: causal_lm), not {self.task}")
        b = self.beta
        if b is None:
            self.beta = DEFAULT_BETA
        elif isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 < b < math.inf:
            raise ValueError(f"beta must be a finite number > 0, got {b!r}")
        else:
            self.beta = float(b)

    def _check_sharding(self) -> None:
        if self.sharding not in SHARDINGS:
            raise ValueError(f"sharding must be one of {SHARDINGS}, got {self.sharding!r}")

    def _check_privacy_unit(self) -> None:
        if self.privacy_unit not in PRIVACY_UNITS:
            raise ValueError(
                f"privacy_unit must be one of {PRIVACY_UNITS}, got {self.privacy_unit!r}"
            )
        m = self.max_examples_per_user
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"max_examples_per_user must be a positive integer, got {m!r}")
        if self.privacy_unit == "example":
            if m is not None:
                raise ValueError("max_examples_per_user applies to privacy_unit: user")
            return
        if not isinstance(self.user_field, str) or not self.user_field:
            raise ValueError(f"user_field must be a field name, got {self.user_field!r}")
        if m is not None and m > self.max_physical_batch_size:
            raise ValueError(
                f"max_examples_per_user={m} is larger than max_physical_batch_size="
                f"{self.max_physical_batch_size}: a user's lines are clipped in one micro-batch"
            )

    @property
    def examples_per_user(self) -> int:
        """m: the most lines a sampled user contributes to a step (user-level DP)."""
        if self.max_examples_per_user is not None:
            return self.max_examples_per_user
        return min(DEFAULT_EXAMPLES_PER_USER, self.max_physical_batch_size)

    def mechanisms(self, noise_multiplier: float) -> tuple[Clipping, NoiseMechanism]:
        """The engine's clipping and noise objects of this spec, with the planned σ: the one
        mapping from the spec's flat fields (YAML-friendly) to the mechanism objects;
        :func:`mechanism_fields` is its inverse."""
        norm = norm_from_method(
            self.norm_method,
            k=self.k,
            max_seq_len=self.max_seq_len if self.norm_method == Auto.method else None,
            sketch=self.sketch,
        )
        noise = self.mechanism.with_sigma(noise_multiplier).with_secure(self.secure_rng)
        return Clipping(self.max_grad_norm, norm), noise

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON (:meth:`from_dict` reads it back): the noise as its ``to_dict``."""
        data = dataclasses.asdict(self)
        data["noise"] = self.mechanism.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        if not isinstance(data, dict):
            raise ValueError("a job spec must be a mapping")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown job fields: {sorted(unknown)}")
        missing_value = dataclasses.MISSING
        required = {
            f.name
            for f in dataclasses.fields(cls)
            if f.default is missing_value and f.default_factory is missing_value
        }
        missing = required - set(data)
        if missing:
            raise ValueError(f"missing job fields: {sorted(missing)}")
        return cls(**data)


def mechanism_fields(clipping: Clipping, noise: NoiseMechanism) -> dict[str, Any]:
    """The job spec's fields that say ``clipping`` and ``noise`` (σ included): the inverse of
    :meth:`JobSpec.mechanisms`. ``JobSpec(clipping=clipping, noise=noise, ...)`` takes the
    objects themselves; this form is kept for callers that build specs from flat fields."""
    spec_fields: dict[str, Any] = {
        "clipping": clipping,
        "noise": noise,
        "secure_rng": noise.secure,
    }
    probe = JobSpec(model="-", task="causal_lm", train_file="-", output_dir="-", **spec_fields)
    fields: dict[str, Any] = {
        "max_grad_norm": probe.max_grad_norm,
        "norm_method": probe.norm_method,
        "k": probe.k,
        "sketch": probe.sketch,
        "noise": probe.mechanism,
        "noise_multiplier": probe.noise_multiplier,
        "secure_rng": noise.secure,
    }
    if clipping.max_seq_len is not None:
        fields["max_seq_len"] = clipping.max_seq_len
    return fields


def _flat_request(spec: JobSpec) -> dict[str, Any]:
    """What the flat noise fields ask, in ``request_fields`` form (unset fields left out)."""
    asked = mechanism_class(spec.noise_mechanism or GAUSSIAN)
    flat = {"nu": spec.nu, "bands": spec.bands}
    return {"mechanism": asked.name, **{k: v for k, v in flat.items() if v is not None}}


def _set_fields(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


@dataclass
class Progress:
    step: int
    steps: int
    batch_size: int
    loss: float | None  # None when report_train_loss is off (training loss is NOT private)
    clipped_fraction: float | None
    dropped: int
    # ε spent by the `step` steps that ran: an upper bound on their ε, never a value for
    # steps that have not run — the ledger's at checkpoints and at the end, else the plan's ε
    # curve at `step` (TrainingRun.live_epsilon; equal to the ledger's within 5e-4 relative)
    epsilon: float | None
    checkpoint: str | None = None
    valid_loss: float | None = None  # at checkpoints, with a validation file (validation.py)
    # what ``epsilon`` is accounted with: the accountant's envelope family of the norm methods
    # the engine resolved on the model (``auto``: exact when every layer is exact) and the
    # sketch model; a service compares them with what it charged (service.jobs.job_runs)
    envelope: str | None = None
    sketch: str | None = None
    # per-example sketches: the hidden-scale law it is accounted on (None: no hidden scale)
    scale_width: float | None = None
    # the plan's N (examples, or users) and sampling rate q: a service compares them with the
    # plan it charged (worker/execution.py)
    units: int | None = None
    sample_rate: float | None = None
    # method: dpo, at checkpoints with a validation file (reference.preference_metrics): the
    # mean reward margin and the fraction of pairs ranked right; valid_loss is the DPO loss
    valid_reward_margin: float | None = None
    valid_reward_accuracy: float | None = None


@dataclass
class JobResult:
    status: str  # succeeded | stopped
    steps_done: int
    steps: int
    epsilon: float
    delta: float
    plan: PrivacyPlan
    checkpoint: str
    seconds: float
    resumed_from: int = 0
    losses: list[float] = field(default_factory=list)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _ledger(prior: list[PrivacyEvent], current: PrivacyEvent | None) -> PrivacyLedger:
    events = list(prior)
    if current is not None:
        last = events[-1] if events else None
        # the events are frozen dataclasses (dprc_core.accounting.events)
        if (
            last is not None
            and dataclasses.replace(cast(Any, last), steps=current.steps) == current
        ):
            events[-1] = dataclasses.replace(cast(Any, last), steps=last.steps + current.steps)
        else:
            events.append(current)
    return PrivacyLedger(events)


def prepare_data(
    spec: JobSpec, tokenizer: Any, report: Callable[[str], None] | None = None
) -> tuple[TokenStore, list[str] | None]:
    """The training file's tokenized store (built once, reused by later jobs on the same
    content and settings: :mod:`dprc_core.training.token_store`) and its classes."""
    store = token_store.open_or_build(
        spec.train_file,
        tokenizer,
        spec.max_seq_len,
        spec.task,
        spec.classes or None,
        token_store_root(spec),
        report,
        spec.user_field if spec.privacy_unit == "user" else None,
    )
    classes = store.classes if spec.task == "classification" else None
    if classes is not None and len(classes) < 2:
        raise ValueError(f"classification needs at least 2 classes, found {classes}")
    return store, classes


def token_store_root(spec: JobSpec) -> Path:
    return Path(spec.token_store) if spec.token_store else token_store.default_root()


@dataclass(frozen=True)
class JobData:
    """The job's tokenized data: the training set, its classes, the validation set."""

    tokenizer: Any
    train: Batches
    classes: list[str] | None  # classification: the class names, in label order
    validation: Batches | None  # scored at checkpoints (validation.py)
    # user-level DP: each training example's user key, and the examples grouped by user
    user_keys: torch.Tensor | None = None
    users: UserIndex | None = None

    @property
    def units(self) -> int:
        """N of the accountant: the users under user-level DP, else the examples."""
        return self.users.num_users if self.users is not None else len(self.train)


def load_job_data(spec: JobSpec, report: Callable[[str], None] | None = None) -> JobData:
    """The tokenizer, the tokenized training file and the validation file of ``spec``;
    ``report`` receives the data's progress lines (tokenizing, or reusing the store)."""
    check_max_seq_len(spec.model, spec.max_seq_len)  # the API's check at create, again
    tokenizer = load_tokenizer(spec.model)
    train, classes = prepare_data(spec, tokenizer, report)
    validation = prepare_validation(
        spec.validation_file,
        spec.task,
        tokenizer,
        spec.max_seq_len,
        classes,
        token_store_root(spec),
    )
    _check_method_data(spec, train.format, validation)
    if train.format in ("chat", PREFERENCE_FORMAT) and own_chat_template(tokenizer) is None:
        # trained with the default template: the checkpoints' tokenizer carries it, so that a
        # served fine-tune renders prompts as it was trained (docs/data.md, "Chat lines")
        tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
    if spec.privacy_unit != "user":
        return JobData(tokenizer, train, classes, validation)
    keys = train.users()
    return JobData(tokenizer, train, classes, validation, keys, UserIndex.of(keys))


def _check_method_data(spec: JobSpec, fmt: str | None, validation: Batches | None) -> None:
    """Preference lines train with method dpo, and only they do; a validation file of a DPO
    job holds preference lines too."""
    dpo = spec.method == DPO
    if dpo != (fmt == PREFERENCE_FORMAT):
        raise DataError(
            f"method: dpo trains preference lines (input, preferred_output, "
            f"non_preferred_output); this file holds {fmt} lines"
            if dpo
            else "this file holds preference lines: they train with method: dpo"
        )
    if validation is not None:
        vfmt = getattr(validation, "format", None) or _format_of(validation)
        if dpo != (vfmt == PREFERENCE_FORMAT):
            raise ValidationDataError(
                "validation file: a dpo job's validation file holds preference lines"
                if dpo
                else "validation file: preference lines validate a dpo job only"
            )


def _format_of(data: Batches) -> str | None:
    rows = getattr(data, "rows_per_example", 1)
    return PREFERENCE_FORMAT if rows == 2 else None


def prepare_data_stores(spec: JobSpec, report: Callable[[str], None] | None = None) -> JobData:
    """Build (or verify) the job's tokenized stores before its ranks start, so that they open
    a finished store instead of taking turns to build it; returns the data as loaded."""
    return load_job_data(spec, report)


def run_job(
    spec: JobSpec,
    on_progress: Callable[[Progress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    resume: bool = True,
    on_event: Callable[[str], None] | None = None,
    on_data: Callable[[JobData], None] | None = None,
) -> JobResult:
    """Run (or resume) a job; returns when it finishes or ``should_stop()`` turns true.

    Phases: start the run (data, model, plan, engine and sampler, restored from the last
    checkpoint when resuming: :func:`start_run`); train the remaining steps; finish (the final
    checkpoint and the result). ``on_event`` receives the lines for the job's event list: the
    data's progress (tokenizing into the store, or reusing it) and, on a fresh run, the
    :class:`~dprc_core.training.learnability.LearnabilityWarning` (also emitted as a warning).
    ``on_data`` receives the job's data once loaded, before the model (a check of the data that
    raises ends the job before its first step)."""
    started = time.perf_counter()
    run = start_run(spec, resume, on_event, on_data)
    recording = _results_recording(run, on_progress)
    try:
        status = run.train(recording, should_stop)
    finally:
        run.engine.detach()
    return run.finish(status, started)


def start_run(
    spec: JobSpec,
    resume: bool = True,
    on_event: Callable[[str], None] | None = None,
    on_data: Callable[[JobData], None] | None = None,
) -> TrainingRun:
    """The job's run, ready for its next step: data, model and plan; the engine, optimizer and
    sampler, with their state as the last checkpoint of ``output_dir`` holds it when resuming."""
    ranks = current_ranks()
    out = Path(spec.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = _rank_device(_device(spec.device), ranks)
    data = load_job_data(spec, on_event)
    if on_data is not None:
        on_data(data)
    latest = ckpt_io.latest_checkpoint(out) if resume else None
    resumed = ckpt_io.read_resume(latest) if latest is not None else None
    seed, root = _shared_randomness(spec, ranks)
    model = _load_model(spec, data.classes, latest, data.train, device, seed)
    if spec.sharding == "fsdp":  # each rank keeps 1/W of the model (sharded_run.py)
        model = sharded_run.shard_model(model, ranks, device)
    if spec.method == DPO:  # before the engine: its hooks record nothing here either
        data = _with_reference(spec, data, model, resumed is not None, device, ranks)
    spec = _spec_as_checkpointed(spec, resumed)
    plan, clipping = _plan(spec, model, data.units)
    plan = _resumable_plan(spec, plan, resumed, latest, model, data.units, on_event)
    if ranks.is_main and resumed is None:  # a plan unlikely to learn (learnability.py): say so
        verdict = warn_if_unlearnable(
            plan, spec.learning_rate, adaptive=spec.optimizer == "adam", batch_setting="batch_size"
        )
        if verdict is not None and not verdict.ok and on_event is not None:
            on_event("Warning: " + verdict.message("batch_size"))
    engine, opt = _build_engine(spec, model, plan, seed, root)
    assert engine.accounting_envelope == clipping
    assert engine.accounting_sketch == plan.sketch
    sampler = _build_sampler(spec, plan, len(data.train), seed, ranks, root, data.users)
    if resumed is not None:
        _restore(spec, _rank_resume(spec, resumed, latest, ranks), engine, opt, sampler)
    done = resumed.steps_done if resumed is not None else 0
    return TrainingRun(
        spec=spec,
        plan=plan,
        clipping=clipping,
        data=data,
        out=out,
        device=device,
        ranks=ranks,
        model=model,
        engine=engine,
        optimizer=opt,
        sampler=sampler,
        prior=_prior_events(resumed),
        resumed_from=done,
        done=done,
        last_checkpoint=latest,
    )


def _with_reference(
    spec: JobSpec,
    data: JobData,
    model: torch.nn.Module,
    resumed: bool,
    device: torch.device,
    ranks: Ranks,
) -> JobData:
    """The job's pairs (training and validation) with their reference log-probabilities
    (:mod:`dprc_core.training.reference`): kept in the store, or computed from the starting
    model — the model about to train on a fresh run, adapters disabled for LoRA, or loaded
    again for a resumed full fine-tune."""
    size = spec.max_physical_batch_size
    fingerprint = model_fingerprint(spec.model, spec.dtype, device)

    def start_model() -> torch.nn.Module:
        return load_model(spec.model, spec.task, dtype=spec.dtype).to(device)

    def reference(batches: Batches) -> torch.Tensor:
        def compute() -> torch.Tensor:
            if resumed and spec.lora is None:
                return start_model_reference(start_model, batches, size)
            return compute_reference(model, batches, size)

        return kept_reference(batches, compute, fingerprint, ranks)

    train = WithReference(data.train, reference(data.train))
    valid = None
    if data.validation is not None:
        valid = WithReference(data.validation, reference(data.validation))
    if spec.sharding == "fsdp":
        sharded_run.reshard(model)  # forward passes only: the root's parameters are gathered
    return dataclasses.replace(data, train=train, validation=valid)


def _written_plan(resumed: ckpt_io.ResumeState) -> dict[str, Any]:
    """The plan a checkpoint was written for, with what older checkpoints did not record: a
    plan written before sketches (or units) were recorded had shared ones (per example), and a
    per-example plan written before its scale law was recorded was calibrated and accounted on
    the legacy law (0.1 %, LEGACY_HIDDEN_SCALE_WIDTH)."""
    written = {"sketch": SHARED_SKETCH, "unit": "example", **resumed.plan}
    written["scale_width"] = recorded_scale_width(written)
    return written


def _spec_as_checkpointed(spec: JobSpec, resumed: ckpt_io.ResumeState | None) -> JobSpec:
    """A spec that leaves ``sketch`` unset resumes as the run began: with the sketch its plan
    recorded (none recorded: shared); one that leaves ``scale_width`` unset keeps the
    checkpoint's hidden-scale law (none recorded: the legacy 0.1 %), so a run is accounted on
    one law from its first step to its last."""
    if resumed is None:
        return spec
    written = _written_plan(resumed)
    if spec.sketch is None:
        spec = dataclasses.replace(spec, sketch=written["sketch"])
    if spec.scale_width is None and spec.sketch == written["sketch"] == PER_EXAMPLE_SKETCH:
        spec = dataclasses.replace(spec, scale_width=written["scale_width"])
    return spec


# What a newer accountant may compute differently for the same job: the ε of a σ (in the last
# digits), hence the σ a target ε calibrates to. Everything else must be as written.
_ACCOUNTED = ("planned_epsilon", "noise_multiplier")


def _resumable_plan(
    spec: JobSpec,
    plan: PrivacyPlan,
    resumed: ckpt_io.ResumeState | None,
    latest: Path | None,
    model: torch.nn.Module,
    n: int,
    on_event: Callable[[str], None] | None = None,
) -> PrivacyPlan:
    """The plan a checkpoint resumes: the one it was written for. Across an accountant upgrade
    the same job may account its σ to a slightly different ε (or calibrate a target to a
    slightly different σ): the run then keeps the checkpoint's σ — the noise it already added
    — with ε recomputed by this accountant, provided that ε still meets the spec's target;
    any other difference is refused. Keeping a σ other than the spec's (named, or calibrated
    now) is said in a ``Warning:`` line to ``on_event`` (a service job's events; `dprc
    train` prints it, even with --quiet)."""
    if resumed is None:
        return plan
    # with what older checkpoints did not record (their sketch, unit and scale law)
    written = _written_plan(resumed)
    now = plan.to_dict()
    if written == now:
        return plan

    def inputs(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if k not in _ACCOUNTED}

    kept = plan
    if inputs(written) == inputs(now) and written["noise_multiplier"] != plan.noise_multiplier:
        sigma = float(written["noise_multiplier"])
        kept, _ = _plan(dataclasses.replace(spec, noise_multiplier=sigma), model, n)
        kept = dataclasses.replace(kept, target_epsilon=plan.target_epsilon)
    target = plan.target_epsilon
    fits = target is None or kept.planned_epsilon <= target
    if inputs(written) == inputs(kept.to_dict()) and fits:
        if on_event is not None and kept.noise_multiplier != plan.noise_multiplier:
            on_event(_sigma_kept_message(spec, plan, kept, resumed.steps_done))
        return kept
    raise ValueError(
        f"the checkpoint {latest} was written for another plan ({resumed.plan}); "
        f"this spec plans {now}. Use a fresh output_dir"
    )


def _sigma_kept_message(spec: JobSpec, plan: PrivacyPlan, kept: PrivacyPlan, step: int) -> str:
    """What a resume that keeps the checkpoint's σ instead of the spec's says."""
    named = (
        f"the spec's noise multiplier {plan.noise_multiplier:.6g}"
        if spec.noise_multiplier is not None
        else f"the noise multiplier {plan.noise_multiplier:.6g} calibrated now for the target "
        f"epsilon {plan.target_epsilon:g}"
    )
    return (
        f"Warning: resuming from the checkpoint at step {step} with its noise multiplier "
        f"{kept.noise_multiplier:.6g}, not {named}: the steps that ran added noise at the "
        f"checkpoint's, so the run keeps it (planned epsilon {kept.planned_epsilon:.6g} at delta "
        f"{kept.delta:g})"
    )


def _shared_randomness(spec: JobSpec, ranks: Ranks) -> tuple[int, SecureStream | None]:
    """The job's seed (the spec's, else fresh; rank 0's on every rank) and, in secure mode, the
    root stream of rank 0's OS key, shared by the ranks."""
    seed = broadcast_int(spec.seed if spec.seed is not None else fresh_seed(), ranks)
    root = None
    if spec.secure_rng:
        root = SecureStream(broadcast_bytes(new_key() if ranks.is_main else None, ranks, 32))
    return seed, root


def _rank_resume(
    spec: JobSpec, resumed: ckpt_io.ResumeState, latest: Path | None, ranks: Ranks
) -> ckpt_io.ResumeState:
    """The resume state of this rank: the checkpoint's, or under sharding this rank's own
    engine and optimizer state (written by the same number of ranks)."""
    sharded = spec.sharding == "fsdp"
    if resumed.ranks != (ranks.world_size if sharded else None):
        written = f"sharded over {resumed.ranks} ranks" if resumed.ranks else "unsharded"
        now = f"sharded over {ranks.world_size} ranks" if sharded else "unsharded"
        raise ValueError(
            f"the checkpoint {latest} was written by a run {written}; this run is {now}: "
            "resume with the same sharding and number of ranks"
        )
    if not sharded or ranks.is_main:
        return resumed
    engine, optimizer = ckpt_io.read_rank_state(cast(Path, latest), ranks.rank)
    return dataclasses.replace(resumed, engine=engine, optimizer=optimizer)


def _restore(
    spec: JobSpec,
    resumed: ckpt_io.ResumeState,
    engine: PrivacyEngine,
    opt: torch.optim.Optimizer,
    sampler: Sampler,
) -> None:
    """The optimizer, the engine (generators and noise) and the sampler as checkpointed."""
    if resumed.secure_rng != spec.secure_rng:
        raise ValueError(
            f"the checkpoint was written with secure_rng={not spec.secure_rng}, this "
            f"spec has secure_rng={spec.secure_rng}: resume with the same setting"
        )
    if spec.sharding == "fsdp":
        sharded_run.load_local_optimizer_state(opt, resumed.optimizer)
    else:
        opt.load_state_dict(resumed.optimizer)
    engine.load_state_dict(resumed.engine)
    sampler.load_state_dict(resumed.sampler)


def _prior_events(resumed: ckpt_io.ResumeState | None) -> list[PrivacyEvent]:
    """The events of the released chain up to the checkpoint resumed from (its ledger)."""
    if resumed is None:
        return []
    return list(PrivacyLedger.from_json(resumed.ledger_json).events)


def _results_recording(
    run: TrainingRun, on_progress: Callable[[Progress], None] | None
) -> Callable[[Progress], None] | None:
    """Rank 0 alone writes ``results.csv`` (and reports progress): its recording callback."""
    if not run.ranks.is_main:
        return None
    return _recording(ResultsFile(run.out, run.resumed_from), on_progress)


def _recording(
    results: ResultsFile, on_progress: Callable[[Progress], None] | None
) -> Callable[[Progress], None]:
    """``on_progress`` that first appends the step's row to ``results.csv``."""

    def record(p: Progress) -> None:
        results.append(
            {
                "step": p.step,
                "train_loss": p.loss,
                "valid_loss": p.valid_loss,
                "epsilon": p.epsilon,
                "clipped_fraction": p.clipped_fraction,
                "batch_size": p.batch_size,
                "dropped": p.dropped,
            }
        )
        if on_progress is not None:
            on_progress(p)

    return record


def _load_model(
    spec: JobSpec,
    classes: list[str] | None,
    latest: Path | None,
    data: Batches,
    device: torch.device,
    seed: int = 0,
) -> torch.nn.Module:
    """The model to train: from the last checkpoint when resuming (LoRA: the base model and
    the saved adapter), else fresh; ``train_only`` applied; on ``device``, in train mode."""
    num_labels = len(classes or []) or None
    lora = spec.lora
    if latest is not None and lora is not None:
        model = load_model(
            spec.model,
            spec.task,
            num_labels=num_labels,
            dtype=spec.dtype,
            adapter_path=latest / "model",
        )
    elif latest is not None:
        model = load_model(latest / "model", spec.task, num_labels=num_labels, dtype=spec.dtype)
    else:
        # new weights (LoRA's adapters, a classifier's head) drawn from the job's seed: a
        # seeded run is reproducible and every rank starts from the same weights
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(seed, "init"))
            model = load_model(
                spec.model, spec.task, num_labels=num_labels, lora=lora, dtype=spec.dtype
            )
        if classes is not None:
            config = getattr(model, "config")  # noqa: B009  (a HF model's config: not typed)
            config.id2label = dict(enumerate(classes))
            config.label2id = {c: i for i, c in enumerate(classes)}
    if spec.train_only is not None:
        matched = 0
        for name, p in model.named_parameters():
            keep = matches_train_only(name, spec.train_only)
            p.requires_grad_(keep and p.requires_grad if lora is not None else keep)
            matched += keep
        if not matched:
            raise ValueError(f"train_only={spec.train_only} matches no parameter of the model")
    model.to(device).train()
    config = getattr(model, "config")  # noqa: B009  (a HF model's config: not typed)
    if spec.task == "classification" and getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = data.pad_id
    return model


def _plan(spec: JobSpec, model: torch.nn.Module, n: int) -> tuple[PrivacyPlan, str]:
    """The privacy plan, accounted for the engine's resolved norm plan (its clipping family)."""
    plan_methods = layer_methods(model, spec.norm_method, spec.k, spec.max_seq_len)
    clipping = accounting_envelope_for(plan_methods)
    # nothing sketched (an auto plan of exact layers): nothing is drawn per example either
    # (None: plan_privacy's default, per-example for randomized clipping)
    sketch = spec.sketch if clipping != "exact" else SHARED_SKETCH
    # the hidden-scale law asked for (None: the current one); none without a hidden scale
    scale_width = spec.scale_width if clipping != "exact" else None
    plan = plan_privacy(
        dataset_size=n,
        batch_size=spec.batch_size,
        epochs=spec.epochs,
        clipping=clipping,
        k=spec.k,
        target_epsilon=None if spec.noise_multiplier is not None else spec.target_epsilon,
        delta=spec.target_delta,
        noise_multiplier_value=spec.noise_multiplier,
        mechanism=spec.mechanism,
        sketch=sketch,
        unit=spec.privacy_unit,
        sharding=spec.sharding,
        secure=spec.secure_rng,
        scale_width=scale_width,
    )
    return plan, clipping


def _build_engine(
    spec: JobSpec,
    model: torch.nn.Module,
    plan: PrivacyPlan,
    seed: int,
    root: SecureStream | None = None,
) -> tuple[PrivacyEngine, torch.optim.Optimizer]:
    params = [p for p in model.parameters() if p.requires_grad]
    opt: torch.optim.Optimizer
    if spec.optimizer == "adam":
        opt = torch.optim.Adam(params, lr=spec.learning_rate)
    else:
        opt = torch.optim.SGD(params, lr=spec.learning_rate)
    clipping, noise = spec.mechanisms(plan.noise_multiplier)
    engine = PrivacyEngine(
        model,
        opt,
        clipping=clipping,
        noise=noise,
        expected_batch_size=plan.batch_size,
        seed=seed,
        secure_stream=root,
    )
    return engine, opt


def _rank_device(device: torch.device, ranks: Ranks) -> torch.device:
    """One CUDA device per rank: the one the process group's rank was bound to."""
    if ranks.distributed and device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _build_sampler(
    spec: JobSpec,
    plan: PrivacyPlan,
    n: int,
    seed: int,
    ranks: Ranks | None = None,
    root: SecureStream | None = None,
    users: UserIndex | None = None,
) -> Sampler:
    """Poisson batches at the planned rate (or ν-DP-FTRL's fixed order; or Poisson-sampled
    users), from their own seed; with several ranks each takes its part of the same logical
    batch."""
    sampler_seed = derive_seed(seed, "sampler")
    if users is not None and root is not None:
        m = spec.examples_per_user
        return SecureUserPoissonSampler(
            users, plan.sample_rate, plan.steps, m, sampler_seed, ranks, stream=root
        )
    if users is not None:
        return UserPoissonSampler(
            users, plan.sample_rate, plan.steps, spec.examples_per_user, sampler_seed, ranks
        )
    if plan.noise.sampling == "fixed_order":
        return FixedOrderSampler(
            n, int(spec.batch_size), steps=plan.steps, seed=sampler_seed, ranks=ranks
        )
    if root is not None:
        return SecurePoissonSampler(n, plan.sample_rate, plan.steps, stream=root, ranks=ranks)
    return PoissonSampler(n, plan.sample_rate, plan.steps, seed=sampler_seed, ranks=ranks)


@dataclass
class TrainingRun:
    """A job's run: what it trains with, built whole by :func:`start_run`, and the counters
    that evolve as it runs (steps done, losses, the last checkpoint). The ledger of the released
    chain is ``prior`` (the checkpoint's, up to ``resumed_from``) and the plan's steps since."""

    spec: JobSpec
    plan: PrivacyPlan
    clipping: str  # the accountant's family the plan is accounted for
    data: JobData
    out: Path  # the output folder: checkpoints/, results.csv
    device: torch.device
    ranks: Ranks
    model: torch.nn.Module
    engine: PrivacyEngine
    optimizer: torch.optim.Optimizer
    sampler: Sampler  # on resume it already holds the state after `resumed_from` draws
    prior: list[PrivacyEvent] = field(default_factory=list)
    resumed_from: int = 0
    # evolving as the run goes
    done: int = 0
    last_checkpoint: Path | None = None
    losses: list[float] = field(default_factory=list)
    _epsilons: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    _curve: StepEpsilons | None = field(default=None, init=False, repr=False)
    _shown: float = field(default=0.0, init=False, repr=False)  # the last live ε reported

    # -- the ledger and epsilon
    def ledger_at(self, steps: int) -> PrivacyLedger:
        if self.plan.noise.whole_run_event:
            # one mechanism over the run (ν-DP-FTRL's matrix): the released chain is its
            # first `steps` steps, not the checkpoint's events and a segment composed
            return PrivacyLedger([self.plan.event(steps)] if steps else [])
        seg = steps - self.resumed_from
        return _ledger(self.prior, self.plan.event(seg) if seg else None)

    def epsilon_at(self, steps: int) -> float:  # the accountant takes ~0.1–0.5 s: once per count
        if steps not in self._epsilons:
            self._epsilons[steps] = self.ledger_at(steps).epsilon(self.plan.delta)
        return self._epsilons[steps]

    def step_epsilons(self) -> StepEpsilons:
        """ε of the ledger after each step of this run
        (:mod:`dprc_core.accounting.step_epsilons`), built at the first call: the plan's
        one-step PLD on the ledger's grid for the run's last step, composed with the
        checkpoint's events when the run resumed from some that are not the plan's first steps
        (a departure from the plan, re-accounted once here). Its ``epsilon(n)`` is ε of
        ``ledger_at(resumed_from + n)`` (whole-run events: of ``ledger_at(n)``)."""
        if self._curve is None:
            plan = self.plan
            if plan.noise.whole_run_event:  # the chain's first t steps (ledger_at)
                self._curve = StepEpsilons(plan.event(1), plan.steps, plan.delta)
            else:
                remaining = plan.steps - self.resumed_from
                self._curve = StepEpsilons(plan.event(1), remaining, plan.delta, self.prior)
        return self._curve

    def live_epsilon(self, exact: bool = False) -> float:
        """ε spent by the ``done`` steps that ran, for the progress: the ledger's value when
        ``exact`` (checkpoints and the end: the checkpoint's own ε, computed for its
        metadata), else the ε curve's at ``done`` — an upper bound on the ε of exactly those
        steps, equal to the ledger's within the curve's tolerance, at the cost of one
        self-composition (no accountant call), never below the last value reported (so the
        reported ε never decreases; the larger of an upper bound and anything is still one)."""
        if exact:
            value = self.epsilon_at(self.done)
        else:
            curve = self.step_epsilons()
            n = self.done if self.plan.noise.whole_run_event else self.done - self.resumed_from
            value = max(curve.epsilon(n), self._shown)
        self._shown = value
        return value

    @property
    def sharded(self) -> bool:
        """Whether the ranks shard the model (``sharding: fsdp``: sharded_run.py)."""
        return self.spec.sharding == "fsdp"

    # -- checkpoints
    def save(self) -> Path:
        """Write the checkpoint of the steps done (rank 0; every rank calls it): the engine's
        and the sampler's state dicts whole in its private resume state. Sharded: every rank
        joins the gathering of the whole model and writes its own private state."""
        if not self.sharded:
            if not self.ranks.is_main:
                return ckpt_io.checkpoint_dir(self.out, self.done)
            return ckpt_io.write_checkpoint(
                self.out,
                model=self.model,
                tokenizer=self.data.tokenizer,
                metadata=self._metadata(),
                resume=self._resume_state(self.optimizer.state_dict()),
            )
        whole = sharded_run.whole_model_state(self.model)  # a collective: rank 0 gets it
        optimizer = sharded_run.local_optimizer_state(self.optimizer.state_dict())
        if self.ranks.is_main:
            ckpt_io.begin_checkpoint(self.out, self.done)
        sharded_run.barrier(self.ranks)
        if not self.ranks.is_main:
            engine = self.engine.state_dict()
            ckpt_io.write_rank_state(self.out, self.done, self.ranks.rank, engine, optimizer)
        sharded_run.barrier(self.ranks)
        if not self.ranks.is_main:
            return ckpt_io.checkpoint_dir(self.out, self.done)
        return ckpt_io.finish_checkpoint(
            self.out,
            model=self.model,
            tokenizer=self.data.tokenizer,
            metadata=self._metadata(),
            resume=self._resume_state(optimizer),
            model_state=whole,
        )

    def _resume_state(self, optimizer: dict[str, Any]) -> ckpt_io.ResumeState:
        return ckpt_io.ResumeState(
            steps_done=self.done,
            plan=self.plan.to_dict(),
            secure_rng=self.spec.secure_rng,
            engine=self.engine.state_dict(),
            sampler=self.sampler.state_dict(),
            optimizer=optimizer,
            ledger_json=self.ledger_at(self.done).to_json(),
            ranks=self.ranks.world_size if self.sharded else None,
        )

    def _metadata(self) -> dict[str, Any]:
        """The checkpoint's released summary (``metadata.json``)."""
        plan, done = self.plan, self.done
        return {
            "step": done,
            "steps": plan.steps,
            "epsilon": self.epsilon_at(done),
            "delta": plan.delta,
            "task": self.spec.task,
            "classes": self.data.classes,
            "lora": self.spec.lora is not None,
            "noise_multiplier": plan.noise_multiplier,
            "clipping": self.clipping,
            "k": plan.k,
            "sketch": plan.sketch,
            "sample_rate": plan.sample_rate,
            "privacy_unit": plan.unit,  # ε per example, or per user (docs/privacy_unit.md)
            "units": plan.dataset_size,  # N of the accountant: examples, or users
            "noise_mechanism": plan.mechanism,
            "nu": plan.nu,
            "bands": plan.bands,
            "method": self.spec.method,
            "beta": self.spec.beta,
        }

    # -- the steps
    def train(
        self,
        on_progress: Callable[[Progress], None] | None,
        should_stop: Callable[[], bool] | None,
    ) -> str:
        """Run the remaining steps; "succeeded", or "stopped" when ``should_stop()`` turned
        true (after a checkpoint)."""
        loss_fn: Callable[..., torch.Tensor] = (
            causal_lm_per_sample_loss
            if self.spec.task == "causal_lm"
            else sequence_classification_per_sample_loss
        )
        if self.spec.method == DPO:
            assert self.spec.beta is not None  # set by JobSpec
            loss_fn = dpo_loss(self.spec.beta)
        samples = iter(self.sampler)
        while self.done < self.plan.steps:
            stats = self._step(next(samples), loss_fn)
            stop = should_stop is not None and should_stop()
            stop = broadcast_flag(stop, self.ranks)  # rank 0's decision, on every rank
            self._checkpoint_and_report(stats, stop, on_progress)
            if stop and self.done < self.plan.steps:
                return "stopped"
        return "succeeded"

    def _step(self, idx: torch.Tensor, loss_fn: Callable[..., torch.Tensor]) -> StepStats:
        """One logical batch, in micro-batches of at most ``max_physical_batch_size`` (under
        user-level DP cut between users: each user's lines are clipped together)."""
        size = self.spec.max_physical_batch_size
        keys = self.data.user_keys
        if keys is None:
            chunks = [c for c in idx.split(size) if len(c)]
        else:
            chunks = [c for c in user_micro_batches(idx, keys[idx], size) if len(c)]
        # sharded: as many passes as the rank with the most, agreed before the first
        most = all_reduce_max_int(len(chunks), self.ranks) if self.sharded else len(chunks)
        for chunk in chunks:
            batch = {k: v.to(self.device) for k, v in self.data.train.batch(chunk).items()}
            if keys is None:
                self.engine.accumulate(loss_fn, batch, example_ids=chunk)  # sketch keys
            else:
                self.engine.accumulate(loss_fn, batch, user_ids=keys[chunk])
        for _ in range(most - len(chunks)):
            self.engine.pad(loss_fn, self._padding())
        stats = self.engine.step()
        self.done += 1
        if stats.batch_size - stats.dropped > 0 and math.isfinite(stats.mean_loss):
            self.losses.append(stats.mean_loss)
        return stats

    def _padding(self) -> dict[str, torch.Tensor]:
        """A sharded rank's padding micro-batch: the data set's first rows (discarded)."""
        rows = torch.arange(min(2, len(self.data.train)))
        return {k: v.to(self.device) for k, v in self.data.train.batch(rows).items()}

    def _checkpoint_and_report(
        self, stats: StepStats, stop: bool, on_progress: Callable[[Progress], None] | None
    ) -> None:
        """After a step, on every rank: the checkpoint when due, at the end or on stop (rank 0
        writes; sharded, every rank joins); rank 0 reports the progress."""
        every = self.spec.checkpoint_every
        due = every is not None and self.done % every == 0
        saved = None
        valid: dict[str, float] | None = None
        if due or self.done == self.plan.steps or stop:
            self.last_checkpoint = self.save()
            saved = str(self.last_checkpoint)
            if self.ranks.is_main or self.sharded:  # a sharded forward is a collective
                valid = self._valid_loss()
        if self.ranks.is_main and on_progress is not None:
            on_progress(self._progress(stats, saved, valid))

    def _progress(
        self, stats: StepStats, saved: str | None, valid: dict[str, float] | None
    ) -> Progress:
        report = self.spec.report_train_loss
        valid = valid or {}
        return Progress(
            step=self.done,
            steps=self.plan.steps,
            batch_size=stats.batch_size,
            loss=stats.mean_loss if report else None,
            clipped_fraction=stats.clipped_fraction if report else None,
            dropped=stats.dropped,
            epsilon=self.live_epsilon(exact=saved is not None),
            checkpoint=saved,
            valid_loss=valid.get("valid_loss"),
            valid_reward_margin=valid.get("valid_reward_margin"),
            valid_reward_accuracy=valid.get("valid_reward_accuracy"),
            envelope=self.clipping,
            sketch=self.plan.sketch,
            scale_width=self.plan.scale_width,
            units=self.plan.dataset_size,
            sample_rate=self.plan.sample_rate,
        )

    def _valid_loss(self) -> dict[str, float] | None:
        """The checkpoint's validation metrics: valid_loss, and for DPO the reward margin
        and accuracy (not private with respect to the validation file)."""
        validation = self.data.validation
        if validation is None:
            return None
        size = self.spec.max_physical_batch_size
        if isinstance(validation, WithReference):
            assert self.spec.beta is not None
            return preference_metrics(self.model, validation, self.spec.beta, size)
        return {"valid_loss": validation_loss(self.model, validation, self.spec.task, size)}

    # -- the end
    def finish(self, status: str, started: float) -> JobResult:
        """The job's result; the final checkpoint first if none was written (rank 0)."""
        if self.last_checkpoint is None:  # zero steps: steps >= 1
            self.last_checkpoint = self.save()
        return JobResult(
            status=status,
            steps_done=self.done,
            steps=self.plan.steps,
            epsilon=self.epsilon_at(self.done),
            delta=self.plan.delta,
            plan=self.plan,
            checkpoint=str(self.last_checkpoint),
            seconds=time.perf_counter() - started,
            resumed_from=self.resumed_from,
            losses=self.losses if self.spec.report_train_loss else [],
        )


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: Batches, task: str, batch_size: int = 32) -> float:
    """Held-out accuracy (classification) or mean per-example loss (causal LM)."""
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for start in range(0, len(data), batch_size):
        idx = list(range(start, min(start + batch_size, len(data))))
        batch = {k: v.to(device) for k, v in data.batch(idx).items()}
        if task == "classification":
            logits = model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            ).logits
            total += float((logits.argmax(-1) == batch["labels"]).sum())
        else:
            total += float(causal_lm_per_sample_loss(model, batch).sum())
        count += len(idx)
    return total / max(count, 1)
