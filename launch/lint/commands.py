"""Recognize a kvd daemon or an engine in a command line, through wrappers and ``docker run``.

Every front end (shell scripts, systemd units, Kubernetes containers, compose services) ends up with a
list of words and an environment; this module decides what the command is and builds the model's
:class:`~infera.launch.model.Daemon` or :class:`~infera.launch.model.Leg` from them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from infera.launch.model import Daemon, Leg, Loc, Mount, Process, Router


@dataclass
class Word:
    """One argument as written: its value, whether that value is known statically, and where it is."""

    text: str
    known: bool = True
    loc: Loc | None = None


@dataclass
class EnvVal:
    value: str | None
    loc: Loc | None = None


@dataclass
class Recognized:
    kind: str  # "daemon" | "leg" | "router"
    argv: list[Word]
    args_start: int
    entry: str = "infera"
    positional_model: Word | None = None
    env: dict[str, EnvVal] = field(default_factory=dict)
    env_fresh: bool = False  # a container or `env -i`: the caller's environment does not apply
    env_incomplete: bool = False
    mounts: list[tuple[str, str, Loc | None]] = field(default_factory=list)
    container: bool = False
    unset: set[str] = field(default_factory=set)  # removed by `env -u NAME`

    def effective_env(self, shell_env: dict[str, EnvVal]) -> dict[str, EnvVal]:
        """The process's environment: the shell's exported variables (unless fresh) plus its own."""
        if self.env_fresh:
            return dict(self.env)
        return {**{k: v for k, v in shell_env.items() if k not in self.unset}, **self.env}


_PY_RE = re.compile(r"^python(\d+(\.\d+)*)?$")
_PY_OPTS_WITH_VALUE = {"-X", "-W", "-c"}

# wrapper -> options that take a value
_WRAPPERS: dict[str, set[str]] = {
    "exec": {"-a"},
    "nohup": set(),
    "time": set(),
    "command": set(),
    "nice": {"-n", "--adjustment"},
    "ionice": {"-c", "-n", "--class", "--classdata"},
    "setsid": set(),
    "stdbuf": {"-i", "-o", "-e"},
    "chrt": set(),
    "sudo": {"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "--user", "--group"},
    "numactl": {
        "-N",
        "-m",
        "-C",
        "-i",
        "-p",
        "-P",
        "--cpunodebind",
        "--membind",
        "--physcpubind",
        "--interleave",
        "--preferred",
    },
    "timeout": {"-s", "-k", "--signal", "--kill-after"},
}
_POSITIONAL_WRAPPERS = {"timeout": 1, "taskset": 1, "chrt": 1}

_DOCKER_VALUE_OPTS = {
    "-e",
    "--env",
    "--env-file",
    "-v",
    "--volume",
    "--mount",
    "--name",
    "-p",
    "--publish",
    "--network",
    "--net",
    "--ipc",
    "--gpus",
    "--device",
    "-w",
    "--workdir",
    "-u",
    "--user",
    "--entrypoint",
    "--shm-size",
    "--runtime",
    "--cpus",
    "-m",
    "--memory",
    "-h",
    "--hostname",
    "--restart",
    "-l",
    "--label",
    "--security-opt",
    "--cap-add",
    "--cap-drop",
    "--group-add",
    "--ulimit",
    "--add-host",
    "--pid",
    "--platform",
    "--pull",
    "--log-driver",
    "--log-opt",
    "--tmpfs",
    "--cpuset-cpus",
    "--device-cgroup-rule",
    "--stop-signal",
    "--uts",
    "--userns",
}


def _base(word: str) -> str:
    return os.path.basename(word)


def _strip_wrappers(
    words: list[Word], env: dict[str, EnvVal], rec_flags: dict[str, bool], unset: set[str]
) -> list[Word]:
    """Drop ``exec``, ``nohup``, ``env A=B`` and friends in front of the real command."""
    i = 0
    while i < len(words):
        w = words[i].text
        name = _base(w)
        if name == "env":
            i += 1
            while i < len(words):
                t = words[i].text
                if t in ("-i", "--ignore-environment", "-"):
                    rec_flags["env_fresh"] = True
                    env.clear()
                elif t in ("-u", "--unset") and i + 1 < len(words):
                    env.pop(words[i + 1].text, None)
                    unset.add(words[i + 1].text)
                    i += 1
                elif t.startswith("--unset="):
                    env.pop(t.split("=", 1)[1], None)
                    unset.add(t.split("=", 1)[1])
                elif t in ("-C", "--chdir") and i + 1 < len(words):
                    i += 1
                elif t.startswith("-") and "=" not in t:
                    pass
                elif re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", t):
                    k, _, v = t.partition("=")
                    env[k] = EnvVal(v if words[i].known else None, words[i].loc)
                    unset.discard(k)
                else:
                    break
                i += 1
            continue
        if name in _WRAPPERS:
            opts = _WRAPPERS[name]
            i += 1
            while i < len(words) and words[i].text.startswith("-"):
                t = words[i].text
                if t in opts and "=" not in t:
                    i += 1
                i += 1
            if name == "sudo":
                while i < len(words) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[i].text):
                    k, _, v = words[i].text.partition("=")
                    env[k] = EnvVal(v if words[i].known else None, words[i].loc)
                    i += 1
            i += _POSITIONAL_WRAPPERS.get(name, 0)
            continue
        if name == "taskset":
            i += 1
            while i < len(words) and words[i].text.startswith("-"):
                i += 1
            i += 1
            continue
        break
    return words[i:]


def _docker(words: list[Word], shell_env: dict[str, EnvVal]) -> tuple[list[Word], Recognized] | None:
    """``docker|podman run [opts] IMAGE cmd...`` -> (cmd words, a partial Recognized with env and mounts)."""
    if len(words) < 2 or _base(words[0].text) not in ("docker", "podman", "nerdctl"):
        return None
    i = 1
    if words[i].text == "container" and i + 1 < len(words):
        i += 1
    if words[i].text != "run":
        return None
    i += 1
    rec = Recognized("leg", [], 0, env_fresh=True, container=True)
    entrypoint: Word | None = None
    while i < len(words) and words[i].text.startswith("-"):
        tok = words[i]
        opt, eq, inline = tok.text.partition("=")
        if tok.text == "--":
            i += 1
            break
        if opt in _DOCKER_VALUE_OPTS:
            if eq:
                val = Word(inline, tok.known, tok.loc)
            elif i + 1 < len(words):
                i += 1
                val = words[i]
            else:
                break
            if opt in ("-e", "--env"):
                k, sep, v = val.text.partition("=")
                if sep:
                    rec.env[k] = EnvVal(v if val.known else None, val.loc)
                else:
                    src = shell_env.get(k)
                    rec.env[k] = EnvVal(src.value if src else None, val.loc)
            elif opt == "--env-file":
                rec.env_incomplete = True
            elif opt in ("-v", "--volume"):
                parts = val.text.split(":")
                if len(parts) >= 2 and parts[0].startswith("/"):
                    rec.mounts.append((parts[0], parts[1], val.loc))
            elif opt == "--mount":
                fields = dict(p.partition("=")[::2] for p in val.text.split(","))
                host = fields.get("source") or fields.get("src")
                dst = fields.get("target") or fields.get("destination") or fields.get("dst") or ""
                if host:
                    rec.mounts.append((host, dst, val.loc))
            elif opt == "--entrypoint":
                entrypoint = val
        i += 1
    if i >= len(words):
        return None
    cmd = words[i + 1 :]  # words[i] is the image
    if entrypoint is not None:
        cmd = [entrypoint, *cmd]
    return cmd, rec


def recognize(words: list[Word], shell_env: dict[str, EnvVal] | None = None) -> Recognized | None:
    """What ``words`` runs: a kvd daemon, an engine leg, or None for anything else."""
    env: dict[str, EnvVal] = {}
    flags: dict[str, bool] = {}
    unset: set[str] = set()
    container: Recognized | None = None
    words = _strip_wrappers(words, env, flags, unset)
    dock = _docker(words, {**(shell_env or {}), **env})
    if dock is not None:
        words, container = dock
        env = dict(container.env)
        words = _strip_wrappers(words, env, flags, unset)
    if not words:
        return None
    rec = _classify(words)
    if rec is None:
        return None
    rec.env = env
    rec.unset = unset
    rec.env_fresh = flags.get("env_fresh", False)
    if container is not None:
        rec.env_fresh = True
        rec.env_incomplete = container.env_incomplete
        rec.mounts = container.mounts
        rec.container = True
    return rec


def _classify(words: list[Word]) -> Recognized | None:
    head = _base(words[0].text)
    texts = [w.text for w in words]
    if _PY_RE.match(head):
        i = 1
        while i < len(texts) and texts[i].startswith("-") and not texts[i].startswith("-m"):
            if texts[i] in _PY_OPTS_WITH_VALUE:
                if texts[i] == "-c":
                    return None
                i += 1
            i += 1
        if i >= len(texts) or not texts[i].startswith("-m"):
            return None
        if texts[i] == "-m":
            if i + 1 >= len(texts):
                return None
            module, start = texts[i + 1], i + 2
        else:
            module, start = texts[i][2:], i + 1
        return _by_module(module, words, start)
    if head == "kvd" and len(texts) > 1 and texts[1] == "serve":
        return Recognized("daemon", words, 2)
    if head == "vllm" and len(texts) > 1 and texts[1] == "serve":
        return _vllm_serve(words, 2)
    if head == "vllm-router":
        return Recognized("router", words, 1)
    return None


def _vllm_serve(words: list[Word], start: int) -> Recognized:
    model = None
    if start < len(words) and not words[start].text.startswith("-"):
        model = words[start]
        start += 1
    return Recognized("leg", words, start, entry="vllm", positional_model=model)


ROUTER_MODULES = ("vllm_router.launch_router",)


def _by_module(module: str, words: list[Word], start: int) -> Recognized | None:
    if module == "infera.kvd":
        return Recognized("daemon", words, start)
    if module in ("infera.cli", "infera") and start < len(words) and words[start].text == "serve":
        return Recognized("daemon", words, start + 1)
    if module == "infera.engine.vllm":
        return Recognized("leg", words, start, entry="infera")
    if module == "vllm.entrypoints.openai.api_server":
        return Recognized("leg", words, start, entry="vllm")
    if module in ROUTER_MODULES:
        return Recognized("router", words, start)
    if module == "vllm.entrypoints.cli.main" and start < len(words) and words[start].text == "serve":
        return _vllm_serve(words, start + 1)
    return None


def build_process(
    rec: Recognized,
    name: str,
    env: dict[str, EnvVal],
    env_complete: bool,
    loc: Loc | None,
) -> tuple[Process, list[Mount]]:
    """Turn a recognized command plus its effective environment into a model process."""
    proc: Process
    if rec.kind == "daemon":
        proc = Daemon(name=name)
    elif rec.kind == "router":
        proc = Router(name=name)
    else:
        proc = Leg(name=name, entry=rec.entry)
        if rec.positional_model is not None:
            proc.positional_model = rec.positional_model.text if rec.positional_model.known else None
    proc.argv = [w.text for w in rec.argv]
    proc.argv_locs = [w.loc for w in rec.argv]
    proc.unknown_args = {i for i, w in enumerate(rec.argv) if not w.known}
    proc.args_start = rec.args_start
    proc.loc = loc
    proc.env_complete = env_complete and not rec.env_incomplete
    for k, v in env.items():
        proc.env[k] = v.value
        if v.loc is not None:
            proc.env_locs[k] = v.loc
    mounts = [Mount(h, t, ml, f"{rec.kind} {name!r}") for h, t, ml in rec.mounts]
    return proc, mounts
