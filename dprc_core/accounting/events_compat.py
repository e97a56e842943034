"""The deprecated flat form of an event: the fields of every event class in one call.

``PrivacyEvent(σ, q, steps, "hutch", 32, sketch=..., mechanism="nu_dpftrl", nu=..., ...)`` and
``PrivacyLedger.record(noise_multiplier=..., ...)`` took the fields of every event class
together and built the event of the mechanism they name. Both are answered here, and only
here, with a ``DeprecationWarning``: build the event's class itself
(:class:`~dprc_core.accounting.events.SubsampledGaussianEvent`,
:class:`~dprc_core.accounting.events.NuDPFTRLEvent`). The fields are read as the event's JSON
object (:meth:`PrivacyEvent.from_dict <dprc_core.accounting.events.PrivacyEvent.from_dict>`),
so the class is found in the registry of event classes and validates them itself.
"""

from __future__ import annotations

import warnings
from typing import Any

from dprc_core.accounting.events import DP_SGD, SHARED_SKETCH, PrivacyEvent
from dprc_core.accounting.renamed_keywords import take_renamed

__all__ = ["flat_event"]


def _fields(
    noise_multiplier: float | None = None,
    sample_rate: float | None = None,
    steps: int | None = None,
    envelope: str = "exact",
    k: int | None = None,
    rank: int | None = None,
    mechanism: str = DP_SGD,
    nu: float | None = None,
    bands: int | None = None,
    participations: int | None = None,
    min_separation: int | None = None,
    sensitivity: float | None = None,
    sketch: str = SHARED_SKETCH,
) -> dict[str, Any]:
    """The flat fields as the event's JSON object (``clipping`` holds the envelope), the
    fields left unset left out."""
    data = {
        "noise_multiplier": noise_multiplier,
        "sample_rate": sample_rate,
        "steps": steps,
        "clipping": envelope,
        "k": k,
        "rank": rank,
        "mechanism": mechanism,
        "nu": nu,
        "bands": bands,
        "participations": participations,
        "min_separation": min_separation,
        "sensitivity": sensitivity,
        "sketch": sketch,
    }
    return {key: value for key, value in data.items() if value is not None}


def flat_event(
    *args: Any, _where: str = "flat_event", _stacklevel: int = 2, **kwargs: Any
) -> PrivacyEvent:
    """Deprecated: the event of the mechanism the flat fields name (``noise_multiplier,
    sample_rate, steps, envelope="exact", k=None, rank=None, mechanism="gaussian", nu=None,
    bands=None, participations=None, min_separation=None, sensitivity=None,
    sketch="shared"``; ``clipping``: the deprecated name of ``envelope``), validated by its
    class. A field the mechanism does not have must be left unset; a ν-DP-FTRL run's
    ``sample_rate`` may be left out (it is 1)."""
    warnings.warn(
        f"{_where}() with the flat fields of every event class is deprecated: build the "
        "event's class (SubsampledGaussianEvent, NuDPFTRLEvent, ...) directly",
        DeprecationWarning,
        stacklevel=_stacklevel,
    )
    if "clipping" in kwargs and len(args) > 3:  # the envelope given by position too
        raise TypeError(f"{_where}() got both 'envelope' and its deprecated name 'clipping'")
    take_renamed(kwargs, "clipping", "envelope", _where, stacklevel=_stacklevel)
    return PrivacyEvent.from_dict(_fields(*args, **kwargs))
