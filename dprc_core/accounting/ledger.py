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
from dprc_core.accounting.events import (
    DP_SGD,
    NU_DPFTRL,
    SHARED_SKETCH,
    PrivacyEvent,
    check_delta,
    check_mechanism,
)
from dprc_core.accounting.renamed_keywords import renamed_keyword

LEDGER_FORMAT = "dprc-privacy-ledger"
LEDGER_VERSION = 1


class PrivacyLedger:
    """Records :class:`PrivacyEvent` s and answers ε(δ) for their composition."""

    def __init__(self, events: Iterable[PrivacyEvent] = ()) -> None:
        self._events: list[PrivacyEvent] = []
        for event in events:
            self.record(event)

    @renamed_keyword("clipping", "envelope")
    def record(
        self,
        event: PrivacyEvent | None = None,
        *,
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
        sketch: str = SHARED_SKETCH,
        clipping: str | None = None,
    ) -> PrivacyEvent:
        """Record an event, given either as a :class:`PrivacyEvent` or by its fields.

        ``sketch``: ``"per_example"`` when the engine drew independent per-example projections
        (``engine.accounting_sketch``); the default ``"shared"`` is never accounted with the
        hidden-scale model. ``clipping``: the deprecated name of ``envelope``.

        A ν-DP-FTRL run: ``mechanism="nu_dpftrl"`` with ``nu``, ``participations``,
        ``min_separation`` (and ``bands``); its ``sample_rate`` defaults to 1 (no sampling)."""
        ftrl = (nu, bands, participations, min_separation)
        if event is not None:
            if not isinstance(event, PrivacyEvent):
                raise TypeError(f"expected a PrivacyEvent, got {type(event).__name__}")
            if (
                noise_multiplier is not None
                or sample_rate is not None
                or steps is not None
                or any(v is not None for v in ftrl)
                or sketch != SHARED_SKETCH
            ):
                raise ValueError("pass either an event or its fields, not both")
        else:
            mechanism = check_mechanism(mechanism)  # earlier spellings too
            if mechanism == NU_DPFTRL and sample_rate is None:
                sample_rate = 1.0
            if noise_multiplier is None or sample_rate is None or steps is None:
                raise ValueError("record() needs noise_multiplier, sample_rate and steps")
            event = PrivacyEvent(
                noise_multiplier,
                sample_rate,
                steps,
                envelope,
                k,
                rank,
                mechanism,
                *ftrl,
                sketch=sketch,
            )
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
