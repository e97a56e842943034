"""Privacy ledger: a list of events; ε is always recomputed from them by composing their PLDs.

Heterogeneous events (a job resumed with a new σ, several jobs on one dataset, different
envelopes, mechanisms) are composed into **one** PLD per adjacency direction — never by adding ε's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from dprc_core.accounting.accountant import (
    DEFAULT_SETTINGS,
    AccountingResult,
    AccountingSettings,
    account,
)
from dprc_core.accounting.events import PrivacyEvent, check_delta
from dprc_core.accounting.events_compat import flat_event

LEDGER_FORMAT = "dprc-privacy-ledger"
LEDGER_VERSION = 1


class PrivacyLedger:
    """Records :class:`PrivacyEvent` s and answers ε(δ) for their composition."""

    def __init__(self, events: Iterable[PrivacyEvent] = ()) -> None:
        self._events: list[PrivacyEvent] = []
        for event in events:
            self.record(event)

    def record(self, event: PrivacyEvent | None = None, **fields: Any) -> PrivacyEvent:
        """Record an event (:class:`SubsampledGaussianEvent`, :class:`NuDPFTRLEvent`, …).

        Deprecated: the event given by the flat fields of every event class
        (``record(noise_multiplier=..., sample_rate=..., steps=..., mechanism=..., ...)``,
        :func:`dprc_core.accounting.events_compat.flat_event`)."""
        if event is not None:
            if not isinstance(event, PrivacyEvent):
                raise TypeError(f"expected a PrivacyEvent, got {type(event).__name__}")
            if fields:
                raise ValueError("pass either an event or its fields, not both")
        else:
            event = flat_event(_where="PrivacyLedger.record", _stacklevel=3, **fields)
        self._events.append(event)
        return event

    @property
    def events(self) -> tuple[PrivacyEvent, ...]:
        return tuple(self._events)

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[PrivacyEvent]:
        return iter(self._events)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PrivacyLedger) and self._events == other._events

    def __repr__(self) -> str:
        return f"PrivacyLedger({self._events!r})"

    def account(
        self, delta: float, settings: AccountingSettings = DEFAULT_SETTINGS
    ) -> AccountingResult:
        """ε at ``delta`` for all events composed, with the discretisation used."""
        return account(self._events, check_delta(delta), settings)

    def epsilon(self, delta: float, settings: AccountingSettings = DEFAULT_SETTINGS) -> float:
        """Upper bound on ε at ``delta`` for the composition of every recorded event (0 if
        there are none)."""
        delta = check_delta(delta)
        if not self._events:
            return 0.0
        return self.account(delta, settings).epsilon

    def to_json(self) -> str:
        payload = {
            "format": LEDGER_FORMAT,
            "version": LEDGER_VERSION,
            "events": [e.to_dict() for e in self._events],
        }
        return json.dumps(payload, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> PrivacyLedger:
        """Parse and validate a ledger written by :meth:`to_json`."""
        try:
            payload: Any = json.loads(text)
        except (TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"privacy ledger is not valid JSON: {exc}") from exc
        if not isinstance(payload, dict):
            raise ValueError("privacy ledger must be a JSON object")
        if payload.get("format") != LEDGER_FORMAT:
            raise ValueError(f"not a privacy ledger (format must be {LEDGER_FORMAT!r})")
        if payload.get("version") != LEDGER_VERSION:
            raise ValueError(f"unsupported privacy ledger version {payload.get('version')!r}")
        unknown = set(payload) - {"format", "version", "events"}
        if unknown:
            raise ValueError(f"unknown privacy ledger fields: {sorted(unknown)}")
        events = payload.get("events")
        if not isinstance(events, list):
            raise ValueError("privacy ledger 'events' must be a list")
        parsed = []
        for i, item in enumerate(events):
            try:
                parsed.append(PrivacyEvent.from_dict(item))
            except ValueError as exc:
                raise ValueError(f"privacy ledger event {i}: {exc}") from exc
        return cls(parsed)
