"""runplane's own dbt macros, added to a run's checkout (a worktree of this run alone) when it needs one.

A pull request's schema drop run (``DbtContext.drop_schema``) calls
``dbt run-operation runplane_drop_pull_request_schema``: the macro drops the run's target schema
through the adapter, with the environment's connection, so the warehouse is reached only from a
run. It refuses a schema that is not a pull request's: a production schema is never dropped.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from runner.profile import ProjectError
from runplane.basics.types import CI_SCHEMA_PREFIX
from runplane.dbt.context import DROP_SCHEMA_MACRO

DROP_SCHEMA_SQL = f"""\
{{% macro {DROP_SCHEMA_MACRO}() %}}
  {{%- if not target.schema.startswith('{CI_SCHEMA_PREFIX}') -%}}
    {{{{ exceptions.raise_compiler_error(
        "runplane drops only pull request schemas ({CI_SCHEMA_PREFIX}*), not " ~ target.schema) }}}}
  {{%- endif -%}}
  {{% do adapter.drop_schema(api.Relation.create(database=target.database, schema=target.schema)) %}}
  {{{{ log("dropped schema " ~ target.schema, info=True) }}}}
{{% endmacro %}}
"""


def macro_directory(project: Path) -> Path:
    """The first of the project's ``macro-paths`` (dbt's default: ``macros``)."""
    try:
        document = yaml.safe_load((project / "dbt_project.yml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ProjectError(f"dbt_project.yml cannot be read: {exc}") from exc
    paths = document.get("macro-paths") if isinstance(document, dict) else None
    first = paths[0] if isinstance(paths, list) and paths and isinstance(paths[0], str) else "macros"
    directory = (project / first).resolve()
    if not directory.is_relative_to(project.resolve()):
        raise ProjectError(f"macro-paths {first!r} is outside the project")
    return directory


def add_drop_schema_macro(project: Path) -> Path:
    """Write the drop macro into the project's macros; its path."""
    directory = macro_directory(project)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{DROP_SCHEMA_MACRO}.sql"
    path.write_text(DROP_SCHEMA_SQL, encoding="utf-8")
    return path
