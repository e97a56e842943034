"""``PrivacyArguments``: the DP settings of a :class:`~dprc_core.integrations.hf_trainer.DPTrainer`.

A plain dataclass, usable on its own or with ``transformers.HfArgumentParser`` beside
``TrainingArguments`` (``parser = HfArgumentParser((TrainingArguments, PrivacyArguments))``).
Field names follow dp-transformers where they mean the same: ``per_sample_max_grad_norm``,
``target_epsilon`` xor ``noise_multiplier``, ``target_delta`` (default: our rule, 1/N^1.1
rounded down). Importing this module does not import transformers.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

from dprc_core.accounting.event_checks import check_scale_width
from dprc_core.clipping import CLIPPED_SUMS, Clipping, norm_from_method
from dprc_core.mechanism_names import canonical_mechanism
from dprc_core.noise.mechanisms import NoiseMechanism, as_noise_mechanism, mechanism_class
from dprc_core.norm_methods import get_norm_method, method_names
from dprc_core.sketches import check_sketch_mode


def _positive_number(name: str, value: object, *, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:  # type: ignore[arg-type, operator]
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


@dataclass
class PrivacyArguments:
    """How a :class:`DPTrainer` privatises training (docs/training.md, "DPTrainer")."""

    per_sample_max_grad_norm: float = field(
        default=1.0, metadata={"help": "C: each example's gradient is clipped to this L2 norm"}
    )
    target_epsilon: float | None = field(
        default=None,
        metadata={"help": "calibrate the noise multiplier for this ε (xor noise_multiplier)"},
    )
    noise_multiplier: float | None = field(
        default=None, metadata={"help": "σ, used as given (xor target_epsilon)"}
    )
    target_delta: float | None = field(
        default=None, metadata={"help": "δ; default 1/N^1.1 rounded down (always < 1/N)"}
    )
    norm_method: str = field(
        default="hutch",
        metadata={"help": "per-sample norm method: exact | fgc | ghost | hutch | hutchpp | auto"},
    )
    k: int = field(default=32, metadata={"help": "sketch dimension of hutch / hutchpp"})
    sketch: str | None = field(
        default=None,
        metadata={
            "help": "hutch / hutchpp projections: per_example (independent per example; "
            "hidden-scale accounting, a smaller σ) | shared (one per layer per step); "
            "default: per_example for a randomized norm method"
        },
    )
    scale_width: float | None = field(
        default=None,
        metadata={
            "help": "per_example sketches: the hidden-scale law's bin width σ is calibrated "
            "and accounted on (docs/accounting.md §10); default: the current law (0.01). A "
            "checkpoint planned before the law was recorded resumes with 0.001"
        },
    )
    noise_mechanism: str = field(
        default="gaussian",
        metadata={"help": "gaussian (Poisson DP-SGD) | nu_dpftrl (fixed-order, exact norms)"},
    )
    nu: float | None = field(default=None, metadata={"help": "nu_dpftrl: the damping in [0, 1]"})
    bands: int | None = field(default=None, metadata={"help": "nu_dpftrl: banding (None: none)"})
    max_epsilon: float | None = field(
        default=None,
        metadata={"help": "stop training (with a message) before ε spent would exceed this"},
    )
    max_seq_len: int | None = field(
        default=None, metadata={"help": "norm_method=auto: the longest sequence the model sees"}
    )
    clipped_sum: str = field(
        default="bookkeeping",
        metadata={"help": "how the clipped sum is formed: bookkeeping (one backward) | two_pass"},
    )
    clipping_mode: str | None = field(
        default=None, metadata={"help": "deprecated name of clipped_sum"}
    )
    report_train_loss: bool = field(
        default=True,
        metadata={
            "help": "log what is computed on the training data (the loss; DPSFTTrainer also "
            "mean_token_accuracy, entropy, num_tokens). It is NOT covered by DP; False leaves "
            "it out of the logs"
        },
    )
    unit: str = field(
        default="example",
        metadata={
            "help": "the privacy unit: example (a row of the data set) | user (all the rows of "
            "one person: users are sampled and each user's rows clipped together; the "
            "expected batch is then of users; docs/privacy_unit.md)"
        },
    )
    user_field: str = field(
        default="user_id",
        metadata={"help": "unit=user: the train_dataset column naming each row's user"},
    )
    max_examples_per_user: int | None = field(
        default=None,
        metadata={
            "help": "unit=user: the most rows a sampled user contributes to a step (chosen at "
            "random each step); default min(8, per_device_train_batch_size)"
        },
    )
    dp_seed: int | None = field(
        default=None,
        metadata={
            "help": "seed of the noise, projections and Poisson sampling; default: a fresh secret "
            "one (never TrainingArguments.seed: noise from a known seed is no noise)"
        },
    )

    def __post_init__(self) -> None:
        _positive_number(
            "per_sample_max_grad_norm", self.per_sample_max_grad_norm, allow_none=False
        )
        if (self.target_epsilon is None) == (self.noise_multiplier is None):
            raise ValueError(
                "give exactly one of target_epsilon (σ is calibrated for it) and "
                f"noise_multiplier (σ as given); got target_epsilon={self.target_epsilon!r}, "
                f"noise_multiplier={self.noise_multiplier!r}"
            )
        _positive_number("target_epsilon", self.target_epsilon)
        nm = self.noise_multiplier
        if nm is not None and (
            isinstance(nm, bool)
            or not isinstance(nm, (int, float))
            or not math.isfinite(nm)
            or nm < 0
        ):
            raise ValueError(f"noise_multiplier must be a finite number >= 0, got {nm!r}")
        _positive_number("target_delta", self.target_delta)
        _positive_number("max_epsilon", self.max_epsilon)
        if self.norm_method not in method_names():
            raise ValueError(
                f"norm_method must be one of {method_names()}, got {self.norm_method!r}"
            )
        if self.sketch is not None:
            check_sketch_mode(self.sketch, get_norm_method(self.norm_method).randomized)
        if self.scale_width is not None:
            self.scale_width = check_scale_width(self.scale_width)
        self.noise_mechanism = canonical_mechanism(self.noise_mechanism)  # raises if unknown
        for name in ("k", "max_seq_len", "bands"):
            v = getattr(self, name)
            if v is None and name != "k":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.clipping_mode is not None:
            warnings.warn(
                "PrivacyArguments.clipping_mode is deprecated; use clipped_sum",
                DeprecationWarning,
                stacklevel=3,
            )
            if self.clipping_mode not in CLIPPED_SUMS:
                raise ValueError(
                    f"clipping_mode must be 'bookkeeping' or 'two_pass', got {self.clipping_mode!r}"
                )
            self.clipped_sum, self.clipping_mode = self.clipping_mode, None
        if self.clipped_sum not in CLIPPED_SUMS:
            raise ValueError(
                f"clipped_sum must be 'bookkeeping' or 'two_pass', got {self.clipped_sum!r}"
            )
        if not isinstance(self.report_train_loss, bool):
            raise ValueError(f"report_train_loss must be a bool, got {self.report_train_loss!r}")
        s = self.dp_seed
        if s is not None and (isinstance(s, bool) or not isinstance(s, int) or s < 0):
            raise ValueError(f"dp_seed must be a non-negative integer, got {s!r}")
        self._check_unit()

    def _check_unit(self) -> None:
        if self.unit not in ("example", "user"):
            raise ValueError(f"unit must be 'example' or 'user', got {self.unit!r}")
        m = self.max_examples_per_user
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"max_examples_per_user must be a positive integer, got {m!r}")
        if self.unit == "example":
            if m is not None:
                raise ValueError("max_examples_per_user applies to unit='user'")
            return
        if not isinstance(self.user_field, str) or not self.user_field:
            raise ValueError(f"user_field must be a column name, got {self.user_field!r}")
        mechanism_class(self.noise_mechanism).check_options(
            randomized=False, sketch=None, unit=self.unit, sharding="none", secure=False
        )

    def clipping(self) -> Clipping:
        """The engine's :class:`~dprc_core.clipping.Clipping` for these settings."""
        norm = norm_from_method(
            self.norm_method, k=self.k, max_seq_len=self.max_seq_len, sketch=self.sketch
        )
        return Clipping(self.per_sample_max_grad_norm, norm, self.clipped_sum)

    def mechanism(self) -> NoiseMechanism:
        """The noise mechanism these settings name, without σ (its own fields checked)."""
        return as_noise_mechanism(self.noise_mechanism, self.nu, self.bands, warn=False)

    def noise(self, noise_multiplier: float) -> NoiseMechanism:
        """The engine's noise object with σ = ``noise_multiplier`` (the plan's)."""
        return self.mechanism().with_sigma(noise_multiplier)
