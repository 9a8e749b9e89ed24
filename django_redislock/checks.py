"""System checks: is the lock backend usable and safe?

* ``django_redislock.E001`` the cache alias does not exist or is not a Redis cache.
* ``django_redislock.E002`` a ``REDISLOCK_*`` setting has an invalid value.
* ``django_redislock.W001`` Redis could not be reached.
* ``django_redislock.W002`` Redis may evict lock keys (``maxmemory`` with a policy
  other than ``noeviction``), read from ``INFO memory`` where ``CONFIG`` is refused.
* ``django_redislock.W003`` the lock client has no socket timeout.
* ``django_redislock.E003`` ``REDISLOCK_WAIT_REPLICAS`` asks for more replicas than
  Redis has connected: every grant would be refused.
* ``django_redislock.W004`` Redis has replicas but locks do not wait for them
  (``REDISLOCK_WAIT_REPLICAS`` is 0): a failover may lose fresh grants.
* ``django_redislock.E004`` two Redlock masters are one server (or a master is a
  replica): they fail together, so the majority is not what it seems.
* ``django_redislock.W005`` an even number of Redlock masters, or fewer than 3.
* ``django_redislock.W006`` Redlock masters that cannot be reached.
* ``django_redislock.E006`` Redis (or a Redlock master) refuses to run Lua scripts.
* ``django_redislock.E007`` the lock client encodes text in something other than
  UTF-8 (the engine's keys and records are UTF-8).
* ``django_redislock.W007`` a ``REDISLOCK_*`` name that is not a setting of this
  package (a misspelling?), with the closest known name.
* ``django_redislock.E005`` / ``W008``: lock keys of views and Celery tasks
  (:mod:`django_redislock.guards.key_checks`).

Every setting's rule is its entry in :mod:`django_redislock.settings_spec`. The
checks that ask the server (W001, W002, E003, W004, E004, W005, W006, E006) are tagged
``database`` and run only when asked for, like Django's own database checks
(:func:`check_server`).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .client.connection import ForeignEncoding, connection_kwargs, redlock_clients, resolve_client
from .client.source import default_source
from .conf import get_setting, setting
from .engine.backends.base import SCRIPTING_FIX
from .engine.backends.redlock import RedlockBackend
from .exceptions import LockBackendError
from .guards.key_checks import check_lock_keys  # noqa: F401  (registers E005/W008)
from .settings_spec import PREFIX, SETTINGS, SPECS, suggest_setting

#: The settings that say which Redis the locks use: while one is invalid, the
#: backend is not resolved (its error would only repeat theirs).
_BACKEND_SETTINGS = {
    "REDISLOCK_CACHE",
    "REDISLOCK_URL",
    "REDISLOCK_CLUSTER",
    "REDISLOCK_REDLOCK_CACHES",
}


@checks.register("django_redislock")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Check every REDISLOCK_* value against its entry in the settings table, look for
    misspelt names, and check that the backend is a Redis cache."""
    errors: list[checks.CheckMessage] = _unknown_settings()
    invalid = set()
    for spec in SETTINGS:
        try:
            spec.clean(get_setting(spec.name), spec.name)
        except (TypeError, ValueError) as exc:
            invalid.add(spec.name)
            errors.append(
                checks.Error(
                    str(exc),
                    hint=f"Correct {spec.name} in your settings ({spec.meaning}; see "
                    "docs/settings.md), or remove it to use the default "
                    f"{spec.default!r}.",
                    id="django_redislock.E002",
                )
            )
    if invalid & _BACKEND_SETTINGS:
        return errors  # which Redis to use is unknown until those are corrected
    try:
        redlock = get_setting("REDISLOCK_REDLOCK_CACHES")
        if redlock:
            redlock_clients(redlock)
        client = resolve_client()
    except ForeignEncoding as exc:
        errors.append(
            checks.Error(
                str(exc),
                hint="Lock names and records are UTF-8 whatever the client says; another "
                "encoding would split one lock into two keys. Use a client (or a second "
                "cache alias for REDISLOCK_CACHE) that keeps redis-py's default encoding.",
                id="django_redislock.E007",
            )
        )
    except (ImproperlyConfigured, ValueError) as exc:  # ValueError: a URL redis-py refuses
        errors.append(
            checks.Error(
                str(exc),
                hint="Locks need Redis: django-redis's RedisCache, Django's "
                "django.core.cache.backends.redis.RedisCache, or REDISLOCK_URL.",
                id="django_redislock.E001",
            )
        )
    except LockBackendError:
        pass  # Redis could not be asked whether it is a cluster: check_server says so
    else:
        kwargs = connection_kwargs(client)
        if kwargs.get("socket_timeout") is None:
            errors.append(
                checks.Warning(
                    "The Redis client for locks has no socket timeout: a holder cut off "
                    "from Redis may wait on a renewal for ever and never learn that its "
                    "lock was lost, and every lock call can hang.",
                    hint="Set a socket timeout of a few seconds: OPTIONS "
                    '{"socket_timeout": 5} (Django\'s RedisCache), {"SOCKET_TIMEOUT": 5} '
                    "(django-redis), or ?socket_timeout=5 in REDISLOCK_URL.",
                    id="django_redislock.W003",
                )
            )
    return errors


