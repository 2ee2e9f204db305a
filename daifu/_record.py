"""Data classes without the ``dataclasses`` module, for daifu's own types.

``@dataclass`` generates and ``exec``s code for every method of every class
(0.2-0.5 ms a class) and imports ``inspect`` (with ``ast``, ``dis``,
``tokenize``): ~15 ms at every start of every job, for the ~40 classes daifu
defines.  ``@record`` makes the same classes -- fields in order, defaults,
``field(default_factory=..., kw_only=...)``, ``frozen``, ``eq``,
``__post_init__``, ``replace`` -- with generic methods that read the class's
field list, and no code generation.

What a ``@record`` class does, as ``@dataclass`` does it:

* ``__init__(*fields, **fields)``: positional in field order (inherited
  records' fields first), keyword-only fields by keyword only, defaults
  copied from the class, factories called per instance; ``__post_init__``
  runs after;
* ``__repr__``: ``Name(a=1, b=[...])``, ``...`` for an object already being
  shown (a cell and the code info that lists it);
* ``eq=True`` (default): ``__eq__`` compares the field values of two objects
  of the same class; unhashable unless ``frozen``, where the hash is the
  fields' hash; ``eq=False`` keeps identity semantics;
* ``frozen=True``: assigning or deleting an attribute raises
  ``FrozenInstanceError`` (an ``AttributeError``);
* a method the class body defines itself is kept.

Type checkers see ``dataclass_transform`` (PEP 681): they check these classes
as data classes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

T = TypeVar("T")
_MISSING: Any = object()


class FrozenInstanceError(AttributeError):
    """An attribute of a frozen record was assigned or deleted."""


class Field:
    """What ``field()`` returns in a class body (replaced by the decorator)."""

    __slots__ = ("default", "factory", "kw_only")

    def __init__(self, default: Any, factory: Callable[[], Any] | None, kw_only: bool) -> None:
        self.default, self.factory, self.kw_only = default, factory, kw_only


def field(*, default: Any = _MISSING, default_factory: Callable[[], Any] | None = None,
          kw_only: bool = False) -> Any:
    """A field with a default, a per-instance default (``default_factory``),
    or keyword-only."""
    if default is not _MISSING and default_factory is not None:
        raise ValueError("cannot specify both default and default_factory")
    return Field(default, default_factory, kw_only)


class _Spec:
    """A record class's fields: names in ``__init__`` order, defaults,
    factories, keyword-only names."""

    __slots__ = ("names", "positional", "defaults", "factories", "kw_only", "frozen", "eq")

    def __init__(self, names: list[str], defaults: dict[str, Any],
                 factories: dict[str, Callable[[], Any]], kw_only: set[str],
                 frozen: bool, eq: bool) -> None:
        self.names = tuple([n for n in names if n not in kw_only]
                           + [n for n in names if n in kw_only])
        self.positional = tuple(n for n in names if n not in kw_only)
        self.defaults, self.factories, self.kw_only = defaults, factories, frozenset(kw_only)
        self.frozen, self.eq = frozen, eq


def _is_classvar(annotation: Any) -> bool:
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return text.startswith(("ClassVar", "typing.ClassVar", "t.ClassVar"))


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    spec: _Spec = type(self).__record__
    cls_name = type(self).__name__
    if len(args) > len(spec.positional):
        raise TypeError(f"{cls_name}() takes {len(spec.positional)} positional arguments "
                        f"but {len(args)} were given")
    values = dict(zip(spec.positional, args))
    for key, value in kwargs.items():
        if key not in spec.names:
            raise TypeError(f"{cls_name}() got an unexpected keyword argument {key!r}")
        if key in values:
            raise TypeError(f"{cls_name}() got multiple values for argument {key!r}")
        values[key] = value
    setter = object.__setattr__
    for name in spec.names:
        if name in values:
            setter(self, name, values[name])
        elif name in spec.factories:
            setter(self, name, spec.factories[name]())
        elif name in spec.defaults:
            setter(self, name, spec.defaults[name])
        else:
            raise TypeError(f"{cls_name}() missing required argument: {name!r}")
    post = getattr(self, "__post_init__", None)
    if post is not None:
        post()


_showing = threading.local()


def _repr(self: Any) -> str:
    seen = getattr(_showing, "ids", None)
    if seen is None:
        seen = _showing.ids = set()
    key = id(self)
    if key in seen:
        return "..."
    seen.add(key)
    try:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in type(self).__record__.names)
    finally:
        seen.discard(key)
    return f"{type(self).__qualname__}({inner})"


def _values(self: Any) -> tuple:
    return tuple(getattr(self, n) for n in type(self).__record__.names)


def _eq(self: Any, other: object) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _values(self) == _values(other)


def _hash(self: Any) -> int:
    return hash(_values(self))


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _make(cls: type[T], frozen: bool, eq: bool) -> type[T]:
    names: list[str] = []
    defaults: dict[str, Any] = {}
    factories: dict[str, Callable[[], Any]] = {}
    kw_only: set[str] = set()
    for base in reversed(cls.__mro__[1:]):
        spec = vars(base).get("__record__")
        if spec is not None:
            for name in spec.names:
                if name not in names:
                    names.append(name)
            defaults.update(spec.defaults)
            factories.update(spec.factories)
            kw_only |= spec.kw_only
    own = vars(cls)
    for name, annotation in own.get("__annotations__", {}).items():
        if _is_classvar(annotation):
            continue
        if name not in names:
            names.append(name)
        defaults.pop(name, None)
        factories.pop(name, None)
        kw_only.discard(name)
        value = own.get(name, _MISSING)
        if isinstance(value, Field):
            if value.kw_only:
                kw_only.add(name)
            if value.factory is not None:
                factories[name] = value.factory
                delattr(cls, name)
            elif value.default is not _MISSING:
                defaults[name] = value.default
                setattr(cls, name, value.default)
            else:
                delattr(cls, name)
        elif value is not _MISSING:
            defaults[name] = value
    required_after_default = [
        n for i, n in enumerate(names) if n not in kw_only and n not in defaults
        and n not in factories and any(
            m in defaults or m in factories for m in names[:i] if m not in kw_only)]
    if required_after_default:
        raise TypeError(f"non-default argument {required_after_default[0]!r} follows "
                        "default argument")
    cls.__record__ = _Spec(names, defaults, factories, kw_only, frozen, eq)  # type: ignore
    methods: dict[str, Any] = {"__init__": _init, "__repr__": _repr}
    if eq:
        methods["__eq__"] = _eq
    if frozen:
        methods["__setattr__"], methods["__delattr__"] = _frozen_setattr, _frozen_delattr
    for name, method in methods.items():
        if name not in own:
            setattr(cls, name, method)
    # (a body that defines __eq__ gets __hash__ = None from Python itself)
    explicit_hash = "__hash__" in own and not (own["__hash__"] is None and "__eq__" in own)
    if eq and not explicit_hash:
        cls.__hash__ = _hash if frozen else None  # type: ignore[assignment]
    return cls


@overload
def record(cls: type[T], /) -> type[T]: ...


@overload
def record(*, frozen: bool = False, eq: bool = True) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(field_specifiers=(field, Field))
def record(cls: Any = None, /, *, frozen: bool = False, eq: bool = True) -> Any:
    """``@record`` or ``@record(frozen=True, eq=False)``: see the module."""
    if cls is not None:
        return _make(cls, frozen, eq)
    return lambda klass: _make(klass, frozen, eq)


def replace(obj: T, /, **changes: Any) -> T:
    """A copy of ``obj`` with ``changes`` (``dataclasses.replace``)."""
    spec: _Spec = type(obj).__record__  # type: ignore[attr-defined]
    values = {n: getattr(obj, n) for n in spec.names}
    unknown = set(changes) - set(values)
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field {sorted(unknown)[0]!r}")
    values.update(changes)
    return type(obj)(**values)

