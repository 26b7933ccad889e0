"""The README as a newcomer follows it: a fresh clone, command 1, then every "Turn it on" command.

The checkout is cloned into a temporary folder (with this checkout's uncommitted changes laid over
it, so a change is tested before it is committed). There the README's first command runs as
written, in a clean environment (system PATH, no PYTHONPATH, no venv): it must create ``.venv``
and pass the demo. Then the "Turn it on" block, read from README.md, runs one command at a time
in that shell state, with the system paths made temporary (``/var/run/infera-kvd.sock``,
``/nvme/kvd-long``) and small sizes:

* ``. .venv/bin/activate`` (or any line that sets the shell up) prefixes every later command;
* the daemon starts in the background and must serve on the socket (and stop cleanly at the end);
* the engine: in ``.venv`` (no vLLM) it must say in one line which extra to install, no traceback;
  with ``.venv-vllm032`` of this checkout (``scripts/setup.sh --all``) the same command with
  ``--help`` must reach vLLM's parser with our flags;
* ``kvd stat`` and ``kvd doctor`` must read that daemon; ``kvd top`` runs in a pseudo-terminal
  until it shows the daemon, then ``q`` must quit it with status 0.

A command of a kind this file does not know fails the test: a README change comes with its check.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import in_pty, pty_quit, pty_read_until

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
VLLM_VENV = REPO / ".venv-vllm032"
REQUIRE = os.environ.get("KVD_TEST_REQUIRE_TOOLS") == "1"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# the README's system paths and production sizes -> a temporary place and sizes a CI machine has
SIZES = {"16G": "64M", "256G": "256M"}
MODEL = "example-org/example-model"

pytestmark = pytest.mark.timeout(600)


# -- reading the README -----------------------------------------------------------------------------


def _blocks(section: str) -> list[str]:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"## {section}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```bash\n(.*?)```", text[start : end if end > 0 else None], re.S)


def commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comment and blank lines dropped."""
    out: list[str] = []
    pending = ""
    for line in block.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        out.append((pending + line.strip()).strip())
        pending = ""
    assert not pending, f"a command ends in a backslash: {pending!r}"
    return out


def command_1() -> str:
    (first, *_rest) = commands(_blocks("Two commands")[0])
    return first


def turn_it_on() -> list[str]:
    (block,) = _blocks("Turn it on")
    return commands(block)


@dataclass
class Place:
    clone: Path
    tmp: Path  # short: the socket path must stay under 108 bytes

    @property
    def socket(self) -> str:
        return str(self.tmp / "kvd.sock")

    @property
    def long_path(self) -> str:
        return str(self.tmp / "long")

    def substitute(self, cmd: str) -> str:
        cmd = cmd.replace("/var/run/infera-kvd.sock", self.socket).replace("/nvme/kvd-long", self.long_path)
        cmd = cmd.replace("<model>", MODEL)
        for big, small in SIZES.items():
            cmd = re.sub(rf"(--(?:max|long)-bytes) {big}\b", rf"\1 {small}", cmd)
        return cmd


def clean_env(**extra: str) -> dict[str, str]:
    """What a new login shell has: no venv, no PYTHONPATH, none of our variables."""
    env = {"PATH": SYSTEM_PATH, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    for key in (
        "TMPDIR",
        "PIP_INDEX_URL",
        "PIP_EXTRA_INDEX_URL",
        "PIP_CONFIG_FILE",
        "http_proxy",
        "https_proxy",
    ):
        if key in os.environ:
            env[key] = os.environ[key]
    env.update(extra)
    return env


def bash(place: Place, prefix: list[str], cmd: str) -> list[str]:
    """argv that runs ``cmd`` in the clone after the shell set-up lines.

    A plain command is ``exec``ed, so a signal to the process reaches it and its exit status is
    the command's; ``VAR=value cmd`` cannot be, and runs as the script's last command."""
    assignment = re.match(r"[A-Za-z_][A-Za-z0-9_]*=", cmd) is not None
    script = "set -e\n" + "".join(f"{p}\n" for p in prefix) + ("" if assignment else "exec ") + cmd + "\n"
    return ["bash", "-c", script]


def run(
    place: Place, prefix: list[str], cmd: str, timeout: float = 120, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        bash(place, prefix, cmd), cwd=place.clone, env=clean_env(**env), capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


# -- the fresh clone ----------------------------------------------------------------------------------


def _clone(dest: Path) -> None:
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(dest)], check=True)
    # this checkout's uncommitted work, as the commit it is about to become
    diff = subprocess.run(
        ["git", "-C", str(REPO), "diff", "HEAD", "--binary"], capture_output=True, check=True
    ).stdout
    if diff:
        subprocess.run(["git", "-C", str(dest), "apply", "--binary", "-"], input=diff, check=True)
    untracked = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "--others", "--exclude-standard", "-z"],
        capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    for rel in filter(None, (p.decode() for p in untracked)):
        if (REPO / rel).is_symlink() or not (REPO / rel).is_file():
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, target)


@dataclass
class Command1:
    place: Place
    result: subprocess.CompletedProcess[str]
    seconds: float


@pytest.fixture(scope="module")
def newcomer() -> Iterator[Command1]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = Path(tempfile.mkdtemp(prefix="kvd-nc-", dir="/tmp"))
    place = Place(root / "infera-kvd", root)
    try:
        _clone(place.clone)
        started = time.monotonic()
        result = subprocess.run(
            ["bash", "-c", command_1()], cwd=place.clone, env=clean_env(), capture_output=True, text=True,
            timeout=480,
        )  # fmt: skip
        yield Command1(place, result, time.monotonic() - started)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_readme_command_1_sets_up_and_passes_the_demo(newcomer: Command1) -> None:
    assert command_1() == "scripts/setup.sh && .venv/bin/kvd demo"
    res = newcomer.result
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "demo passed" in res.stdout
    assert "Traceback" not in res.stdout + res.stderr
    assert (newcomer.place.clone / ".venv" / "bin" / "kvd").exists()


