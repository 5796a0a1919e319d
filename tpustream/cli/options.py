"""Typer options derived from a config dataclass: each field is one option, its default the field's, its help
the field's docstring (the string literal right after it, as torchtitan's and tyro's configs write them).

The config is the one place an option is written; the CLI only says what differs for the command line
(an option name, a click-level bound, a computed list appended to the help) with ``Opt``. A field whose type
is itself a config dataclass with a default (``PromotionPolicy.floor: QualityFloor``) is flattened: its
fields are options too, and the command builds it from them. Nothing here imports the code the config
configures, so ``--help`` loads only the config's own module.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal, NoReturn

import typer

__all__ = [
    "Opt",
    "field_docs",
    "config_fields",
    "config_parameters",
    "from_config",
    "fail",
]

_MISSING: Any = dataclasses.MISSING
_CONFIG_DEFAULT: Any = object()  # Opt.default: the field's own (dataclasses.MISSING would mean "required")
# What typer turns into one option: scalars, an optional scalar, a Literal's choices, a repeatable string.
_SCALARS = (int, float, str, bool)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Opt:
    """What the command line adds to one config field; every attribute is optional."""

    name: str | None = None  # the option's name when not --field-name (``--json`` for ``as_json``)
    min: float | None = None  # a bound click checks before the config does (its "Invalid value" error)
    max: float | None = None
    more_help: str = ""  # appended to the docstring: a list computed at run time (models, sources)
    default: Any = _CONFIG_DEFAULT  # a CLI default unlike the config's, said in cli.py next to it
    hidden: bool = False
    metavar: str | None = None  # the value's name in --help (``EMAIL``), when the type's is not telling


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring right after the field in the class source (cleaned, one paragraph),
    ``cls``'s own over its bases' (a subclass that redeclares a field without a docstring keeps the base's).
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = next(node for node in tree.body if isinstance(node, ast.ClassDef)).body
    docs: dict[str, str] = {}
    for node, after in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return docs


def _option_type(annotation: Any, where: str) -> Any:
    """The field's type as typer takes it; a TypeError for one typer cannot parse from one string."""
    if annotation in _SCALARS or typing.get_origin(annotation) is Literal:
        return annotation
    if typing.get_origin(annotation) is list and typing.get_args(annotation) == (str,):
        return annotation  # a repeatable option
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(members) == 1 and len(typing.get_args(annotation)) == 2:
            _option_type(members[0], where)
            return annotation
    raise TypeError(
        f"{where}: type {annotation!r} is not an option type (int, float, str, bool, X | None, Literal, "
        "list[str])"
    )


def _nested(cls: type, field: dataclasses.Field[Any]) -> type | None:
    """The config dataclass ``field`` holds, when it holds one and can build it alone (a default factory)."""
    kind = typing.get_type_hints(cls)[field.name]
    if dataclasses.is_dataclass(kind) and isinstance(kind, type) and field.default_factory is not _MISSING:
        return kind
    return None


def config_fields(cls: type) -> list[tuple[type, dataclasses.Field[Any]]]:
    """``(owner, field)`` for each option field of ``cls``: its own, and those of a nested config field
    (flattened, in place); a TypeError when two share a name (one option each)."""
    found: list[tuple[type, dataclasses.Field[Any]]] = []
    for field in dataclasses.fields(cls):
        nested = _nested(cls, field)
        found.extend(config_fields(nested) if nested else [(cls, field)])
    names = [field.name for _, field in found]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise TypeError(f"{cls.__name__}: {twice} are fields of two of its configs: one option each")
    return found


def _build(cls: type, values: dict[str, Any]) -> Any:
    """``cls`` from the option ``values`` it names (nested configs built from theirs); absent: its default."""
    kwargs = {}
    for field in dataclasses.fields(cls):
        nested = _nested(cls, field)
        if nested:
            kwargs[field.name] = _build(nested, values)
        elif field.name in values:
            kwargs[field.name] = values[field.name]
    return cls(**kwargs)


def config_parameters(
    cls: type, exclude: Iterable[str] = (), options: dict[str, Opt] | None = None
) -> list[inspect.Parameter]:
    """One keyword-only ``Annotated[type, typer.Option(...)]`` parameter per field of ``cls`` not excluded
    (a nested config's fields included: ``config_fields``).

    Raises TypeError for a field without a docstring (no option without help), an excluded field without a
    default (the config could not be built), or an ``options`` key that is not a field (a typo)."""
    options = options or {}
    fields = config_fields(cls)
    excluded = set(exclude)
    unknown = (set(options) | excluded) - {field.name for _, field in fields}
    if unknown:
        raise TypeError(f"{cls.__name__} has no fields {sorted(unknown)}")
    parameters = []
    for owner, field in fields:
        name = field.name
        where = f"{owner.__name__}.{name}"
        if name in excluded:
            if field.default is _MISSING and field.default_factory is _MISSING:
                raise TypeError(f"{where} is excluded from the CLI but has no default")
            continue
        docs = field_docs(owner)
        if name not in docs:
            raise TypeError(f'{where} has no docstring: write its --help as a """string""" after the field')
        extra = options.get(name, Opt())
        help_text = f"{docs[name]} {extra.more_help}".strip()
        option = typer.Option(
            *([extra.name] if extra.name else []),
            help=help_text,
            min=extra.min,
            max=extra.max,
            hidden=extra.hidden,
            metavar=extra.metavar,
        )
        default = field.default if extra.default is _CONFIG_DEFAULT else extra.default
        parameters.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=Annotated[_option_type(typing.get_type_hints(owner)[name], where), option],
                default=inspect.Parameter.empty if default is _MISSING else default,
            )
        )
    return parameters


def from_config(
    cls: type, *, exclude: Iterable[str] = (), **options: Opt
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command body ``def body(config: cls, **own)`` into a typer command: ``cls``'s fields become
    options (after the body's own, hand-written parameters) and the body gets ``cls(**those values)``.

    ``config`` is the body's first parameter; the others keep their ``Annotated[..., typer.Option()]``
    declarations (arguments, options no config holds). An excluded field the body declares itself (an
    argument: ``predict``'s images) is passed to the config, and to the body as declared."""
    config_params = config_parameters(cls, exclude, options)
    names = [param.name for param in config_params]
    excluded = set(exclude)

    def decorate(body: Callable[..., Any]) -> Callable[..., Any]:
        own = list(inspect.signature(body, eval_str=True).parameters.values())[1:]
        clash = {param.name for param in own} & set(names)
        if clash:
            raise TypeError(f"{body.__name__}: {sorted(clash)} are {cls.__name__} fields already")
        declared = [param.name for param in own if param.name in excluded]

        def command(**values: Any) -> Any:
            config = _build(
                cls,
                {**{name: values.pop(name) for name in names}, **{name: values[name] for name in declared}},
            )
            return body(config, **values)

        params = [param.replace(kind=inspect.Parameter.KEYWORD_ONLY) for param in own] + config_params
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {param.name: param.annotation for param in params}
        command.__name__ = body.__name__
        command.__qualname__ = body.__qualname__
        command.__doc__ = body.__doc__
        command.__module__ = body.__module__
        return command

    return decorate


def fail(message: str, code: int = 2) -> NoReturn:
    """End a command with one line, ``error: <message>``, on stderr, and exit ``code`` (2: a user error)."""
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code)
