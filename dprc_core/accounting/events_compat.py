"""The deprecated flat form of an event (``PrivacyEvent(σ, q, steps, ...)``,
``PrivacyLedger.record(noise_multiplier=..., ...)``): :func:`flat_event`, kept with the event
classes in :mod:`dprc_core.accounting.events` and named here for the callers that import it
from this module."""

from __future__ import annotations

from dprc_core.accounting.events import flat_event

__all__ = ["flat_event"]
