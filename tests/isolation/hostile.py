"""Run as a step (plain ``python3 -I``, standard library only): what a hostile tenant tries on one machine.

``python3 -I hostile.py <attack> [arguments]`` prints one line ``HOSTILE {json}`` with what it
tried and what happened; the tests read it from the run's log.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path


def report(result: object) -> None:
    print("HOSTILE " + json.dumps(result), flush=True)


def unix_address(target: str) -> str:
    """A Unix socket's address: a path, or ``@name`` for an abstract socket (a name starting with NUL)."""
    return "\0" + target[1:] if target.startswith("@") else target


def connect(targets: list[str]) -> dict[str, str]:
    """``host:port`` over TCP, or a Unix socket: a path, or ``@name`` (abstract)."""
    outcome = {}
    for target in targets:
        try:
            if target.startswith(("/", "@")):
                with socket.socket(socket.AF_UNIX) as sock:
                    sock.settimeout(3)
                    sock.connect(unix_address(target))
            else:
                host, port = target.rsplit(":", 1)
                socket.create_connection((host, int(port)), timeout=3).close()
            outcome[target] = "connected"
        except OSError as exc:
            outcome[target] = f"refused: {exc.strerror or exc}"
    return outcome


def listen(marker: str) -> dict[str, str]:
    """Listen on ``@marker`` (abstract) and ``/tmp/<marker>.sock`` (open to every uid), say so, and
    keep listening (a minute at most) until ``/tmp/<marker>.seen`` exists: the test has tried them
    from elsewhere. The step's own connection to each is reported too: a run keeps its own sockets."""
    path = Path("/tmp") / f"{marker}.sock"
    listeners = []
    for target in (f"@{marker}", str(path)):
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(unix_address(target))
        sock.listen()
        listeners.append(sock)
    path.chmod(0o777)
    outcome = {f"own {target}": result for target, result in connect([f"@{marker}", str(path)]).items()}
    report(outcome)
    seen = Path("/tmp") / f"{marker}.seen"
    deadline = time.monotonic() + 60
    while not seen.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    for sock in listeners:
        sock.close()
    return {"seen": str(seen.exists())}


def places(marker: str) -> dict[str, Path]:
    work_parent = Path.cwd().parent
    return {
        "tmp": Path("/tmp") / marker,
        "var_tmp": Path("/var/tmp") / marker,
        "dev_shm": Path("/dev/shm") / marker,
        "home": Path(os.environ["HOME"]) / marker,
        "beside_work_dir": work_parent / f"{marker}-kept" / "secret",
    }


def plant(marker: str) -> dict[str, str]:
    written = {}
    for name, path in places(marker).items():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"left by an earlier run: {marker}\n")
            path.chmod(0o600)
            written[name] = "written"
        except OSError as exc:
            written[name] = f"failed: {exc.strerror}"
    os.chmod(places(marker)["beside_work_dir"].parent, 0)  # made unremovable, as far as its uid goes
    return written


def read(marker: str) -> dict[str, str]:
    found = {}
    for name, path in places(marker).items():
        try:
            if name == "beside_work_dir" and path.parent.exists():
                os.chmod(path.parent, 0o700)
            found[name] = path.read_text().strip()
        except OSError as exc:
            found[name] = f"gone: {exc.strerror}"
    return found


