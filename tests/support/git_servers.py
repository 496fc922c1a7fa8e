"""Git repositories and hosts for tests and benches: a dbt package as a local repository that runs
of other uids may read, and a host on loopback that accepts connections and never answers."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
from pathlib import Path

from runner.checkout import local_trust

IDENTITY = ["-c", "user.name=test", "-c", "user.email=test@runplane.invalid"]


def commit_all(path: Path, message: str) -> str:
    """Everything in ``path`` committed (the repository made on first use); the commit."""
    if not (path / ".git").exists():
        subprocess.run(["git", "-C", str(path), "init", "-q", "--initial-branch=main"], check=True, capture_output=True)
    for args in (["add", "-A"], [*IDENTITY, "commit", "-q", "-m", message]):
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)
    done = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    return done.stdout.strip()


def macro_package(root: Path, name: str = "bench_macros", macros: int = 20) -> str:
    """A dbt package of ``macros`` macros as the git repository ``root/name``; its commit."""
    package = root / name
    (package / "macros").mkdir(parents=True)
    (package / "dbt_project.yml").write_text(f"name: {name}\nversion: '1.0.0'\nconfig-version: 2\n")
    for index in range(macros):
        (package / "macros" / f"macro_{index}.sql").write_text(
            f"{{% macro {name}_{index}(x) %}}({{{{ x }}}} + {index}){{% endmacro %}}\n"
        )
    return commit_all(package, name)


def trusting(repository: Path) -> dict[str, str]:
    """Variables that let git (``dbt deps``, as a run's uid) read ``repository``, which another
    user owns: a local repository stands in for a git host, which the run's network fence keeps a
    run from reaching on loopback. Git takes the trust only from a global configuration (written
    beside the repository, readable by all)."""
    config = repository.with_name(f"{repository.name}.gitconfig")
    config.write_text(local_trust(str(repository)))
    config.chmod(0o644)
    return {"GIT_CONFIG_GLOBAL": str(config)}


class SilentGitServer:
    """Accepts connections on loopback and never answers: a clone from it waits until stopped."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="silent-git", daemon=True)

    def url(self, name: str) -> str:
        return f"git://127.0.0.1:{self.port}/{name}"

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = self._listener.accept()
                self.accepted.append(connection)

    def __enter__(self) -> SilentGitServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self._listener.close()
        for connection in self.accepted:
            connection.close()
        self._thread.join(timeout=5)
