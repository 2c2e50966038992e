"""One way to change a row's ``state``: the moves a model allows, a compare-and-swap, an event row.

A model with a lifecycle (a model server, an artifact, a replica, a backup, a restore) inherits
``StatefulModel``, declares ``TRANSITIONS`` (from -> the states it may move to) and its refusal code,
and says how its event row is written (``record_transition``). ``transition()`` then:

1. refuses a move ``TRANSITIONS`` does not allow from the state this instance holds (409, the model's
   own code);
2. writes ``state`` and the given fields in one ``UPDATE ... WHERE pk AND state = <held state>``: zero
   rows means another process moved it first, refused the same way (nothing is overwritten);
3. writes the event row (who, why), then lets the model react (``after_transition``), in the same
   transaction as the move;
4. updates this instance, so the next ``transition()`` starts from the new state.

Nothing else writes ``state`` (apps/core/tests/test_transitions.py greps for it); a set-based sweep that
must move many rows in one statement is listed there with its reason.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any, ClassVar

from django.db import models, transaction
from django.utils import timezone

from modelforge.errors import ApiError


class StatefulModel(models.Model):
    """Abstract base of the models whose ``state`` moves only through ``transition()``."""

    # from -> the states it may move to; a state missing here moves nowhere.
    TRANSITIONS: ClassVar[Mapping[str, Collection[str]]] = {}
    # The refusal's code, the model's own (``INVALID_SERVER_STATE``...).
    INVALID_STATE_CODE: ClassVar[str] = "INVALID_STATE"

    # Each model declares its own (its choices and initial state); this one gives the mechanism a name
    # to filter on.
    state = models.CharField(max_length=16)

    class Meta:
        abstract = True

    def state_subject(self) -> str:
        """How a refusal names this row: ``Server echo``, ``Backup #3``."""
        return f"{str(self._meta.verbose_name).capitalize()} #{self.pk}"

    def transition(self, to: str, *, detail: str = "", by: str = "", **fields: Any) -> None:
        """Move to ``to`` with ``fields`` if allowed from the current state, with a compare-and-swap on
        the state, and leave an event row. Raises ``INVALID_STATE_CODE`` (409) otherwise."""
        held = self.state
        if to not in self.TRANSITIONS.get(held, ()):
            raise ApiError(
                self.INVALID_STATE_CODE, f"{self.state_subject()} is {held}; it cannot become {to}.", 409
            )
        now = timezone.now()
        self.transition_fields(to, now, fields)
        # One transaction: no reader sees the new state without its event row or the model's reaction
        # (a server failed with its reservations still held).
        with transaction.atomic():
            moved = type(self)._base_manager.filter(pk=self.pk, state=held).update(state=to, **fields)
            if not moved:
                current = type(self)._base_manager.filter(pk=self.pk).values_list("state", flat=True).first()
                raise ApiError(
                    self.INVALID_STATE_CODE,
                    f"{self.state_subject()} changed to {current or 'deleted'} meanwhile; "
                    f"it cannot become {to}.",
                    409,
                )
            self.record_transition(held, to, at=now, detail=detail, by=by)
            self.after_transition(held, to)
        self.state = to
        for name, value in fields.items():
            setattr(self, name, value)

    def transition_fields(self, to: str, now: datetime, fields: dict[str, Any]) -> None:
        """Add the fields a move implies (a server's ``running_at``...) to ``fields``, in place."""

    def record_transition(self, before: str, to: str, *, at: datetime, detail: str, by: str) -> None:
        """Write the move's event row."""
        raise NotImplementedError(f"{type(self).__name__} must say how its transitions are recorded")

    def after_transition(self, before: str, to: str) -> None:
        """React to a move already written (a server releases its reservations...)."""
