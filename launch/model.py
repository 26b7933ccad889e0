"""The deployment model: one kvd daemon and the engine legs that use it.

A process is what would run: its ``argv`` and ``env``. Everything the rules need (the daemon's socket,
a leg's kv-transfer-config and role) is derived from those two, so a model built by ``kvd launch``
from options and a model parsed back by ``kvd lint`` from a shell script are checked the same way.

Values a front end could not resolve (``$VAR`` of the caller, a Kubernetes ``valueFrom``) are
``None``; ``env_complete`` is False when the process may receive variables nobody can see (an
``--env-file``, a ``source``d file). Rules skip what they cannot know rather than guess.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from infera.kvd.flags import SWITCHES as DAEMON_SWITCHES

# the command-line reading lives in .argv; its names stay importable from here
from infera.launch.argv import ENGINE_BOOL_FLAGS, ROUTER_MULTI, ROUTER_SWITCHES, FlagUse, Loc, parse_flags

KVD_CONNECTOR = "InferaKvdConnector"
KVD_MODULE = "infera.engine.vllm.kvd_connector"
MULTI_CONNECTOR = "MultiConnector"
TRANSPORT_CONNECTOR = "MooncakeConnector"
KTC_FLAG = "--kv-transfer-config"
KVD_ENV_PREFIX = "INFERA_KVD_"
PD_FLAGS = ("--etcd-endpoint", "--discovery-backend", "--request-transport", "--kv-event-transport")

ROLES = ("single", "prefill", "decode")


@dataclass
class Process:
    """A command that runs: argv, env, and where each part was written (for findings)."""

    name: str
    argv: list[str] | None = None
    env: dict[str, str | None] = field(default_factory=dict)
    env_complete: bool = True
    args_start: int = 0
    loc: Loc | None = None
    argv_locs: list[Loc | None] = field(default_factory=list)
    env_locs: dict[str, Loc] = field(default_factory=dict)
    unknown_args: set[int] = field(default_factory=set)
    bool_flags: frozenset[str] = ENGINE_BOOL_FLAGS
    multi_flags: frozenset[str] = frozenset()

    def flags(self) -> list[FlagUse]:
        if self.argv is None:
            return []
        return parse_flags(self.argv, self.args_start, self.bool_flags, self.multi_flags)

    def flag(self, name: str) -> FlagUse | None:
        """The last use of ``name`` (argparse keeps the last), or None."""
        found = None
        for use in self.flags():
            if use.name == name:
                found = use
        return found

    def flag_value(self, name: str) -> str | None:
        """The value of ``--name`` when present and statically known."""
        use = self.flag(name)
        if use is None or use.value is None or use.value_index in self.unknown_args:
            return None
        return use.value

    def has_flag(self, name: str) -> bool:
        return self.flag(name) is not None

    def env_value(self, name: str) -> str | None:
        return self.env.get(name)

    def env_is_unset(self, name: str) -> bool:
        """True only when we can see every variable of this process and ``name`` is not among them."""
        return self.env_complete and name not in self.env

    def where(self) -> Loc | None:
        return self.loc

    def where_env(self, name: str) -> Loc | None:
        return self.env_locs.get(name) or self.loc

    def where_flag(self, name: str) -> Loc | None:
        use = self.flag(name)
        if use is not None:
            idx = use.value_index if use.value_index is not None else use.index
            if idx < len(self.argv_locs) and self.argv_locs[idx] is not None:
                return self.argv_locs[idx]
            if use.index < len(self.argv_locs) and self.argv_locs[use.index] is not None:
                return self.argv_locs[use.index]
        return self.loc

    def kvd_env(self) -> list[str]:
        return [k for k in self.env if k.startswith(KVD_ENV_PREFIX)]


@dataclass
class Daemon(Process):
    """``python -m infera.kvd ...``: the per-host daemon."""

    name: str = "kvd"
    bool_flags: frozenset[str] = DAEMON_SWITCHES

    @property
    def socket(self) -> str | None:
        return self.flag_value("--socket")

    @property
    def long_path(self) -> str | None:
        return self.flag_value("--long-path")

    @property
    def long_backend(self) -> str | None:
        return self.flag_value("--long-backend")


@dataclass
class Connector:
    """One connector of a kv-transfer-config: the top level, or a MultiConnector child."""

    name: str | None
    role: str | None
    module_path: str | None
    where: str  # "" for the top level, "connectors[0]" for a child
    raw: dict[str, Any]


@dataclass
class Leg(Process):
    """An engine process: ``python -m infera.engine.vllm`` (or plain ``vllm serve``)."""

    name: str = "engine"
    declared_role: str | None = None
    entry: str = "infera"  # "infera" (our entry point) or "vllm"
    positional_model: str | None = None

    def ktc_text(self) -> str | None:
        use = self.flag(KTC_FLAG)
        if use is None or use.value_index in self.unknown_args:
            return None
        return use.value

    def ktc(self) -> dict[str, Any] | None:
        """The kv-transfer-config as a dict; None when absent, unknown or not a JSON object."""
        cfg: dict[str, Any] | None = None
        text = self.ktc_text()
        if text is not None:
            try:
                parsed = json.loads(text)
            except ValueError:
                return None
            if not isinstance(parsed, dict):
                return None
            cfg = parsed
        for use in self.flags():  # vLLM's dotted form: --kv-transfer-config.kv_role=kv_both
            if use.name.startswith(KTC_FLAG + ".") and use.value is not None:
                cfg = dict(cfg or {})
                cfg[use.name[len(KTC_FLAG) + 1 :]] = use.value
        return cfg

    def connectors(self) -> list[Connector]:
        """The top-level connector followed by any MultiConnector children."""
        cfg = self.ktc()
        if cfg is None:
            return []
        out = [_connector(cfg, "")]
        extra = cfg.get("kv_connector_extra_config")
        if cfg.get("kv_connector") == MULTI_CONNECTOR and isinstance(extra, dict):
            children = extra.get("connectors")
            if isinstance(children, list):
                for i, child in enumerate(children):
                    if isinstance(child, dict):
                        out.append(_connector(child, f"connectors[{i}]"))
        return out

    def uses_kvd(self) -> bool:
        return any(c.name == KVD_CONNECTOR for c in self.connectors())

    def top_role(self) -> str | None:
        cfg = self.ktc()
        role = cfg.get("kv_role") if cfg else None
        return role if isinstance(role, str) else None

    def model(self) -> str | None:
        return self.flag_value("--model") or self.positional_model

    @property
    def role(self) -> str:
        """``single``, ``prefill`` or ``decode``: declared (spec files) or inferred from the config."""
        if self.declared_role in ROLES:
            return self.declared_role
        top = self.top_role()
        if top == "kv_producer":
            return "prefill"
        if top == "kv_consumer":
            return "decode"
        conns = self.connectors()
        transport_roles = {c.role for c in conns if c.name == TRANSPORT_CONNECTOR}
        if "kv_producer" in transport_roles:
            return "prefill"
        if "kv_consumer" in transport_roles:
            return "decode"
        if transport_roles or any(self.has_flag(f) for f in PD_FLAGS):
            return "prefill" if self.uses_kvd() or self.kvd_env() else "decode"
        return "single"


def _connector(cfg: dict[str, Any], where: str) -> Connector:
    def s(key: str) -> str | None:
        v = cfg.get(key)
        return v if isinstance(v, str) else None

    return Connector(s("kv_connector"), s("kv_role"), s("kv_connector_module_path"), where, cfg)


@dataclass
class Router(Process):
    """``python -m vllm_router.launch_router`` (or ``vllm-router``): the P/D router in front of the legs."""

    name: str = "router"
    bool_flags: frozenset[str] = ROUTER_SWITCHES
    multi_flags: frozenset[str] = ROUTER_MULTI

    def uses(self, name: str) -> list[FlagUse]:
        """Every use of ``name`` (``--prefill`` and ``--decode`` repeat, one per worker)."""
        return [u for u in self.flags() if u.name == name]

    def word(self, index: int) -> str | None:
        """``argv[index]`` when it is statically known."""
        if self.argv is None or index >= len(self.argv) or index in self.unknown_args:
            return None
        return self.argv[index]


@dataclass
class Mount:
    """A host path mounted into a container (only what the rules look at)."""

    host_path: str
    target: str
    loc: Loc | None
    owner: str


@dataclass
class Deployment:
    """Daemons and legs that belong together (one file, or files linted ``--together``)."""

    kind: str | None = None  # "single" or "pd" when known
    daemons: list[Daemon] = field(default_factory=list)
    legs: list[Leg] = field(default_factory=list)
    routers: list[Router] = field(default_factory=list)
    mounts: list[Mount] = field(default_factory=list)
    prewarm_refs: list[Loc] = field(default_factory=list)
    vllm_version: str | None = None
    image: str | None = None
    python: str = "python"

    def processes(self) -> list[Process]:
        return [*self.daemons, *self.legs, *self.routers]

    def add(self, proc: Process) -> None:
        """Put ``proc`` in the list of its kind."""
        if isinstance(proc, Daemon):
            self.daemons.append(proc)
        elif isinstance(proc, Router):
            self.routers.append(proc)
        elif isinstance(proc, Leg):
            self.legs.append(proc)

    def merge(self, other: Deployment) -> Deployment:
        return Deployment(
            kind=self.kind or other.kind,
            daemons=[*self.daemons, *other.daemons],
            legs=[*self.legs, *other.legs],
            routers=[*self.routers, *other.routers],
            mounts=[*self.mounts, *other.mounts],
            prewarm_refs=[*self.prewarm_refs, *other.prewarm_refs],
            vllm_version=self.vllm_version or other.vllm_version,
            image=self.image or other.image,
            python=self.python,
        )

    def daemon_for(self, socket: str | None) -> Daemon | None:
        """The daemon a leg talks to: the one on ``socket``, else the only daemon there is."""
        if socket is not None:
            for d in self.daemons:
                if d.socket == socket:
                    return d
        return self.daemons[0] if len(self.daemons) == 1 else None


def norm_path(path: str) -> str:
    """``path`` normalised (``/a//b/`` is ``/a/b``); an empty one stays empty."""
    return os.path.normpath(path) if path else path


def ktc_json(cfg: dict[str, Any]) -> str:
    """The compact JSON form the product doc prints (no spaces)."""
    return json.dumps(cfg, separators=(",", ":"))
