"""tpustream/cli/options.py: a config dataclass becomes typer options, its field docstrings their help."""

import dataclasses
import importlib.util
import sys
import textwrap
from dataclasses import dataclass
from typing import Annotated, Literal

import pytest
import typer
from typer.testing import CliRunner

from tpustream.cli.options import Opt, config_parameters, field_docs, from_config

runner = CliRunner()


@dataclass(frozen=True, kw_only=True)
class Sample:
    """A config with every option type the helper maps."""

    data: str
    """Where the data is."""
    # a comment between a field and its docstring's neighbour is not a docstring
    epochs: int = 10
    """Epochs to run,
    on two lines."""
    rate: float = 0.5
    """A rate."""
    fast: bool = False
    """Go fast."""
    size: int | None = None
    """A size (default: chosen)."""
    mode: Literal["a", "b"] = "a"
    """a or b."""
    as_json: bool = False
    """Print JSON."""
    internal: int = 3
    """Not on the command line."""

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"epochs must be at least 1, got {self.epochs}")


def _squeezed(text: str) -> str:
    """Help text without rich's box and line breaks, to find a sentence wrapped over its table cells."""
    return "".join(text.replace("│", "").split())


def _app(command: object) -> typer.Typer:
    app = typer.Typer()
    app.command("run")(command)  # type: ignore[arg-type]
    app.command("noop")(lambda: None)  # two commands: "run" stays a subcommand
    return app


def test_field_docs_are_the_strings_after_the_fields() -> None:
    docs = field_docs(Sample)
    assert docs["data"] == "Where the data is."
    assert docs["epochs"] == "Epochs to run, on two lines."  # cleaned into one paragraph
    assert set(docs) == {field.name for field in dataclasses.fields(Sample)}


def test_a_subclass_keeps_its_bases_docstrings() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Longer(Sample):
        epochs: int = 90
        extra: str = ""
        """Only here."""

    docs = field_docs(Longer)
    assert docs["epochs"] == "Epochs to run, on two lines." and docs["extra"] == "Only here."
    epochs = {param.name: param for param in config_parameters(Longer)}["epochs"]
    assert epochs.default == 90


def test_options_take_the_fields_types_defaults_and_bounds() -> None:
    seen = []

    @from_config(Sample, exclude={"internal"}, as_json=Opt(name="--json"), epochs=Opt(min=1))
    def run(config: Sample, verbose: Annotated[bool, typer.Option(help="Talk.")] = False) -> None:
        """Run it."""
        seen.append((config, verbose))

    app = _app(run)
    args = ["run", "--data", "d", "--epochs", "3", "--rate", "0.25", "--fast", "--size", "7", "--mode", "b"]
    result = runner.invoke(app, [*args, "--json", "--verbose"])
    assert result.exit_code == 0, result.output
    assert seen == [(Sample(data="d", epochs=3, rate=0.25, fast=True, size=7, mode="b", as_json=True), True)]
    assert runner.invoke(app, ["run", "--data", "d"]).exit_code == 0
    assert seen[-1] == (Sample(data="d"), False)  # every default is the config's
    assert runner.invoke(app, ["run"]).exit_code == 2  # a field without a default is a required option
    assert runner.invoke(app, ["run", "--data", "d", "--epochs", "0"]).exit_code == 2  # min=1: click refuses
    assert runner.invoke(app, ["run", "--data", "d", "--mode", "c"]).exit_code == 2  # Literal: the choices
    assert runner.invoke(app, ["run", "--data", "d", "--internal", "4"]).exit_code == 2  # excluded
    help_text = _squeezed(runner.invoke(app, ["run", "--help"]).output)
    assert _squeezed("Epochs to run, on two lines.") in help_text and "Runit." in help_text


def test_a_cli_default_and_more_help() -> None:
    @from_config(Sample, epochs=Opt(default=2, more_help="Two here."))
    def run(config: Sample) -> None:
        typer.echo(config.epochs)

    app = _app(run)
    assert runner.invoke(app, ["run", "--data", "d"]).output.strip() == "2"
    help_text = _squeezed(runner.invoke(app, ["run", "--help"]).output)
    assert _squeezed("Epochs to run, on two lines. Two here.") in help_text and "[default:2]" in help_text