# -- Turn it on ---------------------------------------------------------------------------------------


def _kind(cmd: str) -> str:
    words = shlex.split(cmd, comments=True)
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words = words[1:]  # VAR=value before the command
    if not words:
        return "unknown"
    if words[0] in (".", "source", "export", "cd"):
        return "setup"
    if words[:3] == ["python", "-m", "infera.kvd"] or words[:2] == ["kvd", "serve"]:
        return "daemon"
    if words[:3] == ["python", "-m", "infera.engine.vllm"]:
        return "engine"
    if words[0] == "kvd" and len(words) > 1 and words[1] in ("stat", "top", "doctor"):
        return words[1]
    return "unknown"


def _wait_for_socket(path: str, proc: subprocess.Popen[str], log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"the daemon did not serve on {path} (exit {proc.poll()}):\n{log.read_text()}")


def _check_engine(place: Place, prefix: list[str], cmd: str) -> None:
    """Without vLLM: one line naming the extra. With the vLLM venv: vLLM's parser and our flags."""
    res = run(place, prefix, cmd, timeout=60)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    assert len(lines) == 1 and "pip install 'infera-kvd[vllm]'" in lines[0], res.stderr
    if not (VLLM_VENV / "bin" / "activate").exists():
        if REQUIRE:
            pytest.fail(f"{VLLM_VENV} is missing (scripts/setup.sh --all makes it)")
        return
    # the vLLM venv, with the clone's code first on the path, and --help: vLLM parses our flags too
    vllm_prefix = [f". {shlex.quote(str(VLLM_VENV / 'bin' / 'activate'))}"]
    res = run(place, vllm_prefix, cmd + " --help", timeout=240, PYTHONPATH=str(place.clone))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "--kvd-socket-path" in res.stdout and "infera-kvd" in res.stdout


def _check_top(place: Place, prefix: list[str], cmd: str, daemon_pid: int) -> None:
    """``kvd top`` in a pseudo-terminal: it must draw the daemon (its pid), then quit on ``q``."""
    env = clean_env(TERM="xterm-256color", COLUMNS="160", LINES="48")
    with in_pty(bash(place, prefix, cmd), env, new_session=True, cwd=place.clone) as (leader, proc):
        seen = pty_read_until(leader, f"pid {daemon_pid}".encode(), timeout=60)
        assert b"Traceback" not in seen
        assert pty_quit(leader, proc, timeout=20) == 0


def test_readme_turn_it_on_works_as_written(newcomer: Command1) -> None:
    assert newcomer.result.returncode == 0, "command 1 failed (see the test above)"
    place = newcomer.place
    cmds = [place.substitute(c) for c in turn_it_on()]
    kinds = [_kind(c) for c in cmds]
    unknown = [c for c, k in zip(cmds, kinds, strict=True) if k == "unknown"]
    assert not unknown, f"README commands this test cannot check; teach it: {unknown}"
    assert {"daemon", "engine", "stat", "top", "doctor"} <= set(kinds), kinds
    assert kinds.index("daemon") < min(kinds.index(k) for k in ("stat", "top", "doctor"))
    prefix: list[str] = []
    daemon: subprocess.Popen[str] | None = None
    log = place.tmp / "daemon.log"
    try:
        for cmd, kind in zip(cmds, kinds, strict=True):
            if kind == "setup":
                res = run(place, [*prefix, cmd], "true")
                assert res.returncode == 0, f"{cmd}: {res.stderr}"
                prefix.append(cmd)
            elif kind == "daemon":
                with open(log, "w") as out:
                    daemon = subprocess.Popen(
                        bash(place, prefix, cmd), cwd=place.clone, env=clean_env(), stdout=out,
                        stderr=subprocess.STDOUT, text=True, start_new_session=True,
                    )  # fmt: skip
                _wait_for_socket(place.socket, daemon, log)
            elif kind == "engine":
                _check_engine(place, prefix, cmd)
            elif kind == "stat":
                res = run(place, prefix, cmd)
                assert res.returncode == 0, res.stderr
                assert re.search(r"^sets_total\s+\d+$", res.stdout, re.M), res.stdout
                assert f"long tier disk          {place.long_path}" in res.stdout, res.stdout
            elif kind == "doctor":
                res = run(place, prefix, cmd, timeout=120)
                assert res.returncode in (0, 1) and "Traceback" not in res.stdout + res.stderr, res.stderr
                assert re.search(rf"✓ daemon +kvd \S+ at {re.escape(place.socket)}", res.stdout), res.stdout
                assert "Summary:" in res.stdout
            elif kind == "top":
                assert daemon is not None
                _check_top(place, prefix, cmd, daemon.pid)
        assert daemon is not None and daemon.poll() is None, "the daemon died while the tools ran"
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(timeout=30)
        assert daemon.returncode == 0, log.read_text()
        assert "Traceback" not in log.read_text()
    finally:
        if daemon is not None and daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()


def test_the_commands_are_read_from_the_readme() -> None:
    cmds = turn_it_on()
    assert cmds[0] == ". .venv/bin/activate"
    daemon = next(c for c in cmds if _kind(c) == "daemon")
    assert daemon == (
        "python -m infera.kvd --socket /var/run/infera-kvd.sock --max-bytes 16G "
        "--long-path /nvme/kvd-long --long-bytes 256G"
    )
    place = Place(Path("/c"), Path("/t"))
    assert place.substitute(daemon) == (
        "python -m infera.kvd --socket /t/kvd.sock --max-bytes 64M --long-path /t/long --long-bytes 256M"
    )
