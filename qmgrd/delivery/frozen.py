"""A cheaper ``__init__`` for the frozen slotted dataclasses made per recipient and per reply.

A frozen dataclass's generated ``__init__`` sets each field with
``object.__setattr__`` (its own ``__setattr__`` refuses): a lookup through the
type and a generic call per field, about twice the cost of the slot's own
setter. The delivery path makes several such values per recipient (the agent's
``Recipient`` and ``RecipientResult``, a ``Reply`` per command), so
``fast_init(cls)`` replaces that ``__init__`` with one that calls each slot
descriptor's ``__set__`` directly:

- the same signature (positional or keyword, the same defaults; a
  ``default_factory`` is called when its argument is left out) and
  ``__post_init__`` is called last, as before;
- the instances are the same: still frozen (assignment raises
  ``FrozenInstanceError``), equal, hashable and printed as before.

Only for ``@dataclass(frozen=True, slots=True)`` classes whose fields are all
``init`` fields and none keyword-only: anything else is a ``TypeError`` when
the class is defined.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["fast_init"]

T = TypeVar("T")

_MISSING = object()  # a default_factory argument left out


def fast_init(cls: type[T]) -> type[T]:
    """Give the frozen slotted dataclass ``cls`` the cheaper ``__init__`` (module doc)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"fast_init: {cls.__name__} is not a frozen slotted dataclass")
    namespace: dict[str, Any] = {"_MISSING": _MISSING}
    args: list[str] = []
    body: list[str] = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init or f.kw_only:
            raise TypeError(f"fast_init: {cls.__name__}.{f.name} is not a positional init field")
        name = f.name
        namespace[f"_set_{name}"] = cls.__dict__[name].__set__
        if f.default is not dataclasses.MISSING:
            namespace[f"_default_{name}"] = f.default
            args.append(f"{name}=_default_{name}")
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"_factory_{name}"] = f.default_factory
            args.append(f"{name}=_MISSING")
            body.append(f"    if {name} is _MISSING: {name} = _factory_{name}()")
        else:
            args.append(name)
        body.append(f"    _set_{name}(self, {name})")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    source = f"def __init__(self, {', '.join(args)}):\n" + "\n".join(body or ["    pass"]) + "\n"
    exec(source, namespace)  # as dataclasses builds its own __init__
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    setattr(cls, "__init__", init)  # noqa: B010 (mypy: no assignment to a method)
    return cls
