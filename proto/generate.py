"""Generate the Python code of the protobuf contracts into runplane/v1/.

``python proto/generate.py`` writes it; ``--check`` fails when the committed code is stale.
"""

from __future__ import annotations

import filecmp
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_SUBDIR = Path("runplane") / "v1"
BIN = Path(sys.executable).parent  # the plugins mypy-protobuf installs next to python


def generate(out_root: Path) -> list[Path]:
    sources = sorted(str(p.relative_to(PROTO_DIR)) for p in (PROTO_DIR / "runplane" / "v1").glob("*.proto"))
    well_known = str(resources.files("grpc_tools").joinpath("_proto"))
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--plugin=protoc-gen-mypy={BIN / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={BIN / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    out = out_root / OUT_SUBDIR
    (out / "__init__.py").write_text('"""Generated from proto/runplane/v1: do not edit; run `make proto`."""\n')
    return sorted(p for p in out.iterdir() if p.is_file())


def main() -> int:
    if "--check" in sys.argv[1:]:
        with tempfile.TemporaryDirectory() as tmp:
            fresh = generate(Path(tmp))
            committed = ROOT / OUT_SUBDIR
            stale = [
                f.name
                for f in fresh
                if not (committed / f.name).exists() or not filecmp.cmp(f, committed / f.name, shallow=False)
            ]
            extra = sorted({p.name for p in committed.glob("*") if p.is_file()} - {f.name for f in fresh})
            if stale or extra:
                print(f"generated protobuf code is stale: {stale + extra}; run `make proto`", file=sys.stderr)
                return 1
        print("generated protobuf code is fresh")
        return 0
    for path in generate(ROOT):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
