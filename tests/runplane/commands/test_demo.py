"""The demo's git repository and warehouse belong to one install: two installs on one machine (one
user, one Postgres) never share them, and a restart keeps the repository and its commits."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from runplane.basics.settings import Settings
from runplane.commands.demo import EXAMPLE_PROJECT, demo_repository, demo_repository_path
from runplane.commands.demo_warehouse import DemoWarehouse


def _settings(dbname: str) -> Settings:
    return Settings(database_url=f"postgresql://postgres@127.0.0.1:5432/{dbname}")


def _head(path: Path, rev: str = "HEAD") -> str:
    return subprocess.run(["git", "-C", str(path), "rev-parse", rev], check=True, capture_output=True, text=True).stdout


def _example(path: Path, text: str) -> Path:
    (path / "models").mkdir(parents=True, exist_ok=True)
    (path / "dbt_project.yml").write_text("name: demo\n")
    (path / "models" / "a.sql").write_text(text)
    return path


def test_two_installs_of_one_user_get_repositories_of_their_own() -> None:
    one = demo_repository_path(_settings("runplane"), install=Path("/srv/one/examples/jaffle_shop"))
    other = demo_repository_path(_settings("runplane"), install=Path("/srv/two/examples/jaffle_shop"))
    other_database = demo_repository_path(_settings("runplane_b"), install=Path("/srv/one/examples/jaffle_shop"))
    assert len({one, other, other_database}) == 3


def test_two_installs_on_one_postgres_get_warehouses_of_their_own() -> None:
    one = DemoWarehouse.for_install(_settings("runplane"))
    other = DemoWarehouse.for_install(_settings("runplane_second"))
    assert one.directory != other.directory and one.port != other.port
    assert one == DemoWarehouse.for_install(_settings("runplane"))  # the same after a restart


def test_a_warehouse_whose_port_another_program_holds_starts_on_the_next_free_one() -> None:
    state = Path(tempfile.mkdtemp(prefix="rp-demo-warehouse-"))
    state.chmod(0o755)  # the cluster's owner (postgres, when run as root) enters it
    warehouse = DemoWarehouse.for_install(_settings(state.name), state=state)
    try:
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", warehouse.port))
            holder.listen()
            fields, password = warehouse.start()
            assert int(fields["port"]) != warehouse.port
            again, _ = warehouse.start()  # already running: the same cluster, where it listens
            assert again == fields
        with psycopg.connect(make_conninfo(**fields, password=password)) as conn:  # over TCP, with the password
            assert conn.execute("SELECT current_user").fetchone() == (fields["user"],)
    finally:
        warehouse.stop()
        shutil.rmtree(state, ignore_errors=True)


def test_a_warehouse_that_will_not_start_says_why_without_its_password() -> None:
    state = Path(tempfile.mkdtemp(prefix="rp-demo-warehouse-"))
    state.chmod(0o755)
    warehouse = DemoWarehouse.for_install(_settings(state.name), state=state)
    try:
        _, password = warehouse.start()
        warehouse.stop()
        with (warehouse.directory / "postgres.log").open("a") as log:  # as a failed ALTER ROLE leaves it
            log.write(f"STATEMENT:  ALTER ROLE \"warehouse\" LOGIN PASSWORD '{password}'\n")
        with (warehouse.data / "postgresql.conf").open("a") as conf:
            conf.write("no_such_setting = 1\n")
        with pytest.raises(RuntimeError, match="no_such_setting") as refused:
            warehouse.start()
        assert password not in str(refused.value)
        assert "****" in str(refused.value)
    finally:
        warehouse.stop()
        shutil.rmtree(state, ignore_errors=True)


def test_a_restart_keeps_the_repository_and_commits_only_a_change(tmp_path: Path) -> None:
    source = _example(tmp_path / "source", "select 1\n")
    repository = tmp_path / "demo" / "jaffle_shop"
    url = demo_repository(repository, source)
    assert url == f"file://{repository}"
    first = _head(repository)
    marker = repository / ".git" / "kept"
    marker.write_text("")

    demo_repository(repository, source)
    assert _head(repository) == first, "an unchanged example made a new commit"
    assert marker.exists(), "the repository was made again"

    (source / "models" / "a.sql").write_text("select 2\n")
    (source / "models" / "b.sql").write_text("select 3\n")
    demo_repository(repository, source)
    assert _head(repository) != first
    assert _head(repository, "HEAD~1") == first
    assert (repository / "models" / "a.sql").read_text() == "select 2\n"


def test_the_demo_finds_the_example_project() -> None:
    assert (EXAMPLE_PROJECT / "dbt_project.yml").is_file(), EXAMPLE_PROJECT
