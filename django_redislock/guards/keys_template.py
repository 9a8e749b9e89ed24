"""Lock names computed from a call's arguments, for ``single_instance``.

A :class:`KeySpec` turns ``(args, kwargs)`` of one call into a lock name. It
binds the call to the function's signature (so ``f(1)`` and ``f(a=1)`` give
the same name, defaults included) and normalises every value the way it looks
after a trip through Celery's JSON serializer (UUID -> str, datetime ->
ISO 8601, Decimal -> str, tuple -> list, model instance -> its pk), so the name
computed when a task is queued equals the one computed in the worker.
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import functools
import hashlib
import inspect
import json
import string
import uuid
from collections.abc import Callable, Mapping
from typing import Any

#: Marker for "the function's dotted name plus a digest of all its arguments".
ARGS = "<args>"

_formatter = string.Formatter()


def normalize(value: Any) -> Any:
    """*value* as it would come back from a JSON round trip, recursively.

    Raises TypeError for values with no stable representation.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return normalize(value.value)
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return str(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (list, tuple)):
        return [normalize(item) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted((normalize(item) for item in value), key=_canonical)
    if isinstance(value, Mapping):
        return {str(k): normalize(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    pk = _model_pk(value)
    if pk is not _NO_PK:
        return normalize(pk)
    raise TypeError(
        f"cannot build a stable lock key from a {type(value).__name__} value; "
        "pass a key template naming a stable attribute, or a key callable"
    )


_NO_PK: Any = object()


def _model_pk(value: Any) -> Any:
    meta = getattr(type(value), "_meta", None)
    if meta is not None and hasattr(meta, "pk") and hasattr(value, "pk"):
        return value.pk
    return _NO_PK


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class _KeyFormatter(string.Formatter):
    """``str.format`` that normalises each substituted value first."""

    def format_field(self, value: Any, format_spec: str) -> str:
        try:
            value = normalize(value)
        except TypeError:
            # The template asked for this value explicitly: use its str().
            return format(value, format_spec)
        if isinstance(value, (list, dict)):
            value = _canonical(value)
        return format(value, format_spec)


_key_formatter = _KeyFormatter()


def dotted_name(func: Callable[..., Any]) -> str:
    """``module.qualname`` of *func* (unwrapping ``functools.wraps`` chains)."""
    func = inspect.unwrap(func)
    module = getattr(func, "__module__", None) or "?"
    qualname = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
    return f"{module}.{qualname}"


class KeySpec:
    """How to compute the lock name for calls of one function.

    :param key: a ``str.format`` template over the argument names, a callable
        receiving the call's arguments, :data:`ARGS`, or None (the base name).
    :param func: the function whose signature binds the arguments.
    :param base: the name used when *key* is None or ARGS (default: the
        function's dotted name).
    :param drop_first: the first parameter (a view's ``request``) is left out
        of :data:`ARGS` digests.
    :param skip_self: the function's first parameter is ``self`` (a Celery
        task with ``bind=True``) and the calls this spec renders never pass it.

    Raises ValueError when a template names an argument *func* does not have.
    """

    def __init__(
        self,
        key: str | Callable[..., str] | None,
        func: Callable[..., Any],
        *,
        base: str | None = None,
        drop_first: bool = False,
        skip_self: bool = False,
    ) -> None:
        self.key = key
        self._without_self: KeySpec | None = None
        self._bind_plan: tuple[inspect.Signature, _Plan | None] | None = None
        self.base = base or dotted_name(func)
        self.drop_first = drop_first
        try:
            # method_decorator hands us a partial of the bound method whose
            # __wrapped__ is the unbound one (with self): trust the partial.
            self.signature: inspect.Signature | None = inspect.signature(
                func, follow_wrapped=not isinstance(func, functools.partial)
            )
        except (TypeError, ValueError):
            self.signature = None
        if skip_self and self.signature is not None:
            self.signature = _without_first(self.signature)
        self.fields: tuple[str, ...] = ()
        #: Rendering may run arbitrary code (attribute lookups such as a lazy
        #: ``request.user``, or a key callable): async callers render off the loop.
        self.may_block = callable(key)
        if isinstance(key, str) and key != ARGS:
            self.fields = template_fields(key)
            self.may_block = any(
                field and ("." in field or "[" in field)
                for _lit, field, _spec, _conv in _formatter.parse(key)
            )
            self._check_fields(key)
        elif key is not None and key != ARGS and not callable(key):
            raise TypeError(
                f"key must be a format string, a callable, single_instance.ARGS or None, "
                f"not {type(key).__name__}"
            )

    def _check_fields(self, key: str) -> None:
        if self.signature is None:
            return
        params = self.signature.parameters
        has_var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
        for field in self.fields:
            if field not in params and not has_var_kw:
                raise ValueError(
                    f"lock key {key!r} names {{{field}}}, but {self.base}() has no argument "
                    f"called {field!r} (its arguments: {', '.join(params) or 'none'})"
                )

    def without_self(self) -> KeySpec:
        """This spec for calls that leave out the first parameter (a bound task's ``self``).

        Built once per spec and then reused.
        """
        spec = self._without_self
        if spec is None:
            spec = object.__new__(KeySpec)
            spec.__dict__.update(self.__dict__)
            if self.signature is not None:
                spec.signature = _without_first(self.signature)
            spec.drop_first = False
            self._without_self = spec
        return spec

    @property
    def template(self) -> str:
        """The key as a bounded label for every name it makes: the template itself
        (``"sync:{account_id}"``), the base name for a fixed or None key, and the
        base name plus ``:<args>`` / ``:<key callable>`` otherwise (contention
        overviews and metrics group by it, never by the unbounded names)."""
        key = self.key
        if key is None:
            return self.base
        if key == ARGS:
            return f"{self.base}:<args>"
        if callable(key):
            return f"{self.base}:<key callable>"
        return str(key)

    @property
    def is_static(self) -> bool:
        """Whether the name does not depend on the arguments."""
        key = self.key
        return key is None or (isinstance(key, str) and not self.fields and key != ARGS)

    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The call's arguments by name, defaults applied, ``**kwargs`` flattened in."""
        if self.signature is None:
            return dict(kwargs)
        cached = self._bind_plan
        if cached is None or cached[0] is not self.signature:  # (without_self copies it)
            cached = self._bind_plan = (self.signature, _plan(self.signature))
        if cached[1] is not None:
            quick = _quick_bind(cached[1], args, kwargs)
            if quick is not None:
                return quick
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"cannot compute the lock key of {self.base}(): {exc}") from None
        bound.apply_defaults()
        arguments: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            kind = self.signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                arguments.update(value)
            elif kind is inspect.Parameter.VAR_POSITIONAL:
                arguments[name] = list(value)
            else:
                arguments[name] = value
        return arguments

    def render(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
        """The lock name for one call. Raises ValueError/TypeError when it cannot be built."""
        key = self.key
        if key is None:
            return self.base
        if callable(key):
            name = key(*args, **kwargs)
            if not isinstance(name, str):
                raise TypeError(
                    f"the lock key callable of {self.base}() returned "
                    f"{type(name).__name__}, not str"
                )
            return name
        if self.is_static:
            return key
        return self._name_from(self.bind(args, kwargs))

    def render_with_inputs(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        """The lock name for one call (:meth:`render`) and, for operators to read,
        the arguments it is made from, JSON-friendly: a template's fields, or every
        argument for :data:`ARGS` and a key callable; none for a fixed name. The
        arguments are bound once. Only the name can raise: a value with no JSON
        form shows as its (shortened) ``repr``, and long values are cut."""
        if self.is_static:
            return self.render(args, kwargs), {}
        if callable(self.key):
            name = self.render(args, kwargs)
            try:
                return name, self._inputs_from(self.bind(args, kwargs))
            except TypeError:
                return name, {}
        arguments = self.bind(args, kwargs)
        return self._name_from(arguments), self._inputs_from(arguments)

    def _without_request(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """*arguments* without the first parameter (a view's ``request``) when
        ``drop_first``; *arguments* itself otherwise (never changed)."""
        if not self.drop_first or self.signature is None:
            return arguments
        first = next(iter(self.signature.parameters), None)
        return {name: value for name, value in arguments.items() if name != first}

    def _name_from(self, arguments: dict[str, Any]) -> str:
        """The name of a template or :data:`ARGS` key, from the call's bound arguments."""
        key = self.key
        if key == ARGS:
            digest = hashlib.sha256(
                _canonical(normalize(self._without_request(arguments))).encode()
            ).hexdigest()
            return f"{self.base}:{digest[:32]}"
        try:
            return _key_formatter.vformat(str(key), (), arguments)
        except (KeyError, AttributeError, IndexError) as exc:
            raise ValueError(
                f"cannot render lock key {key!r} for this call of {self.base}(): "
                f"{type(exc).__name__}: {exc}"
            ) from None

    def _inputs_from(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """What :meth:`render_with_inputs` records of the call's bound arguments."""
        key = self.key
        if isinstance(key, str) and key != ARGS:
            arguments = {f: arguments[f] for f in self.fields if f in arguments}
        else:
            arguments = self._without_request(arguments)
        return {name: _shown(value) for name, value in arguments.items()}


#: How to bind a call quickly: the parameter names, how many of them can be
#: passed by position, and their defaults.
_Plan = tuple[tuple[str, ...], int, dict[str, Any]]


def _plan(signature: inspect.Signature) -> _Plan | None:
    """The quick-binding plan of *signature*; None unless every parameter is plain
    (positional-or-keyword, or keyword-only)."""
    params = list(signature.parameters.values())
    plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if not all(p.kind in plain for p in params):
        return None
    positional = sum(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    return tuple(p.name for p in params), positional, defaults


def _quick_bind(
    plan: _Plan, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> dict[str, Any] | None:
    """``Signature.bind`` + ``apply_defaults`` for the common call of a function
    whose parameters are all plain, in a fraction of the time; None when the
    call needs the full treatment (which also words its errors)."""
    names, positional, defaults = plan
    if len(args) > positional:
        return None
    arguments = dict(zip(names, args, strict=False))
    for name, value in kwargs.items():
        if name in arguments:
            return None
        arguments[name] = value
    if len(arguments) == len(names):
        return arguments if all(name in arguments for name in names) else None
    for name in names:
        if name not in arguments:
            if name not in defaults:
                return None
            arguments[name] = defaults[name]
    return arguments if len(arguments) == len(names) else None


#: How much of one argument :meth:`KeySpec.render_with_inputs` keeps (characters of JSON).
SHOWN_LENGTH = 200


def _shown(value: Any) -> Any:
    """*value* as an operator sees it: its JSON form, or its repr, cut to SHOWN_LENGTH."""
    try:
        normal = normalize(value)
    except (TypeError, RecursionError):
        text = repr(value)
        return text if len(text) <= SHOWN_LENGTH else text[: SHOWN_LENGTH - 1] + "…"
    text = _canonical(normal)
    if len(text) <= SHOWN_LENGTH:
        return normal
    return text[: SHOWN_LENGTH - 1] + "…"


def _without_first(signature: inspect.Signature) -> inspect.Signature:
    params = list(signature.parameters.values())
    if params and params[0].kind in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        params = params[1:]
    return signature.replace(parameters=params)


def template_fields(template: str) -> tuple[str, ...]:
    """The argument names a format template refers to (``"{user.pk}"`` -> ``("user",)``).

    Raises ValueError for positional fields (``{}``, ``{0}``) or a malformed template.
    """
    names: list[str] = []
    try:
        parsed = list(_formatter.parse(template))
    except ValueError as exc:
        raise ValueError(f"malformed lock key template {template!r}: {exc}") from None
    for _literal, field, _spec, _conv in parsed:
        if field is None:
            continue
        root = field.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise ValueError(
                f"lock key template {template!r} has a positional field; "
                "name the argument instead, e.g. '{account_id}'"
            )
        if root not in names:
            names.append(root)
    return tuple(names)
