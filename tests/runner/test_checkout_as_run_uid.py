"""A run's own uid clones the project from a local repository another user (the control plane) owns."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from runner.checkout import local_trust

RUN_UID = 200_123  # a uid of the range runs take by default, owned by no account on the machine


def _as_run_uid(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    base = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}
    return subprocess.run(
        ["setpriv", f"--reuid={RUN_UID}", f"--regid={RUN_UID}", "--clear-groups", *args],
        env={**base, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to a run's uid needs root, as the dispatcher does")
def test_a_run_uid_clones_a_local_repository_another_user_owns() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        base.chmod(0o755)
        repo = base / "jaffle"
        repo.mkdir()
        (repo / "dbt_project.yml").write_text("name: jaffle\n")
        identity = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]
        for args in (["init", "--quiet", "--initial-branch=main"], ["add", "-A"], [*identity, "commit", "-qm", "one"]):
            subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
        work = base / "run"
        work.mkdir()
        os.chown(work, RUN_UID, RUN_UID)

        for url in (f"file://{repo}", str(repo)):
            refused = _as_run_uid(["git", "clone", "--mirror", "--quiet", url, "plain"], {}, work)
            assert refused.returncode != 0 and "dubious ownership" in refused.stderr, refused.stderr
            config = base / "gitconfig"
            config.write_text(local_trust(url))  # the runner, as the run's uid, writes its own
            config.chmod(0o644)
            cloned = _as_run_uid(
                ["git", "clone", "--mirror", "--quiet", url, "trusted"], {"GIT_CONFIG_GLOBAL": str(config)}, work
            )
            assert cloned.returncode == 0, cloned.stderr
            subprocess.run(["rm", "-rf", str(work / "trusted")], check=True)


def test_only_local_repositories_are_trusted() -> None:
    assert local_trust("https://github.com/acme/jaffle.git") == ""
    assert local_trust("git@github.com:acme/jaffle.git") == ""
    assert local_trust("file:///srv/git/jaffle/") == (
        '[safe]\n\tdirectory = "/srv/git/jaffle"\n\tdirectory = "/srv/git/jaffle/.git"\n'
    )
    assert local_trust('/srv/a "b"\\c') == (
        '[safe]\n\tdirectory = "/srv/a \\"b\\"\\\\c"\n\tdirectory = "/srv/a \\"b\\"\\\\c/.git"\n'
    )
