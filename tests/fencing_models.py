"""A model with a fencing token per row, for the fenced-write tests (tables made by the tests)."""

from __future__ import annotations

from django.db import models

from django_redislock.fencing import FencedManager, FencingTokenField


class Invoice(models.Model):
    """A row written only by the current holder of its lock."""

    total = models.IntegerField(default=0)
    note = models.CharField(max_length=50, default="")
    fence = FencingTokenField()

    objects = FencedManager()

    class Meta:
        app_label = "fencing_tests"


class Unfenced(models.Model):
    """A model without a FencingTokenField (fenced_update refuses it)."""

    total = models.IntegerField(default=0)

    objects = FencedManager()

    class Meta:
        app_label = "fencing_tests"