def _unknown_settings() -> list[checks.CheckMessage]:
    """W007: ``REDISLOCK_*`` names in the settings that this package does not read."""
    warnings: list[checks.CheckMessage] = []
    for name in sorted(dir(django_settings)):
        if not name.startswith(PREFIX) or name in SPECS:
            continue
        close = suggest_setting(name)
        hint = (
            f"Did you mean {close}? Rename the setting."
            if close
            else "Remove it, or use one of the settings listed in docs/settings.md."
        )
        warnings.append(
            checks.Warning(
                f"{name} is not a django-redislock setting, so it has no effect.",
                hint=hint,
                id="django_redislock.W007",
            )
        )
    return warnings


@checks.register("django_redislock", "database")
def check_server(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Ask Redis: is it reachable, does it run scripts, may it evict lock keys, are its
    replicas and Redlock masters what the settings expect?

    It talks to Redis, so like Django's own database checks it runs only when asked
    for: ``manage.py check --database default`` (``migrate`` asks too; on Django 6+
    ``--tag database`` or ``--tag django_redislock`` as well), never on a plain
    ``check`` or ``runserver``.
    """
    if not databases:
        return []
    try:
        backend = default_source.backend()
        values = backend.server_config("maxmemory*")
    except (ImproperlyConfigured, ValueError, TypeError):
        return []  # reported by check_settings
    except LockBackendError as exc:
        if "unknown command" not in str(exc).lower() and "no permission" not in str(exc).lower():
            return [
                checks.Warning(
                    f"Redis for locks could not be reached: {exc}",
                    hint="Check REDISLOCK_CACHE / REDISLOCK_URL and that Redis is running.",
                    id="django_redislock.W001",
                )
            ]
        values = {}  # neither CONFIG nor INFO answers: the policy cannot be read
    problems = _scripting_problems(backend)
    problems += _replication_problems(backend) + _redlock_problems(backend)
    policy = values.get("maxmemory-policy", "noeviction")
    if int(values.get("maxmemory") or 0) > 0 and policy != "noeviction":
        problems.append(
            checks.Warning(
                f"Redis has maxmemory set with maxmemory-policy {policy!r}: under memory "
                "pressure it may evict lock keys, and an evicted lock is silently free.",
                hint="Use maxmemory-policy noeviction on the Redis that holds locks, or "
                "point REDISLOCK_URL at a Redis that does not evict.",
                id="django_redislock.W002",
            )
        )
    return problems


def _scripting_problems(backend: Any) -> list[checks.CheckMessage]:
    """E006: a server that refuses to run scripts (every lock operation is one)."""
    refusals = backend.scripting_refusals()
    problems: list[checks.CheckMessage] = []
    for index, refusal in enumerate(refusals):
        if refusal is None:
            continue
        where = f"Redlock master #{index + 1}" if isinstance(backend, RedlockBackend) else "Redis"
        problems.append(
            checks.Error(
                f"{where} refuses to run Lua scripts ({refusal.__cause__}), and every lock "
                "operation is one: each lock call would raise ScriptingUnavailable.",
                hint=f"{SCRIPTING_FIX}.",
                id="django_redislock.E006",
            )
        )
    return problems


def _replication_problems(backend: Any) -> list[checks.CheckMessage]:
    """E003/W004: REDISLOCK_WAIT_REPLICAS against the replicas Redis has (not for
    Redlock, whose majority of masters replaces replica acknowledgements)."""
    if isinstance(backend, RedlockBackend):
        return []
    try:
        wanted = setting("REDISLOCK_WAIT_REPLICAS")
        replicas = backend.connected_replicas()
    except (TypeError, ValueError, LockBackendError, AttributeError):
        return []  # an invalid setting is E002; INFO refused: nothing to compare
    if wanted > replicas:
        return [
            checks.Error(
                f"REDISLOCK_WAIT_REPLICAS is {wanted}, but the Redis primary for locks has "
                f"{replicas} replica(s) connected: no grant could be confirmed, so every "
                "acquire would fail with LockNotReplicated.",
                hint="Lower REDISLOCK_WAIT_REPLICAS to the number of replicas you run "
                "(1 is usual), or check why the replicas are not connected.",
                id="django_redislock.E003",
            )
        ]
    if wanted == 0 and replicas > 0:
        return [
            checks.Warning(
                f"The Redis primary for locks has {replicas} replica(s), but locks do not "
                "wait for them: a failover right after a grant can promote a replica that "
                "never saw it, and a second client then gets the same lock.",
                hint="Set REDISLOCK_WAIT_REPLICAS = 1 (about 0.03 ms per grant on a healthy "
                "replica; see docs/topology.md), or silence django_redislock.W004 if a "
                "rare double grant after a failover is acceptable.",
                id="django_redislock.W004",
            )
        ]
    return []


def _redlock_problems(backend: Any) -> list[checks.CheckMessage]:
    """E004/W005/W006: whether the Redlock masters are independent, odd, reachable."""
    if not isinstance(backend, RedlockBackend):
        return []
    problems: list[checks.CheckMessage] = []
    masters = len(backend.clients)
    if masters < 3 or masters % 2 == 0:
        problems.append(
            checks.Warning(
                f"REDISLOCK_REDLOCK_CACHES names {masters} masters: a majority of an even "
                "number tolerates no more failures than one master fewer, and fewer than 3 "
                "tolerate none.",
                hint="Use 3 or 5 independent masters.",
                id="django_redislock.W005",
            )
        )
    seen: dict[str, int] = {}
    down = []
    for index, info in enumerate(backend.masters_info()):
        if isinstance(info, Exception):
            down.append(f"#{index + 1} ({info})")
            continue
        if info.get("role", "master") != "master":
            problems.append(
                checks.Error(
                    f"Redlock master #{index + 1} is a replica; a Redlock needs independent "
                    "masters.",
                    hint="Point REDISLOCK_REDLOCK_CACHES at primaries only.",
                    id="django_redislock.E004",
                )
            )
        run_id = str(info.get("run_id", ""))
        if run_id in seen:
            problems.append(
                checks.Error(
                    f"Redlock masters #{seen[run_id] + 1} and #{index + 1} are the same Redis "
                    "server (two databases of one server fail together), so a majority of "
                    "them is not a majority of independent servers.",
                    hint="Give every entry of REDISLOCK_REDLOCK_CACHES its own server.",
                    id="django_redislock.E004",
                )
            )
        else:
            seen[run_id] = index
    if down:
        problems.append(
            checks.Warning(
                f"Redlock masters could not be reached: {', '.join(down)}. Locks work while a "
                "majority answers, with less margin for the next failure.",
                hint="Check the servers in REDISLOCK_REDLOCK_CACHES.",
                id="django_redislock.W006",
            )
        )
    return problems
