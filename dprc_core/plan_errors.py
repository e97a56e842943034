"""The error a privacy plan's rules raise: a ``ValueError`` that names the plan's field it is
about, so that a caller (the service's API, ``dprc train``, the Trainer) can point at its own
spelling of that field without restating the rule. Imports nothing."""

from __future__ import annotations

# The plan's fields an error may name (the service maps each to its API field).
PLAN_FIELDS = (
    "dataset_size",
    "batch_size",
    "epochs",
    "target_epsilon",
    "noise_multiplier",
    "delta",
    "clipping",
    "k",
    "sketch",
    "scale_width",
    "noise",
    "nu",
    "bands",
    "unit",
    "sharding",
    "secure",
)


class PlanError(ValueError):
    """A plan rule refused ``field`` (one of :data:`PLAN_FIELDS`); ``code`` says which kind of
    refusal (``invalid_value`` unless a rule names another, e.g. ``sharding_unsupported``)."""

    def __init__(self, field: str, message: str, code: str = "invalid_value"):
        if field not in PLAN_FIELDS:
            raise ValueError(f"unknown plan field {field!r}")
        super().__init__(message)
        self.field = field
        self.code = code
