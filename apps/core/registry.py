"""What the apps contribute to the platform's own views of itself, registered at ``AppConfig.ready()``.

``apps.core`` sits below every domain app and knows none of them: the invariants it checks and the cards
on the dashboard's overview are filled in by the apps that own the tables, each from its own
``contributions.register()`` (called in its ``ready()``). Contributions keep their registration order,
which is ``INSTALLED_APPS`` order; an overview card says its place on the page itself.

    registry.invariants.register(Invariant(...))
    registry.overview_cards.register(OverviewCard(...))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar


class Named(Protocol):
    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Named)


class Registry(Generic[T]):
    """Contributions by name, in registration order; a second, different contribution of a name is refused
    (two apps claiming one invariant is a mistake to see at start-up, not a silent overwrite)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, *items: T) -> None:
        for item in items:
            known = self._items.get(item.name)
            if known is not None and known != item:
                raise ValueError(f"{self.kind} {item.name!r} is registered twice")
            self._items[item.name] = item

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._items.values()))

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items


@dataclass(frozen=True)
class Invariant:
    """A property the platform's own state always has; ``query`` counts the rows that break it. It names
    the owning app's tables only (or those of apps below it), never the monitoring store."""

    name: str
    description: str
    query: str


@dataclass(frozen=True)
class OverviewCard:
    """One card on the dashboard's home page: ``template`` is rendered with ``context()`` as ``card``.
    Cards are shown by ``position`` (lower first), before the platform's own cards."""

    name: str
    position: int
    template: str
    context: Callable[[], dict[str, Any]]


invariants: Registry[Invariant] = Registry("invariant")
overview_cards: Registry[OverviewCard] = Registry("overview card")
