"""The settings table: one rule per setting, used by the checks and where the value is read."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.core import checks
from django.test import override_settings

from django_redislock import locks
from django_redislock.checks import check_settings
from django_redislock.conf import DEFAULTS, setting
from django_redislock.settings_spec import SETTINGS, SPECS, suggest_setting

DOCS = Path(__file__).resolve().parent.parent / "docs" / "settings.md"


def _ids(messages: list[checks.CheckMessage]) -> list[str]:
    return [m.id for m in messages]


def test_the_table_is_the_defaults_and_each_default_passes_its_own_rule() -> None:
    assert DEFAULTS == {spec.name: spec.default for spec in SETTINGS}
    for spec in SETTINGS:
        spec.clean(spec.default, spec.name)  # raises if a default broke its rule
    assert check_settings() == []


# (setting, bad value, words the message must contain)
BAD_VALUES = [
    ("REDISLOCK_CACHE", "", "name of a cache"),
    ("REDISLOCK_CACHE", 3, "name of a cache"),
    ("REDISLOCK_URL", "localhost:6379", "must start with redis://"),
    ("REDISLOCK_URL", b"redis://x", "must be a Redis URL"),
    ("REDISLOCK_CLUSTER", "yes", "True or False"),
    ("REDISLOCK_KEY_PREFIX", "", "non-empty"),
    ("REDISLOCK_KEY_PREFIX", "a{b}", "must not contain"),
    ("REDISLOCK_DEFAULT_TTL", -5, "positive number of seconds"),
    ("REDISLOCK_DEFAULT_TTL", "30", "number of seconds"),
    ("REDISLOCK_DEFAULT_TTL", 0.0001, "at least 1 ms"),
    ("REDISLOCK_AUTO_RENEW", "no", "True or False"),
    ("REDISLOCK_RAISE_ON_LOST", 0, "True or False"),
    ("REDISLOCK_WATCHDOG_CEILING", 0, "positive, finite number of renewals a second"),
    ("REDISLOCK_WATCHDOG_CEILING", "25000", "number of renewals a second"),
    ("REDISLOCK_FENCE_RETENTION", float("inf"), "positive number of seconds"),
    ("REDISLOCK_WAIT_REPLICAS", -1, "between 0"),
    ("REDISLOCK_WAIT_REPLICAS", True, "must be an int"),
    ("REDISLOCK_WAIT_TIMEOUT", 0, "positive number of seconds"),
    ("REDISLOCK_REDLOCK_CACHES", "redis://a,redis://b", "must be a list"),
    ("REDISLOCK_REDLOCK_CACHES", ["default", ""], "entries are cache aliases"),
    ("REDISLOCK_REDLOCK_MONOTONIC_FENCING", "true", "True or False"),
    ("REDISLOCK_VIEW_ON_REDIS_ERROR", "fail", "'closed'"),
    ("REDISLOCK_TASK_SKIP_LOG_LEVEL", "LOUD", "one of DEBUG, INFO"),
    ("REDISLOCK_TASK_SKIP_LOG_LEVEL", 99, "0 to 50"),
    ("REDISLOCK_METRICS", "statsd", "unknown metrics exporter 'statsd'"),
    ("REDISLOCK_METRICS", {"prometheus": True}, "must be None, 'prometheus'"),
    ("REDISLOCK_METRICS_GROUPS", "billing:", "list of lock name prefixes"),
    ("REDISLOCK_METRICS_GROUPS", ["billing:", ""], "non-empty lock name prefixes"),
]


@pytest.mark.parametrize(("name", "value", "words"), BAD_VALUES)
def test_a_bad_value_is_e002_in_the_check_and_the_same_error_where_it_is_read(
    name: str, value: Any, words: str
) -> None:
    with override_settings(**{name: value}):
        messages = check_settings()
        assert _ids(messages) == ["django_redislock.E002"]
        assert name in messages[0].msg and words in messages[0].msg
        assert f"Correct {name}" in (messages[0].hint or "")
        with pytest.raises((TypeError, ValueError)) as raised:
            setting(name)
        assert str(raised.value) == messages[0].msg


def test_every_setting_has_bad_values_tested() -> None:
    assert {name for name, _value, _words in BAD_VALUES} == set(SPECS)


def test_a_bad_boolean_setting_is_refused_when_a_lock_is_made() -> None:
    with override_settings(REDISLOCK_AUTO_RENEW="no"):
        with pytest.raises(TypeError, match="REDISLOCK_AUTO_RENEW must be True or False"):
            locks.lock("x")


def test_a_valid_value_is_converted_once_and_follows_override_settings() -> None:
    assert setting("REDISLOCK_DEFAULT_TTL") == 30.0
    with override_settings(REDISLOCK_DEFAULT_TTL=7):
        assert setting("REDISLOCK_DEFAULT_TTL") == 7.0
        assert isinstance(setting("REDISLOCK_DEFAULT_TTL"), float)
        assert locks.lock("x").ttl_seconds == 7
    assert setting("REDISLOCK_DEFAULT_TTL") == 30.0


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("REDISLOCK_KEY_PREFX", "REDISLOCK_KEY_PREFIX"),
        ("REDISLOCK_DEFUALT_TTL", "REDISLOCK_DEFAULT_TTL"),
        ("REDISLOCK_WAIT_REPLICA", "REDISLOCK_WAIT_REPLICAS"),
        ("REDISLOCK_REDLOCK_CACHE", "REDISLOCK_REDLOCK_CACHES"),
    ],
)
def test_a_misspelt_setting_is_w007_naming_the_closest_one(typo: str, meant: str) -> None:
    with override_settings(**{typo: "x"}):
        messages = check_settings()
    assert _ids(messages) == ["django_redislock.W007"]
    assert typo in messages[0].msg
    assert messages[0].hint == f"Did you mean {meant}? Rename the setting."


def test_an_unknown_setting_like_no_other_is_w007_without_a_guess() -> None:
    assert suggest_setting("REDISLOCK_BANANA") is None
    with override_settings(REDISLOCK_BANANA=1, REDISLOCKS_URL="not ours"):
        messages = check_settings()
    assert _ids(messages) == ["django_redislock.W007"]
    assert "REDISLOCK_BANANA" in messages[0].msg
    assert "docs/settings.md" in (messages[0].hint or "")


def test_a_bad_url_is_an_error_not_a_crash_of_the_check() -> None:
    # redis-py refuses the query string: the check reports it instead of raising.
    with override_settings(REDISLOCK_URL="redis://127.0.0.1:1/0?socket_timeout=soon"):
        messages = check_settings()
    assert _ids(messages) == ["django_redislock.E001"]
    assert "socket_timeout" in messages[0].msg


def test_docs_describe_every_setting_and_every_check_id() -> None:
    text = DOCS.read_text()
    for spec in SETTINGS:
        assert f"### `{spec.name}" in text, spec.name
    source = "".join(
        path.read_text()
        for path in (Path(__file__).resolve().parent.parent / "django_redislock").rglob("*.py")
    )
    ids = set(re.findall(r'id="(django_redislock\.[EW]\d{3})"', source))
    assert ids  # the pattern still finds the ids
    table = set(re.findall(r"^\| `(django_redislock\.[EW]\d{3})` \|", text, re.M))
    assert ids == table
