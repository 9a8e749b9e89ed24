"""Fenced database writes: the database refuses a write carrying an older fencing token.

A model keeps, per row, the fencing token of the last write it accepted
(:class:`FencingTokenField`). ``fenced_update(token=..., **fields)`` on a
:class:`FencedQuerySet` is one conditional ``UPDATE ... SET ..., fence = token
WHERE ... AND fence <= token``: a holder that lost its lock while paused, and whose
successor already wrote with a larger token, changes nothing and gets
:class:`~django_redislock.exceptions.StaleFencingToken`. Equal tokens are accepted, so
one hold may write a row several times. It works on every database Django supports
(one standard statement, no locking clause).

For a queryset of several rows the statement and a check that no matched row kept a
larger token run in one transaction (a savepoint inside an outer one): either every
row is written, or none is.
"""

from __future__ import annotations

from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import models, transaction

from django_redislock.engine.fenced import validate_token
from django_redislock.exceptions import StaleFencingToken

_M = TypeVar("_M", bound=models.Model)


class FencingTokenField(models.BigIntegerField):  # type: ignore[type-arg]
    """The fencing token of the last write a row accepted (0: none yet).

    Tokens are around 1.8 × 10¹⁵ and need 64 bits. Give a model exactly one, and a
    :class:`FencedQuerySet` manager (``objects = FencedManager()``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("default", 0)
        kwargs.setdefault("editable", False)
        kwargs.setdefault("help_text", "The fencing token of the last write this row accepted.")
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        """As a BigIntegerField, minus the defaults this field sets itself."""
        name, path, args, kwargs = super().deconstruct()
        if kwargs.get("default") == 0:
            del kwargs["default"]
        if kwargs.get("editable") is False:
            del kwargs["editable"]
        kwargs.pop("help_text", None)
        return name, path, args, kwargs


def fencing_field(model: type[models.Model]) -> str:
    """The name of *model*'s one :class:`FencingTokenField` (ImproperlyConfigured else)."""
    found = [f.name for f in model._meta.concrete_fields if isinstance(f, FencingTokenField)]
    if len(found) != 1:
        has = f"has {len(found)} ({', '.join(found)})" if found else "has none"
        raise ImproperlyConfigured(
            f"{model._meta.label}: fenced_update() needs exactly one FencingTokenField on "
            f"the model to keep the last accepted token per row; it {has}"
        )
    return found[0]


class FencedQuerySet(models.QuerySet[_M]):
    """A QuerySet whose :meth:`fenced_update` the database refuses for a stale token."""

    def fenced_update(self, *, token: int | None, **fields: Any) -> int:
        """``update(**fields)`` only if no matched row accepted a larger token than
        *token*; the rows then remember *token*. Returns how many rows were written
        (0 when the queryset matches none). Raises
        :class:`~django_redislock.exceptions.StaleFencingToken` and changes nothing when
        a matched row accepted a newer token."""
        token = validate_token(token)
        fence = fencing_field(self.model)
        if fence in fields:
            raise ValueError(
                f"fenced_update() sets {fence!r} itself (to the token); leave it out of the fields"
            )
        with transaction.atomic(using=self.db):
            written = self.filter(**{f"{fence}__lte": token}).update(**fields, **{fence: token})
            newer = self.filter(**{f"{fence}__gt": token}).aggregate(
                newest=models.Max(fence), rows=models.Count("pk")
            )
            if newer["rows"]:
                # Raising rolls the block back: the rows written above are restored.
                raise StaleFencingToken(
                    f"{self.model._meta.label}: write with fencing token {token} refused: "
                    f"{newer['rows']} matched row(s) accepted a newer token "
                    f"({newer['newest']}) from a later holder of the lock",
                    token=token,
                    current=newer["newest"],
                    target=self.model._meta.db_table,
                )
        return int(written)

    async def afenced_update(self, *, token: int | None, **fields: Any) -> int:
        """:meth:`fenced_update` for asyncio (in a thread, like Django's ``aupdate``)."""
        return int(await sync_to_async(self.fenced_update)(token=token, **fields))


class FencedManager(models.Manager.from_queryset(FencedQuerySet)):  # type: ignore[misc]
    """A model manager with :meth:`FencedQuerySet.fenced_update`
    (``Invoice.objects.filter(pk=17).fenced_update(token=..., total=...)``)."""