def test_a_changed_default_in_the_dataclass_is_the_new_default_in_help(tmp_path, monkeypatch) -> None:
    """The option has no default of its own: edit the field and --help says the new one."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def help_for(epochs: int) -> str:
        name = f"sample_config_{epochs}"
        (tmp_path / f"{name}.py").write_text(
            textwrap.dedent(f'''
                from dataclasses import dataclass

                @dataclass(frozen=True, kw_only=True)
                class Config:
                    epochs: int = {epochs}
                    """Epochs."""
            ''')
        )
        spec = importlib.util.spec_from_file_location(name, tmp_path / f"{name}.py")
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        monkeypatch.setitem(sys.modules, name, module)  # dataclasses and inspect.getsource look it up
        spec.loader.exec_module(module)  # type: ignore[union-attr]

        @from_config(module.Config)
        def run(config: object) -> None:
            pass

        return _squeezed(runner.invoke(_app(run), ["run", "--help"]).output)

    assert "[default:10]" in help_for(10)
    assert "[default:12]" in help_for(12)


def test_every_option_has_help_or_the_command_is_not_built() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Undocumented:
        epochs: int = 10
        """Epochs."""
        seed: int = 0  # a comment is no help

    with pytest.raises(TypeError, match=r"Undocumented.seed has no docstring"):
        from_config(Undocumented)


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: from_config(Sample, exclude={"data"}),
            "Sample.data is excluded from the CLI but has no default",
        ),
        (lambda: from_config(Sample, epoch=Opt(min=1)), r"Sample has no fields \['epoch'\]"),
    ],
)
def test_a_misdeclared_command_fails_when_declared(make, message) -> None:
    with pytest.raises(TypeError, match=message):
        make()


def test_a_type_typer_cannot_parse_from_one_value_is_refused() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Listy:
        names: tuple[str, ...] = ()
        """Names."""

    with pytest.raises(TypeError, match=r"Listy.names: type .* is not an option type"):
        from_config(Listy)


def test_a_body_parameter_named_like_a_field_is_refused() -> None:
    with pytest.raises(TypeError, match=r"\['epochs'\] are Sample fields already"):

        @from_config(Sample)
        def run(config: Sample, epochs: Annotated[int, typer.Option()] = 1) -> None:
            pass


def test_an_excluded_field_the_body_declares_goes_to_the_config() -> None:
    seen = []

    @from_config(Sample, exclude={"internal"})
    def run(config: Sample, internal: Annotated[int, typer.Argument(help="An argument.")]) -> None:
        seen.append(config)

    app = _app(run)
    assert runner.invoke(app, ["run", "7", "--data", "d", "--epochs", "4"]).exit_code == 0
    assert seen == [Sample(data="d", epochs=4, internal=7)]
    assert (
        runner.invoke(app, ["run", "7", "--data", "d", "--epochs", "0"]).exit_code != 0
    )  # the config's check
    assert len(seen) == 1


@dataclass(frozen=True, kw_only=True)
class Limits:
    """A config nested in another (as QualityFloor in PromotionPolicy)."""

    low: float | None = None
    """The lowest value."""
    high: float = 1.0
    """The highest value."""


@dataclass(frozen=True, kw_only=True)
class Outer:
    """A config holding a nested config and a repeatable option."""

    name: str = "x"
    """A name."""
    limits: Limits = dataclasses.field(default_factory=Limits)
    tags: list[str] | None = None
    """A tag (repeatable)."""


def test_a_nested_config_is_flattened_into_options_and_built_from_them() -> None:
    seen = []

    @from_config(Outer, low=Opt(min=0.0), tags=Opt(name="--tag", metavar="TAG"))
    def run(config: Outer) -> None:
        seen.append(config)

    app = _app(run)
    assert [param.name for param in config_parameters(Outer)] == ["name", "low", "high", "tags"]
    result = runner.invoke(app, ["run", "--low", "0.5", "--tag", "a", "--tag", "b"])
    assert result.exit_code == 0, result.output
    assert seen == [Outer(limits=Limits(low=0.5), tags=["a", "b"])]
    assert runner.invoke(app, ["run"]).exit_code == 0 and seen[-1] == Outer()  # the nested default
    assert runner.invoke(app, ["run", "--low", "-1"]).exit_code == 2  # Opt applies to a nested field
    help_text = _squeezed(runner.invoke(app, ["run", "--help"]).output)
    assert "Thelowestvalue." in help_text and "--tagTAG" in help_text


def test_two_nested_fields_of_one_name_are_refused() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Twice:
        high: float = 2.0
        """Also high."""
        limits: Limits = dataclasses.field(default_factory=Limits)

    with pytest.raises(TypeError, match=r"Twice: \['high'\] are fields of two of its configs"):
        from_config(Twice)
