"""Cuts the part of dbt Cloud's OpenAPI documents that runplane serves into ``dbt_cloud_openapi.json``.

The documents are ``openapi-v2.yaml`` and ``openapi-v3.yaml`` of github.com/dbt-labs/dbt-cloud-openapi-spec
(the commit is recorded in the output). Kept per served operation: its documented status codes, its
query parameters and its response schema; of the schemas only what a response check reads (types,
properties, items, enums, required). Run from a checkout of runplane:

    python tests/api/rest/spec/extract.py <spec checkout> <commit>
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).parent
KEEP = ("type", "format", "properties", "items", "required", "enum", "oneOf", "anyOf", "allOf", "$ref")
METHODS = ("get", "post", "put", "patch", "delete")


def shape(path: str) -> str:
    """A path with every parameter written ``{}``: how runplane's routes and the document's paths meet."""
    return re.sub(r"\{[^}]*\}", "{}", path)


def served_shapes() -> set[tuple[str, str]]:
    """(METHOD, path shape) of every REST route runplane's app has."""
    from api.rest.app import create_app

    app = create_app(store=None, pickups=None)  # type: ignore[arg-type]  # its OpenAPI only; nothing is called
    paths: dict[str, dict[str, Any]] = app.openapi()["paths"]
    return {(method.upper(), shape(path)) for path, item in paths.items() for method in item}


def pruned(schema: Any) -> Any:
    """``schema`` with only what a response check reads (its descriptions and examples left out)."""
    if isinstance(schema, list):
        return [pruned(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: pruned(v) for k, v in schema.items() if k in KEEP and k != "properties"}
    if "properties" in schema:
        out["properties"] = {name: pruned(v) for name, v in schema["properties"].items()}
    return out


def refs(schema: Any) -> set[str]:
    return set(re.findall(r"#/components/schemas/(\w+)", json.dumps(schema)))


def main(checkout: Path, commit: str) -> None:
    served = served_shapes()
    operations: list[dict[str, Any]] = []
    schemas: dict[str, Any] = {}
    documented = 0
    for document in ("openapi-v2.yaml", "openapi-v3.yaml"):
        spec = yaml.safe_load((checkout / document).read_text())
        components = spec["components"]["schemas"]
        for path, item in spec["paths"].items():
            for method in METHODS:
                if method not in item:
                    continue
                documented += 1
                if (method.upper(), shape(path)) not in served:
                    continue
                op = item[method]
                responses = {
                    code: pruned(r.get("content", {}).get("application/json", {}).get("schema"))
                    for code, r in op.get("responses", {}).items()
                }
                queries = sorted(p["name"] for p in op.get("parameters", []) if p.get("in") == "query")
                operations.append(
                    {"method": method.upper(), "path": path, "responses": responses, "query_parameters": queries}
                )
                todo = refs(responses)
                while todo:
                    name = todo.pop()
                    if name not in schemas:
                        schemas[name] = pruned(components[name])
                        todo |= refs(schemas[name])
    out = {
        "source": "https://github.com/dbt-labs/dbt-cloud-openapi-spec",
        "commit": commit,
        "documented_operations": documented,
        "operations": operations,
        "schemas": dict(sorted(schemas.items())),
    }
    (HERE / "dbt_cloud_openapi.json").write_text(json.dumps(out, indent=1, sort_keys=False) + "\n")
    print(f"{len(operations)} of {documented} documented operations served")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
