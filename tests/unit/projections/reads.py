"""What a fold reads from an event's body, found in its source, checked against the events'
pydantic models.

A fold reads its body parameter as `e["field"]` or `e.get("field")`, nested models as
`e["serving"]["devices_per_replica"]`, or passes it whole to a helper (a method of the same
class or a function of its module), whose source is read in turn. Any other use of the body (
iterating it, unpacking it, handing it to something whose source is not Python) is reported:
what it reads could not be checked.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import textwrap
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

import wingsmith.domain
from wingsmith.domain.base import Created, Event

Path = tuple[str, ...]  # ("serving", "devices_per_replica"): e["serving"]["devices_per_replica"]
NOT_IN_BODY = frozenset({"originator_id", "originator_version"})  # stored beside the body


def domain_events() -> list[type[Event]]:
    """Every event class the domain defines (its modules all imported first)."""
    for module in pkgutil.iter_modules(wingsmith.domain.__path__):
        importlib.import_module(f"wingsmith.domain.{module.name}")
    found: list[type[Event]] = []
    pending: list[type[Event]] = [Event]
    while pending:
        for sub in pending.pop().__subclasses__():
            pending.append(sub)
            if sub.__module__.startswith("wingsmith.domain.") and sub is not Created:
                found.append(sub)
    return found


def body_fields(event: type[BaseModel]) -> dict[str, Any]:
    """The fields an event's stored body carries, with their annotations."""
    return {
        name: info.annotation
        for name, info in event.model_fields.items()
        if not (issubclass(event, Event) and name in NOT_IN_BODY)
    }


def problems(event: type[Event], path: Path) -> str | None:
    """Why `path` is not something an event's body holds; None when it is. Below a field
    that is not a model (a list, a mapping) nothing more is checked."""
    model: type[BaseModel] | None = event
    for depth, name in enumerate(path):
        if model is None:
            return None
        fields = body_fields(model)
        if name not in fields:
            where = "".join(f"[{p!r}]" for p in path[:depth])
            return f"{event.__name__}{where} has no field {name!r}"
        model = _model(fields[name])
    return None


def _model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (itself or in an optional), if it holds one."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [_model(a) for a in typing.get_args(annotation) if a is not type(None)]
        return models[0] if len(models) == 1 else None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


@dataclass(frozen=True)
class Use:
    """One use of the body in a function: a read of `path`, or (path None) a use that cannot
    be checked, explained by `why`."""

    where: str
    path: Path | None
    why: str = ""


def uses(function: Callable[..., Any], body: str, owner: type) -> Iterator[Use]:
    """Every use of the parameter `body` in `function` and in the helpers it is passed to;
    `owner` resolves `self.<helper>`."""
    yield from _uses(function, body, owner, set())


def _uses(function: Any, body: str, owner: type, seen: set[tuple[Any, str]]) -> Iterator[Use]:
    if (function, body) in seen:
        return
    seen.add((function, body))
    where = function.__qualname__
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == body and isinstance(node.ctx, ast.Load):
            path, top = _path(node, parents)
            if path:
                yield Use(where, path)
            else:
                yield from _passed(function, top, parents.get(top), owner, seen)


def _path(node: ast.expr, parents: dict[ast.AST, ast.AST]) -> tuple[Path, ast.expr]:
    """The keys read through `node` by subscripts and `.get` calls with constant names, and
    the expression that ends the chain."""
    path: list[str] = []
    while True:
        parent = parents.get(node)
        if isinstance(parent, ast.Subscript) and parent.value is node and _named(parent.slice):
            path.append(parent.slice.value)  # type: ignore[attr-defined]
            node = parent
            continue
        call = parents.get(parent) if isinstance(parent, ast.Attribute) else None
        if (
            isinstance(parent, ast.Attribute)
            and parent.attr == "get"
            and isinstance(call, ast.Call)
            and call.func is parent
            and call.args
            and _named(call.args[0])
        ):
            path.append(call.args[0].value)  # type: ignore[attr-defined]
            node = call
            continue
        return tuple(path), node


def _named(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _passed(
    function: Any,
    arg: ast.expr,
    call: ast.AST | None,
    owner: type,
    seen: set[tuple[Any, str]],
) -> Iterator[Use]:
    """The body handed whole to a call: follow it into the helper's parameter."""
    where = function.__qualname__
    if _identity_test(call):
        return  # `e is None` reads nothing
    if not isinstance(call, ast.Call) or arg not in call.args + [k.value for k in call.keywords]:
        shown = ast.unparse(call) if call is not None else ast.unparse(arg)
        yield Use(where, None, f"uses the body whole in `{shown}`")
        return
    helper, skip = _helper(function, call.func, owner)
    if helper is None:
        yield Use(where, None, f"passes the body to {ast.unparse(call.func)}, not a helper")
        return
    parameter = _parameter(helper, skip, call, arg)
    if parameter is None:
        yield Use(where, None, f"passes the body to {ast.unparse(call.func)} unclearly")
        return
    yield from _uses(helper, parameter, owner, seen)


def _identity_test(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Compare) and all(
        isinstance(op, ast.Is | ast.IsNot) for op in node.ops
    )


def _helper(function: Any, func: ast.expr, owner: type) -> tuple[Any, int]:
    """A method of the owner (`self.x`) or a function of the module (`x`), with how many
    leading parameters the call does not pass (self); (None, 0) for anything else."""
    if isinstance(func, ast.Attribute) and ast.unparse(func.value) == "self":  # noqa: SIM102
        if hasattr(owner, func.attr):
            static = isinstance(inspect.getattr_static(owner, func.attr), staticmethod)
            return getattr(owner, func.attr), 0 if static else 1
    if isinstance(func, ast.Name):
        found = function.__globals__.get(func.id)
        if inspect.isfunction(found) and found.__module__ == function.__module__:
            return found, 0
    return None, 0


def _parameter(helper: Any, skip: int, call: ast.Call, arg: ast.expr) -> str | None:
    """The helper's parameter that receives `arg`; None when a starred argument before it
    makes that unclear."""
    names = list(inspect.signature(helper).parameters)[skip:]
    for keyword in call.keywords:
        if keyword.value is arg:
            return keyword.arg
    index = call.args.index(arg)
    if any(isinstance(a, ast.Starred) for a in call.args[: index + 1]):
        return None
    return names[index] if index < len(names) else None
