"""A pre-loaded runner that forks one child per run: prep time in milliseconds on one machine.

A fresh ``runplane runner`` process spends most of a second (and as much CPU) importing before it
can claim its run; at ten runs a second that alone saturates a small machine. The local launcher
therefore keeps one of these per dispatcher: it imports everything once and says ``ready``; then
for every line ``<run_id> <token>`` on stdin it forks a child that executes :func:`runner.service.run`
in its own session, and answers ``<run_id> <pid>`` on stdout. EOF on stdin (its dispatcher went
away) ends the server; the children carry on, each holding its own lease.

Started as ``python -m runner.fork_server`` with the runner's allow-listed environment (no
control-plane credential); the tokens arrive only through the pipe. The server keeps no token: a
child drops the others' (there are none: each line is read, forked and forgotten).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys

from runner.service import become_run_user, run
from runplane import logs
from runplane.settings import Settings


def _reap(_signum: int = 0, _frame: object = None) -> None:
    """Collect finished children so they do not linger as zombies."""
    with contextlib.suppress(ChildProcessError):
        while True:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return


def _child(settings: Settings, run_id: int, token: str) -> None:
    """In the forked child: become an ordinary runner process, then exit with the run's code."""
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(2, 1)  # stdout is the launcher's pipe: the run must never write into it
        os.close(devnull)
        become_run_user(settings.runner, run_id)
        from runplane.tracing import setup_tracing, shutdown_tracing

        setup_tracing("runner", settings.otlp_endpoint)
        try:
            code = asyncio.run(run(settings, run_id, token))
        finally:
            shutdown_tracing()
    except BaseException as exc:  # the child must never return into the server's loop
        print(f"runner for run {run_id} failed: {exc!r}", file=sys.stderr, flush=True)
    finally:
        os._exit(code)


def main() -> int:
    settings = Settings()
    logs.configure("runner", fmt=settings.log_format, level=settings.log_level)
    signal.signal(signal.SIGCHLD, _reap)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the dispatcher; EOF stops us
    answers = sys.stdout
    answers.write("ready\n")  # everything is imported: forks from here on are fast
    answers.flush()
    for line in sys.stdin:
        text = line.strip()
        if not text:
            continue
        head, _, token = text.partition(" ")
        try:
            run_id = int(head)
        except ValueError:
            run_id = 0
        if run_id <= 0 or not token.strip():
            print("fork server: expected '<run_id> <token>'", file=sys.stderr, flush=True)  # never echo a token
            answers.write(f"{head if run_id > 0 else 0} 0\n")
            answers.flush()
            continue
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(settings, run_id, token.strip())
        answers.write(f"{run_id} {pid}\n")
        answers.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
