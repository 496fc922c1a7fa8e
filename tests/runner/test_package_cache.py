"""The host's copy of what ``dbt deps`` installed: what an entry keeps, and what refuses it."""

from __future__ import annotations

import os
from pathlib import Path

from runner.package_cache import PackageCache, package_key


def _project(root: Path) -> Path:
    project = root / "project"
    (project / "dbt_packages" / "utils" / "macros").mkdir(parents=True)
    (project / "local_pkg").mkdir()
    (project / "packages.yml").write_text("packages:\n  - local: local_pkg\n")
    return project


def _store(tmp_path: Path, project: Path) -> tuple[str, Path]:
    cache = PackageCache(tmp_path / "cache")
    key = package_key(project, account_id=1, dbt_version="1.10", install_dir="dbt_packages")
    return cache.store(key, project, "dbt_packages", owner=None), cache.entry(key) / "tree"


def test_an_entry_keeps_files_without_special_bits_and_local_links_relative(tmp_path: Path) -> None:
    project = _project(tmp_path)
    macro = project / "dbt_packages" / "utils" / "macros" / "m.sql"
    macro.write_text("{% macro m() %}1{% endmacro %}")
    os.chmod(macro, 0o6777)
    os.symlink(project / "local_pkg", project / "dbt_packages" / "local_pkg")  # as dbt links a local: package

    reason, tree = _store(tmp_path, project)

    assert reason == ""
    kept = tree / "utils" / "macros" / "m.sql"
    assert kept.read_text() == "{% macro m() %}1{% endmacro %}"
    assert kept.stat().st_mode & 0o7777 == 0o755
    assert (kept.stat().st_uid, kept.stat().st_gid) == (0, 0)
    assert os.readlink(tree / "local_pkg") == "../local_pkg"


def test_a_link_out_of_the_project_or_a_device_refuses_the_entry(tmp_path: Path) -> None:
    project = _project(tmp_path)
    os.symlink("/etc", project / "dbt_packages" / "escape")
    reason, tree = _store(tmp_path, project)
    assert "links outside the project (/etc)" in reason
    assert not tree.exists()

    (project / "dbt_packages" / "escape").unlink()
    os.mkfifo(project / "dbt_packages" / "utils" / "pipe")
    reason, tree = _store(tmp_path, project)
    assert "is not a file, a directory or a symlink" in reason
    assert not tree.exists()
