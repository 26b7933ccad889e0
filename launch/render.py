"""Render the deployment model through the Jinja2 templates in ``infera.templates``.

Each format returns ``{file name: text}``. Quoting is done by filters, never by hand in a template:
``sh`` (POSIX shell), ``yq`` (YAML scalar), ``cq`` (compose YAML: also ``$`` -> ``$$``), ``sd``
(systemd ``ExecStart=`` word: ``%`` and ``$`` doubled) and ``sde`` (systemd ``Environment=``
assignment). The lint front ends undo exactly these, and the tests check the round trip.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from infera.errors import UsageError
from infera.launch.model import Deployment, Process

FORMATS = ("shell", "json", "env", "systemd", "k8s", "compose")
_SAFE = re.compile(r"^[A-Za-z0-9_./:=,@+-]+$")
_YAML_PLAIN = re.compile(r"^(?:[A-Za-z_/]|--?[A-Za-z])[A-Za-z0-9_./-]*$")
_YAML_SPECIAL = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}


def q_sh(value: Any) -> str:
    return shlex.quote(str(value))


def q_yaml(value: Any) -> str:
    """A YAML scalar that reads back as exactly ``value`` (plain when that is safe, else quoted)."""
    text = str(value)
    if _YAML_PLAIN.match(text) and text.lower() not in _YAML_SPECIAL:
        import yaml

        try:
            if yaml.safe_load(text) == text:
                return text
        except yaml.YAMLError:
            pass
    if any(not _yaml_printable(c) for c in text):
        return '"' + "".join(_yaml_escape(c) for c in text) + '"'
    return "'" + text.replace("'", "''") + "'"


def _yaml_printable(c: str) -> bool:
    o = ord(c)
    return (0x20 <= o <= 0x7E or 0xA0 <= o <= 0xD7FF or 0xE000 <= o <= 0xFFFD or o >= 0x10000) and o != 0xFEFF


def _yaml_escape(c: str) -> str:
    if c in '"\\':
        return "\\" + c
    if _yaml_printable(c):
        return c
    o = ord(c)
    return f"\\x{o:02x}" if o <= 0xFF else f"\\u{o:04x}"


def q_compose(value: Any) -> str:
    return q_yaml(str(value).replace("$", "$$"))


def sh_command(groups: list[list[str]], indent: str = "    ") -> str:
    """A command over several lines: each group (``--flag value``) on its own continued line."""
    return (" \\\n" + indent).join(" ".join(shlex.quote(a) for a in g) for g in groups if g)


def sd_command(groups: list[list[str]], indent: str = "  ") -> str:
    return (" \\\n" + indent).join(" ".join(q_systemd(a) for a in g) for g in groups if g)


def q_envfile(value: Any) -> str:
    text = str(value)
    return text if _SAFE.match(text) or text == "" else shlex.quote(text)


def dns_name(value: Any) -> str:
    """A Kubernetes object or container name (RFC 1123 label) made from ``value``."""
    return re.sub(r"[^a-z0-9-]+", "-", str(value).lower()).strip("-")[:63] or "x"


def _sd_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "%%")


def q_systemd(value: Any) -> str:
    text = _sd_escape(str(value)).replace("$", "$$")
    if _SAFE.match(text):
        return text
    if "'" not in text:
        return "'" + text + "'"
    return '"' + text.replace('"', '\\"') + '"'


def q_systemd_env(item: tuple[str, Any]) -> str:
    key, value = item
    text = _sd_escape(f"{key}={value}")
    if _SAFE.match(text):
        return text
    return '"' + text.replace('"', '\\"') + '"'


@dataclass
class RProc:
    name: str
    ident: str
    kind: str
    role: str
    env: list[tuple[str, str]]
    command: list[str]
    args: list[str]
    groups: list[list[str]]
    uses_kvd: bool = False
    port: str | None = None
    unit: str = ""
    mounts: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)  # units it starts after (the router: the legs')
    part_of: list[str] = field(default_factory=list)  # units whose restart restarts it too

    @property
    def argv(self) -> list[str]:
        return [*self.command, *self.args]


def _groups(p: Process) -> list[list[str]]:
    """argv split for display: the command, then one ``--flag value`` per line."""
    argv = p.argv or []
    out = [argv[: p.args_start]]
    covered: set[int] = set()
    for use in p.flags():
        idx = [use.index] + (
            [use.value_index] if use.value_index is not None and use.value_index != use.index else []
        )
        idx += use.more
        covered.update(idx)
        out.append([argv[i] for i in idx])
    for i in range(p.args_start, len(argv)):
        if i not in covered:
            out.append([argv[i]])
    return out


def _rproc(p: Process, kind: str, role: str, uses_kvd: bool, mounts: list[str]) -> RProc:
    ident = re.sub(r"[^A-Za-z0-9_]", "_", p.name)
    argv = p.argv or []
    env = [(k, v) for k, v in p.env.items() if v is not None]
    return RProc(
        name=p.name,
        ident=ident,
        kind=kind,
        role=role,
        env=env,
        command=argv[: p.args_start],
        args=argv[p.args_start :],
        groups=_groups(p),
        uses_kvd=uses_kvd,
        port=p.flag_value("--port"),
        unit=f"infera-{p.name}.service",
        mounts=mounts,
    )


def context(dep: Deployment) -> dict[str, Any]:
    """What every template sees."""
    daemon = dep.daemons[0] if dep.daemons else None
    socket = daemon.socket if daemon else None
    socket_dir = os.path.dirname(socket) if socket else None
    long_path = daemon.long_path if daemon else None
    procs: list[RProc] = []
    if daemon is not None:
        procs.append(_rproc(daemon, "daemon", "daemon", False, [m for m in (socket_dir, long_path) if m]))
    for leg in dep.legs:
        uses = leg.uses_kvd() or bool(leg.kvd_env())
        mounts = []
        if uses and socket_dir:
            mounts.append(socket_dir)
        if uses and long_path and leg.env.get("INFERA_KVD_AIS"):
            mounts.append(long_path)
        procs.append(_rproc(leg, "leg", leg.role, uses, mounts))
    legs = [p for p in procs if p.kind == "leg"]
    for router in dep.routers:
        rp = _rproc(router, "router", "router", False, [])
        # vllm-router asks the prefill engine for its engine id once, when it starts: after a
        # prefill restart, a router left running sends the decode leg to the old engine (docs/pd.md)
        rp.after = [lp.unit for lp in legs]
        rp.part_of = [lp.unit for lp in legs if lp.role == "prefill"]
        procs.append(rp)
    parts = []
    if daemon is not None:
        parts.append({"name": daemon.name, "start": [procs[0]], "desc": "the kvd daemon only"})
    for lp in legs:
        start = ([procs[0]] if lp.uses_kvd and daemon is not None else []) + [lp]
        desc = ("the engine" if lp.name == "engine" else f"the {lp.name} engine") + (
            " and the kvd daemon it uses" if len(start) > 1 else ""
        )
        parts.append({"name": lp.name, "start": start, "desc": desc})
    routers = [p for p in procs if p.kind == "router"]
    for rp in routers:
        desc = "vllm-router, in front of the legs"
        if rp.part_of:
            desc += "; restart it after restarting the prefill engine"
        parts.append({"name": rp.name, "start": [rp], "desc": desc})
    everything: list[RProc] = []
    for part in parts:
        starts: list[RProc] = part["start"]  # type: ignore[assignment]
        everything += [p for p in starts if p not in everything]
    literal = any("$" in text or "`" in text for p in procs for text in [*p.argv, *(v for _, v in p.env)])
    return {
        "dep": dep,
        "literal_expansions": literal,  # shellcheck SC2016 is then intended (shell format)
        "cases": [{"name": "all", "start": everything}, *parts],
        "kind": dep.kind or "single",
        "procs": procs,
        "daemon": procs[0] if daemon is not None else None,
        "legs": legs,
        "parts": parts,
        # routers to restart with a prefill engine (systemd: PartOf; the other formats say so)
        "restart_with_prefill": [rp.name for rp in routers if rp.part_of],
        "socket": socket,
        "socket_dir": socket_dir,
        "long_path": long_path,
        "image": dep.image,
        "host_network": dep.kind == "pd",
    }


def _env() -> Any:
    from importlib.resources import files

    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(files("infera.templates"))),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters.update(sh=q_sh, yq=q_yaml, cq=q_compose, sd=q_systemd, sde=q_systemd_env, envq=q_envfile)
    env.filters.update(shcmd=sh_command, sdcmd=sd_command, dns=dns_name)
    return env


def render(dep: Deployment, fmt: str) -> dict[str, str]:
    """``{file name: text}`` for ``fmt`` (one of FORMATS)."""
    if fmt not in FORMATS:
        raise UsageError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    if fmt == "json":
        from infera.launch.spec import dumps

        return {"deployment.json": dumps(dep, "json")}
    if fmt in ("k8s", "compose") and not dep.image:
        raise UsageError(
            f"--image is required for --format {fmt}: the container image with infera-kvd and vLLM"
        )
    env = _env()
    ctx = context(dep)
    if fmt == "shell":
        return {"launch.sh": env.get_template("launch.sh.j2").render(ctx, filename="launch.sh")}
    if fmt == "env":
        return {
            f"{p.name}.env": env.get_template("env.j2").render(ctx, proc=p) for p in ctx["procs"] if p.env
        }
    if fmt == "systemd":
        out = {}
        for p in ctx["procs"]:
            tmpl = {"daemon": "kvd.service.j2", "router": "router.service.j2"}.get(
                p.kind, "engine.service.j2"
            )
            out[p.unit] = env.get_template(tmpl).render(ctx, proc=p)
        return out
    if fmt == "k8s":
        return {"k8s.yaml": env.get_template("k8s.yaml.j2").render(ctx)}
    return {"compose.yaml": env.get_template("compose.yaml.j2").render(ctx)}


def join_files(files: dict[str, str]) -> str:
    """One text for ``--emit``: a single file as is, several with a ``# ==> name <==`` line before each."""
    if len(files) == 1:
        return next(iter(files.values()))
    return "\n".join(f"# ==> {name} <==\n{text}" for name, text in files.items())
