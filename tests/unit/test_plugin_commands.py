"""What plugins contribute to the ``fanout`` command: sub-commands
(``fanout_cli_commands``) and embedded servers (``fanout_embedded_services``), with fake
plugins on a fresh registry per test; plus the real fanout-postgres ``migrate`` command."""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fanout import hookimpl
from fanout.app import cli
from fanout.app.demo.services import demo_services
from fanout.errors import ConfigurationError, FanoutError, PluginError
from fanout.hooks.commands import CliCommand
from fanout.hooks.registry import load_registry
from fanout.hooks.services import EmbeddedService

CORE = {"run", "validate", "dev", "plugins", "status", "recover", "ledger", "demo"}


def _hello(args: argparse.Namespace) -> int:
    if args.who == "config":
        raise ConfigurationError("bad --who")
    if args.who == "fail":
        raise FanoutError("it failed")
    print(f"hello {args.who}")
    return 0


HELLO = CliCommand(
    name="hello",
    help="say hello from a plugin",
    add_arguments=lambda parser: parser.add_argument("--who", default="world"),
    run=_hello,
)


class Commands:
    """A plugin contributing commands."""

    def __init__(self, *commands: object) -> None:
        self.commands = list(commands)

    @hookimpl
    def fanout_cli_commands(self) -> list[object]:
        return self.commands


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The plugins ``fanout`` sees as installed, in place of the real entry points."""
    plugins: list[object] = []
    monkeypatch.setattr(cli, "installed_plugins", lambda: load_registry(plugins, entry_points_=[]))
    return plugins


def test_help_lists_a_plugin_command_only_when_its_plugin_is_installed(
    installed: list[object], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "hello" not in capsys.readouterr().out
    installed.append(Commands(HELLO))
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "hello               say hello from a plugin" in capsys.readouterr().out


def test_a_plugin_command_runs_with_the_core_exit_codes(
    installed: list[object], capsys: pytest.CaptureFixture[str]
) -> None:
    installed.append(Commands(HELLO))
    assert cli.main(["hello", "--who", "you"]) == 0
    assert capsys.readouterr().out == "hello you\n"
    assert cli.main(["hello", "--who", "config"]) == 2
    assert "fanout: configuration error: bad --who" in capsys.readouterr().err
    assert cli.main(["hello", "--who", "fail"]) == 1
    assert "fanout: FanoutError: it failed" in capsys.readouterr().err


def test_a_plugin_may_not_take_a_core_command_or_another_plugins(
    installed: list[object], capsys: pytest.CaptureFixture[str]
) -> None:
    status = CliCommand("status", "mine", lambda parser: None, lambda args: 0)
    with pytest.raises(PluginError, match="fanout command 'status' is one of the core's"):
        load_registry([Commands(status)], entry_points_=[]).cli_commands(CORE)
    twice = load_registry([Commands(HELLO), Commands(HELLO)], entry_points_=[])
    with pytest.raises(PluginError, match="fanout command 'hello' is provided by both"):
        twice.cli_commands(CORE)
    installed.extend([Commands(HELLO), Commands(HELLO)])
    assert cli.main(["status", "--ledger", "x"]) == 1
    assert "fanout command 'hello' is provided by both" in capsys.readouterr().err


def test_a_command_missing_with_its_broken_plugin_says_why(
    installed: list[object], capsys: pytest.CaptureFixture[str]
) -> None:
    from fanout import hookimpl as impl

    class Broken:
        @impl
        def fanout_sink_type(self) -> None:  # a typo: the plugin is refused
            ...

    installed.append(Broken())
    with pytest.raises(SystemExit) as exit_:
        cli.main(["hello"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'hello'" in err
    assert "fanout: note: Error importing plugin" in err and "fanout_sink_type" in err


def test_a_plugin_command_must_be_a_cli_command() -> None:
    registry = load_registry([Commands("migrate")], entry_points_=[])
    with pytest.raises(PluginError, match="not a fanout.hooks.commands.CliCommand"):
        registry.cli_commands(CORE)


@pytest.mark.skipif(
    importlib.util.find_spec("fanout_postgres") is None, reason="fanout-postgres not installed"
)
def test_migrate_comes_with_the_postgres_plugin(capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.build_parser()
    assert "migrate" in parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    without = cli.build_parser(load_registry(entry_points_=[]))
    assert "migrate" not in without._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert cli.main(["migrate", "--url", "not a url"]) == 2
    assert "--url is not a SQLAlchemy URL" in capsys.readouterr().err
    # read as the sink reads its url: the whole URL, or any part, may be ${VAR}
    assert cli.main(["migrate", "--url", "${FANOUT_TEST_UNSET_URL}"]) == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith(
            "--url: environment variable 'FANOUT_TEST_UNSET_URL' is referenced but not set; "
            "export FANOUT_TEST_UNSET_URL=... before starting the pipeline"
        )
    )
    assert cli.main(["migrate", "--url", "postgresql://app@${FANOUT_TEST_UNSET_HOST}/db"]) == 2
    assert "--url (host): environment variable 'FANOUT_TEST_UNSET_HOST'" in capsys.readouterr().err
    assert cli.main(["migrate", "--url", "mysql://app@db/orders"]) == 2
    assert "--url uses driver 'mysql'" in capsys.readouterr().err


# -- embedded services ------------------------------------------------------------------


class Services:
    """A plugin contributing embedded servers that record their life."""

    def __init__(self, *names: str, fail: str = "") -> None:
        self.events: list[str] = []
        self.names = names
        self.fail = fail

    @hookimpl
    def fanout_embedded_services(self) -> list[EmbeddedService]:
        return [
            EmbeddedService(name, name.title(), f"FANOUT_{name.upper()}", self._starter(name))
            for name in self.names
        ]

    def _starter(self, name: str) -> object:
        @contextmanager
        def start(root: Path) -> Iterator[str]:
            if name == self.fail:
                raise RuntimeError(f"{name} binary missing")
            self.events.append(f"start {name} in {root.name}")
            yield f"{name}://{root.name}"
            self.events.append(f"stop {name}")

        return start


def test_the_demo_starts_the_plugins_servers_it_needs(tmp_path: Path) -> None:
    plugin = Services("postgres", "kafka")
    embedded = load_registry([plugin], entry_points_=[]).embedded_services()
    assert sorted(embedded) == ["kafka", "postgres"]
    types = {"postgres": object(), "kafka": object(), "delta": object()}
    with demo_services(tmp_path, types, embedded) as services:
        assert services.postgres_url == f"postgres://{tmp_path.name}"
        assert services.kafka_bootstrap == f"kafka://{tmp_path.name}"
        assert services.notes == []
        assert plugin.events == [
            f"start postgres in {tmp_path.name}",
            f"start kafka in {tmp_path.name}",
        ]
    assert plugin.events[2:] == ["stop kafka", "stop postgres"]


def test_the_demo_goes_on_without_a_server_that_cannot_start(tmp_path: Path) -> None:
    plugin = Services("postgres", "kafka", fail="kafka")
    embedded = load_registry([plugin], entry_points_=[]).embedded_services()
    types = {"postgres": object(), "kafka": object()}
    with demo_services(tmp_path, types, embedded, postgres_url="postgresql://given") as services:
        assert services.postgres_url == "postgresql://given"  # given: not started
        assert services.kafka_bootstrap is None
        assert services.notes == [
            "Kafka left out: cannot start the embedded server (kafka binary missing)"
        ]
    assert plugin.events == []
    with demo_services(tmp_path, {"delta": object()}, embedded) as services:
        assert services.sinks() == []
        assert services.notes == [
            "PostgreSQL left out: pip install ./plugins/fanout-postgres",
            "Kafka left out: pip install ./plugins/fanout-kafka",
        ]


def test_two_plugins_serving_one_name_is_an_error() -> None:
    registry = load_registry([Services("postgres"), Services("postgres")], entry_points_=[])
    with pytest.raises(PluginError, match="embedded service 'postgres' is provided by both"):
        registry.embedded_services()


def test_the_installed_plugins_serve_their_sink_types() -> None:
    registry = load_registry()
    services = registry.embedded_services()
    for name, service in services.items():
        assert name in registry.sink_types()
        assert service.env_var.startswith("FANOUT_")
    if importlib.util.find_spec("fanout_postgres"):
        assert services["postgres"].env_var == "FANOUT_PG_URL"
    if importlib.util.find_spec("fanout_kafka"):
        assert services["kafka"].env_var == "FANOUT_KAFKA_BOOTSTRAP"


def test_the_postgres_wheel_ships_its_alembic_environment() -> None:
    """Every file of ``fanout_postgres/migrations`` is in the plugin's wheel: its folders
    are packages (found by ``packages.find``) and its other files are package data."""
    import fnmatch
    import tomllib

    plugin = Path(__file__).resolve().parents[2] / "plugins" / "fanout-postgres"
    setuptools = tomllib.loads((plugin / "pyproject.toml").read_text())["tool"]["setuptools"]
    data = setuptools["package-data"]
    root = plugin / "fanout_postgres" / "migrations"
    files = [p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert {p.name for p in files} >= {"env.py", "alembic.ini", "script.py.mako"}
    for path in files:
        package = ".".join(path.parent.relative_to(plugin).parts)
        assert (path.parent / "__init__.py").is_file(), f"{package} is not a package"
        if path.suffix != ".py":
            patterns = data.get(package, [])
            assert any(fnmatch.fnmatch(path.name, p) for p in patterns), f"{path} not shipped"
    assert not (Path(__file__).resolve().parents[2] / "migrations").exists()
