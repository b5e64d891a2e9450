"""Command-line options built from the settings dataclasses (``cdscope.settings``).

A field made with ``settings.names.setting`` carries its flag(s), help and bounds; here
that becomes a Typer option, so a default, a help text or a bound is written once, in the
dataclass, whichever command shows it:

* ``option(cls, name)``: the option of one field, for a hand-written parameter
  ``name: Annotated[T, option(cls, name)] = cls.name`` (how ``train`` declares its own);
* ``unset=True``: the option defaults to ``None`` (so a command can tell an option that
  was given from one that was not) and its help shows the dataclass default;
* ``with_settings(cls, param)``: a decorator that appends every option of ``cls`` to a
  command and hands the command one ``cls`` instance as ``param``: the model-options
  group (``ModelSettings``) that every model-loading command takes this way; with
  ``unset=True`` the dict of the options given (``train``'s ``TrainConfig`` options).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from cdscope.cli.params import finite
from cdscope.settings.names import option_fields

F = TypeVar("F", bound=Callable[..., object])


def _field(cls: type, name: str) -> dataclasses.Field:
    found = {f.name: f for f in option_fields(cls)}
    if name not in found:
        raise KeyError(f"{cls.__name__}.{name} is not an option (made with settings.setting)")
    return found[name]


def _default(spec: dataclasses.Field) -> Any:
    return None if spec.default is dataclasses.MISSING else spec.default


def option(
    cls: type, name: str, *, unset: bool = False, in_sentence: bool = False, **overrides: Any
) -> Any:
    """The Typer option of field ``name`` of ``cls``: flag(s), help and bounds from its
    metadata; ``overrides`` replace Typer keywords (``help=...``). ``unset``: the shown
    default follows the help (``in_sentence``: before its closing period, as the audits
    show theirs)."""
    spec = _field(cls, name)
    flags = spec.metadata["flag"]
    flags = (flags,) if isinstance(flags, str) else tuple(flags)
    bounds = dict(spec.metadata["bounds"])
    keywords: dict[str, Any] = {"help": spec.metadata["help"]}
    kind = typing.get_type_hints(cls)[name]
    if {"low", "high"} & set(bounds) or float in (kind, *typing.get_args(kind)):
        # every float option: finite, in its bounds if any, refused as typed (1e400 is not inf)
        keywords["parser"] = finite(
            bounds.pop("low", None),
            bounds.pop("high", None),
            low_open=bounds.pop("low_open", False),
        )
    keywords.update(bounds)  # min / max of an integer
    if unset:
        default = _default(spec)
        if default is not None and default is not False:
            text, shown = keywords["help"], f" [default: {default}]"
            if in_sentence and text.endswith("."):
                keywords["help"] = f"{text[:-1]}{shown}."
            else:
                keywords["help"] = text + shown
        keywords["show_default"] = False
    keywords.update(overrides)
    return typer.Option(*flags, **keywords)


def annotated(cls: type, name: str, *, unset: bool = False, **keywords: Any) -> Any:
    """``Annotated[type, option(...)]`` of field ``name`` (``T | None`` when ``unset``)."""
    kind = typing.get_type_hints(cls)[name]
    if unset:
        kind = kind | None
    return Annotated[kind, option(cls, name, unset=unset, **keywords)]


def parameters(cls: type, *, unset: bool = False, **defaults: Any) -> list[inspect.Parameter]:
    """One keyword parameter per option of ``cls``, in field order; ``defaults`` replace
    the dataclass's for this command (``inspect`` loads on the CPU unless told); ``unset``:
    every option defaults to None (``option``'s ``unset``)."""
    out = []
    for spec in option_fields(cls):
        default = None if unset else defaults.get(spec.name, _default(spec))
        out.append(
            inspect.Parameter(
                spec.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=default,
                annotation=annotated(cls, spec.name, unset=unset),
            )
        )
    return out


def with_settings(
    cls: type, param: str, *, unset: bool = False, **defaults: Any
) -> Callable[[F], F]:
    """Append the options of ``cls`` to a command and call it with ``param=cls(...)`` built
    from them (``defaults``: this command's own defaults, also ``cls(**defaults)``).
    ``unset``: every option defaults to None and ``param`` is the dict of the options given
    (``train``: a preset or the dataclass fills the rest)."""
    added = parameters(cls, unset=unset, **defaults)
    names = [p.name for p in added]

    def decorate(func: F) -> F:
        own = inspect.signature(func, eval_str=True)
        kept = [p for p in own.parameters.values() if p.name != param]
        clash = set(names) & {p.name for p in kept}
        if clash:
            raise TypeError(f"{func.__name__} declares {sorted(clash)} itself")

        @functools.wraps(func)
        def command(**values: object) -> object:
            given = {name: values.pop(name) for name in names}
            if unset:
                return func(**values, **{param: {k: v for k, v in given.items() if v is not None}})
            return func(**values, **{param: cls(**given)})

        signature = own.replace(
            parameters=[p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in kept] + added
        )
        command.__signature__ = signature  # type: ignore[attr-defined]
        # the signature above is the whole truth; its annotations are evaluated objects
        command.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
        return command  # type: ignore[return-value]

    return decorate
