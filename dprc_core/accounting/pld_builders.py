"""Which PLD construction accounts for which event class: one registered builder per class.

A builder turns an event into a :class:`PreparedEvent` for a per-step tail budget, which says
what loss grid it needs (:class:`GridNeeds`) and builds its PLD on a chosen grid. The
accountant's composition (:mod:`dprc_core.accounting.accountant`) and the incremental history
(:mod:`dprc_core.accounting.history`) use nothing else, so a new mechanism is one event class
(:mod:`dprc_core.accounting.events`) and one builder registered with :func:`pld_builder`::

    @pld_builder(MyEvent)
    class MyEventPLD(PLDBuilder[MyEvent]):
        def prepare(self, event, tail, settings): ...

Registering the builder registers the event class under its ``mechanism`` name too: the
registry is the one place :meth:`PrivacyEvent.from_dict` (the ledgers, the service's rows) and
the accountant's command line find an event class by the name it writes
(:func:`event_type_named`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from dprc_core.accounting.events import (
    PrivacyEvent,
    UnsupportedMechanismError,
    register_event_type,
    with_builtin_event_types,
)
from dprc_core.accounting.events import event_type_named as event_type_named  # where it was
from dprc_core.accounting.settings import AccountingSettings

E = TypeVar("E", bound=PrivacyEvent)
B = TypeVar("B", bound="PLDBuilder")


@dataclass(frozen=True)
class GridNeeds:
    """What one event asks of the common loss grid: an interval of at most ``h``, a grid
    spanning one composition's loss range ``step_range`` and the composed range
    ``composed_range`` (:func:`dprc_core.accounting.accountant.choose_grid`)."""

    h: float = math.inf
    step_range: float = 0.0
    composed_range: float = 0.0


class PreparedEvent(Protocol):
    """An event made ready for a tail budget: its grid needs and its PLD on a grid."""

    @property
    def event(self) -> PrivacyEvent: ...

    @property
    def compositions(self) -> int:
        """How many times the PLD of :meth:`pld` is self-composed."""
        ...

    @property
    def scale_bins(self) -> int:
        """Bins of the discretised sensitivity scale (1 for a fixed sensitivity)."""
        ...

    def grid_needs(self, settings: AccountingSettings) -> GridNeeds: ...

    def pld(self, h: float, tail: float) -> PrivacyLossDistribution:
        """The pessimistic PLD of one composition on the loss grid of interval ``h``."""
        ...


class PLDBuilder(Generic[E]):
    """The PLD construction of one event class (subclass it and register with
    :func:`pld_builder`)."""

    # events equal up to their step counts may be accounted as one event with the steps summed
    mergeable_steps: bool = False

    def compositions(self, event: E) -> int:
        """How many mechanisms the event counts as in the tail budget (the self-compositions
        of its PLD)."""
        return event.steps

    def prepare(self, event: E, tail: float, settings: AccountingSettings) -> PreparedEvent:
        """The event ready to be accounted with a per-composition tail budget ``tail``."""
        raise NotImplementedError

    def gaussian_mu(self, event: E) -> float | None:
        """μ when the event is exactly one Gaussian mechanism of sensitivity μ (σ = 1), whose
        compositions the accountant composes analytically; None otherwise."""
        return None


_BUILDERS: dict[type[PrivacyEvent], PLDBuilder] = {}


def pld_builder(event_type: type[E]) -> Callable[[type[B]], type[B]]:
    """Register the decorated :class:`PLDBuilder` subclass as the builder of ``event_type``
    (one per class)."""

    def register(builder: type[B]) -> type[B]:
        if event_type in _BUILDERS:
            raise ValueError(f"{event_type.__name__} already has a PLD builder")
        register_event_type(event_type)
        _BUILDERS[event_type] = builder()
        return builder

    return register


def builder_for(event: PrivacyEvent) -> PLDBuilder:
    """The registered builder of ``event``'s class; ``UnsupportedMechanismError`` if none."""
    registered_event_types()  # the built-in builders registered
    builder = _BUILDERS.get(type(event))
    if builder is None:
        raise UnsupportedMechanismError(
            f"no PLD builder is registered for {type(event).__name__} events"
        )
    return builder


def registered_event_types() -> tuple[type[PrivacyEvent], ...]:
    """The event classes with a registered builder, in the order they were registered."""
    with_builtin_event_types()  # the lazy package may not have imported the built-in builders yet
    return tuple(_BUILDERS)