def daemon(marker: str) -> dict[str, str]:
    """Double fork and setsid: a grandchild in a session of its own, named ``marker``, sleeping. The
    step waits (a minute at most) for ``/tmp/<marker>.seen``: the test has looked at it."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.execv("/bin/sleep", [marker, "300"])
        os._exit(0)
    os.wait()
    seen = Path("/tmp") / f"{marker}.seen"
    deadline = time.monotonic() + 60
    while not seen.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return {"seen": str(seen.exists())}


def squat(other_uid: str) -> dict[str, str]:
    """Make the HOME the next uid will get (this run's own, with the other uid in its name), and keep
    filling it from a daemon."""
    own = str(os.getuid())
    home = Path(os.environ["HOME"].replace(own, other_uid))
    try:
        home.mkdir(parents=True, exist_ok=True)
        (home / "planted").write_text("squatter\n")
        made = "made"
    except OSError as exc:
        return {"home": str(home), "made": f"failed: {exc.strerror}"}
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            deadline = time.monotonic() + 120
            index = 0
            while time.monotonic() < deadline:
                try:
                    home.mkdir(parents=True, exist_ok=True)
                    (home / f"f{index % 50}").write_text("x")
                except OSError:
                    pass
                index += 1
            os._exit(0)
        os._exit(0)
    os.wait()
    return {"home": str(home), "made": made}


def signal_runner() -> dict[str, str]:
    """SIGTERM to every process of this uid it can see outside the step's own process group: its
    runner, unless something hides it."""
    outcome = {}
    targets = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == os.getuid() and os.getpgid(int(name)) != os.getpgid(0):
                    targets.add(int(name))
            except OSError:
                continue
    for pid in sorted(targets):
        try:
            os.kill(pid, signal.SIGTERM)
            outcome[str(pid)] = "signalled"
        except OSError as exc:
            outcome[str(pid)] = f"refused: {exc.strerror}"
    return outcome


def cmdlines(reversed_needle: str) -> dict[str, object]:
    """Command lines holding the needle (given reversed, so this step's own do not)."""
    needle = reversed_needle[::-1]
    seen = 0
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            text = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        seen += 1
        if needle in text:
            found.append(text)
    return {"seen": seen, "found": found}


def leave(marker: str, directories: list[str]) -> dict[str, str]:
    """In each directory, a file closed to others and a listening socket open to all, left behind."""
    outcome = {}
    for directory in directories:
        path = Path(directory) / marker
        try:
            path.write_text(f"left by an earlier run: {marker}\n")
            path.chmod(0o600)
            sock = socket.socket(socket.AF_UNIX)
            sock.bind(f"{path}.sock")
            sock.listen()
            os.chmod(f"{path}.sock", 0o777)
            outcome[directory] = "left"
        except OSError as exc:
            outcome[directory] = f"failed: {exc.strerror}"
    return outcome


def find(marker: str, directories: list[str]) -> dict[str, str]:
    """What of ``leave``'s file and socket this step reads or reaches."""
    outcome = {}
    for directory in directories:
        path = Path(directory) / marker
        try:
            outcome[f"{directory} file"] = path.read_text().strip()
        except OSError as exc:
            outcome[f"{directory} file"] = f"gone: {exc.strerror}"
        outcome[f"{directory} socket"] = connect([f"{path}.sock"])[f"{path}.sock"]
    return outcome


def send_datagram(target: str) -> dict[str, str]:
    """One UDP datagram (a DNS query's transport) to ``host:port``."""
    host, port = target.rsplit(":", 1)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"runplane-hostile", (host, int(port)))
        return {target: "sent"}
    except OSError as exc:
        return {target: f"refused: {exc.strerror or exc}"}


def flood(target: str, attempts: str, marker: str) -> dict[str, int]:
    """Open up to ``attempts`` TCP connections to ``host:port`` and hold them; say so in
    ``/tmp/<marker>.flooding``, then keep them (a minute at most) until ``/tmp/<marker>.seen`` exists."""
    host, port = target.rsplit(":", 1)
    held = []
    refused = 0
    for _ in range(int(attempts)):
        try:
            held.append(socket.create_connection((host, int(port)), timeout=3))
        except OSError:
            refused += 1
    Path("/tmp", f"{marker}.flooding").write_text(f"{len(held)}\n")
    seen = Path("/tmp") / f"{marker}.seen"
    deadline = time.monotonic() + 60
    while not seen.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    for sock in held:
        sock.close()
    return {"connected": len(held), "refused": refused}


def spin(seconds: str, loops: str = "1") -> dict[str, float]:
    """Keep ``loops`` CPUs busy (processes of their own) for ``seconds`` of wall time; the CPU time
    they got, in all and per loop."""
    deadline = time.monotonic() + float(seconds)
    children = []
    for _ in range(int(loops) - 1):
        pid = os.fork()
        if pid == 0:
            while time.monotonic() < deadline:
                pass
            os._exit(0)
        children.append(pid)
    while time.monotonic() < deadline:
        pass
    for pid in children:
        os.waitpid(pid, 0)
    own = time.process_time()
    waited = os.times()
    total = own + waited.children_user + waited.children_system
    return {"wall": float(seconds), "cpu": total, "per_loop": total / int(loops)}


def main() -> None:
    attack, *arguments = sys.argv[1:]
    match attack:
        case "connect":
            report(connect(arguments))
        case "listen":
            report(listen(arguments[0]))
        case "plant":
            report(plant(arguments[0]))
        case "read":
            report(read(arguments[0]))
        case "daemon":
            report(daemon(arguments[0]))
        case "squat":
            report(squat(arguments[0]))
        case "signal":
            report(signal_runner())
            time.sleep(1)
            print("the runner survived", flush=True)
        case "cmdlines":
            report(cmdlines(arguments[0]))
        case "leave":
            report(leave(arguments[0], arguments[1:]))
        case "find":
            report(find(arguments[0], arguments[1:]))
        case "datagram":
            report(send_datagram(arguments[0]))
        case "flood":
            report(flood(*arguments))
        case "spin":
            report(spin(*arguments))
        case _:
            raise SystemExit(f"unknown attack {attack}")


if __name__ == "__main__":
    main()
