"""Data classes without the ``dataclasses`` module, for daifu's own types.

``@dataclass`` generates and ``exec``s code for every method of every class
(0.2-0.5 ms a class) and imports ``inspect`` (with ``ast``, ``dis``,
``tokenize``): ~15 ms at every start of every job, for the ~40 classes daifu
defines.  ``@record`` makes the same classes -- fields in order, defaults,
``field(default_factory=..., kw_only=...)``, ``frozen``, ``eq``,
``__post_init__``, ``replace`` -- with generic methods that read the class's
field list; only ``__init__`` is compiled, at a class's first instantiation
(the rewrite makes one object per instruction: a generic ``__init__`` was 5x
slower).

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

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any, TypeVar, dataclass_transform, overload

    T = TypeVar("T")
else:
    def overload(fn):  # (typing's, for type checkers only)
        return fn

    def dataclass_transform(**_kwargs):
        return overload

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
    """The first ``__init__`` of a record class: compile the class's own
    (what ``@dataclass`` generates at definition), install it, run it.  A class
    never instantiated -- most of them in a run that never crashes -- costs
    nothing; one instantiated per instruction by the rewrite gets plain code."""
    owner = next(c for c in type(self).__mro__ if "__init__" in vars(c))
    init = _compile_init(vars(owner)["__record__"], owner)
    owner.__init__ = init  # type: ignore[misc]
    init(self, *args, **kwargs)


def prepare(*modules: Any) -> None:
    """Compile now the ``__init__`` of each record class defined in
    ``modules`` that was never instantiated (what its first instance would
    do): for the classes a path that must be quick makes (the engine's, at
    a crash: the preload)."""
    for module in modules:
        for cls in list(vars(module).values()):
            if isinstance(cls, type) and vars(cls).get("__init__") is _init \
                    and cls.__module__ == module.__name__:
                cls.__init__ = _compile_init(vars(cls)["__record__"], cls)  # type: ignore


def _compile_init(spec: _Spec, cls: type) -> Callable[..., None]:
    params, body = ["self"], []
    env: dict[str, Any] = {"__r_setattr": object.__setattr__, "__r_missing": _MISSING}
    kw_started = False
    for name in spec.names:
        if name in spec.kw_only and not kw_started:
            params.append("*")
            kw_started = True
        if name in spec.factories:
            env[f"__r_f_{name}"] = spec.factories[name]
            params.append(f"{name}=__r_missing")
            value = f"__r_f_{name}() if {name} is __r_missing else {name}"
        else:
            if name in spec.defaults:
                env[f"__r_d_{name}"] = spec.defaults[name]
                params.append(f"{name}=__r_d_{name}")
            else:
                params.append(name)
            value = name
        body.append(f"    __r_setattr(self, {name!r}, {value})" if spec.frozen
                    else f"    self.{name} = {value}")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    source = f"def __init__({', '.join(params)}):\n" + ("\n".join(body) or "    pass") + "\n"
    exec(source, env)  # noqa: S102 (built from the class's own field names)
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


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
def record(*, frozen: bool = False, eq: bool = True  # noqa: F811 (overloads)
           ) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(field_specifiers=(field, Field))
def record(cls: Any = None, /, *, frozen: bool = False, eq: bool = True  # noqa: F811
           ) -> Any:
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

