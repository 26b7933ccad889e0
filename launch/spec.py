"""Spec files: the deployment model as YAML or JSON that users keep in git.

The spec is the same object ``kvd launch --format json`` prints::

    {"version": 1, "kind": "single", "python": "python",
     "daemon": {"name": "kvd", "argv": [...], "env": {}, "socket": ..., "max_bytes": ..., ...},
     "legs": [{"name", "role", "env", "argv", "kv_transfer_config"}]}

``argv`` is authoritative. The daemon's ``socket``/``max_bytes``/``long_*`` and a leg's
``kv_transfer_config`` mirror it for readers; a hand-written spec may give them *instead* of the
matching flags (they are then added to ``argv``), and a spec that gives both with different values
is refused rather than guessed at; so is ``args`` that gives a flag ``argv`` already has with another
value.

``kvd lint`` reads a spec as it finds it (:func:`from_data`); ``kvd launch --spec`` reads it
``strict``-ly (:mod:`infera.launch.specfile`): it renders the deployment, so the spec must describe
a whole one.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from infera.errors import UsageError
from infera.kvd.flags import BY_NAME, FLAGS
from infera.launch import values
from infera.launch.argv import parse_flags
from infera.launch.model import KTC_FLAG, ROLES, Daemon, Deployment, Leg, Loc, Router, ktc_json

SPEC_VERSION = 1
# daemon flags mirrored as fields of the spec (by the flag's dest), for readers
DAEMON_FIELDS = {
    BY_NAME[name].dest: name
    for name in ("--socket", "--max-bytes", "--long-path", "--long-bytes", "--long-backend")
}
DAEMON_MODULE = ["-m", "infera.kvd"]
ENGINE_MODULE = ["-m", "infera.engine.vllm"]
# the keys a strict reader knows; any other is a typo it refuses rather than ignores
TOP_KEYS = ("version", "kind", "python", "image", "vllm_version", "daemon", "legs", "routers")
PROCESS_KEYS = ("name", "argv", "args", "env")
DAEMON_KEYS = (*PROCESS_KEYS, *DAEMON_FIELDS)
LEG_KEYS = (*PROCESS_KEYS, "role", "kv_transfer_config")
# the roles of the legs of each kind
KIND_ROLES = {"single": ("single",), "pd": ("prefill", "decode")}


class SpecError(UsageError):
    """A spec file with the wrong shape; carries the place for ``kvd lint``."""

    def __init__(self, message: str, loc: Loc | None = None) -> None:
        where = f"{loc.path}:{loc.line}: " if loc else ""
        super().__init__(f"{where}{message}", hint="compare with `kvd launch single --model M --format json`")
        self.loc = loc
        self.detail = message


# -- model -> data ----------------------------------------------------------------------------


def daemon_to_dict(d: Daemon) -> dict[str, Any]:
    out: dict[str, Any] = {"name": d.name, "argv": list(d.argv or []), "env": dict(d.env)}
    for key, flag in DAEMON_FIELDS.items():
        out[key] = d.flag_value(flag)
    return out


def leg_to_dict(leg: Leg) -> dict[str, Any]:
    return {
        "name": leg.name,
        "role": leg.role,
        "env": dict(leg.env),
        "argv": list(leg.argv or []),
        "kv_transfer_config": leg.ktc(),
    }


def to_dict(dep: Deployment) -> dict[str, Any]:
    """The spec / ``--format json`` object."""
    out: dict[str, Any] = {"version": SPEC_VERSION, "kind": dep.kind, "python": dep.python}
    if dep.image:
        out["image"] = dep.image
    if dep.vllm_version:
        out["vllm_version"] = dep.vllm_version
    out["daemon"] = daemon_to_dict(dep.daemons[0]) if dep.daemons else None
    out["legs"] = [leg_to_dict(leg) for leg in dep.legs]
    if dep.routers:
        out["routers"] = [
            {"name": r.name, "env": dict(r.env), "argv": list(r.argv or [])} for r in dep.routers
        ]
    return out


def dumps(dep: Deployment, fmt: str = "json") -> str:
    data = to_dict(dep)
    if fmt == "yaml":
        return yaml.safe_dump(data, sort_keys=False, width=10_000)
    return json.dumps(data, indent=2) + "\n"


# -- data -> model ----------------------------------------------------------------------------


class _Reader:
    def __init__(self, path: str, strict: bool = False) -> None:
        self.path = path
        self.strict = strict

    def loc(self, container: Any, key: Any = None, value: bool = True) -> Loc:
        pos: tuple[int, int] | None = None
        if key is not None:
            if value and isinstance(container, dict) and isinstance(container.get(key), dict | list):
                value = False  # a block value starts on the next line: point at its key
            table = getattr(container, "val_pos" if value else "key_pos", None)
            if table is not None:
                pos = table.get(key)
            items = getattr(container, "item_pos", None)
            if items is not None and isinstance(key, int) and key < len(items):
                pos = items[key]
        if pos is None:
            pos = getattr(container, "pos", None) or (1, 1)
        return Loc(self.path, pos[0], pos[1])

    def mapping(
        self, value: Any, what: str, parent: Any, key: Any, keys: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        """``value`` as a mapping; a strict reader refuses a key outside ``keys`` (when given)."""
        if not isinstance(value, dict):
            raise SpecError(f"{what} must be a mapping", self.loc(parent, key))
        if self.strict and keys:
            for k in value:
                if k not in keys:
                    where = f"{what}: " if what else ""
                    raise SpecError(
                        f"{where}unknown key {k!r} (known: {', '.join(keys)})",
                        self.loc(value, k, value=False),
                    )
        return value

    def check(self, fn: Any, value: Any, what: str, loc: Loc | None) -> Any:
        """``fn(value, what)`` from :mod:`infera.launch.values`, its UsageError as a SpecError at ``loc``."""
        try:
            return fn(value, what)
        except UsageError as err:
            raise SpecError(err.message, loc) from None

    def strlist(self, value: Any, what: str, parent: Any, key: Any) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str | int | float) for v in value):
            raise SpecError(f"{what} must be a list of strings", self.loc(parent, key))
        return [str(v) for v in value]

    def env(self, proc: Daemon | Leg | Router, raw: Any, parent: Any) -> None:
        if raw is None:
            return
        env = self.mapping(raw, f"{proc.name}: env", parent, "env")
        for k, v in env.items():
            proc.env[str(k)] = None if v is None else (str(v).lower() if isinstance(v, bool) else str(v))
            proc.env_locs[str(k)] = self.loc(env, k)

    def argv(self, proc: Daemon | Leg | Router, raw: list[str], container: Any) -> None:
        from infera.launch.lint.commands import Word, recognize

        proc.argv = raw
        proc.argv_locs = [self.loc(container, i) for i in range(len(raw))]
        rec = recognize([Word(a) for a in raw])
        if rec is not None:
            proc.args_start = len(raw) - len(rec.argv) + rec.args_start
            if isinstance(proc, Leg):
                proc.entry = rec.entry
                if rec.positional_model is not None:
                    proc.positional_model = rec.positional_model.text
        else:
            proc.args_start = next((i for i, a in enumerate(raw) if a.startswith("-")), len(raw))

    def command(
        self, proc: Daemon | Leg | Router, data: dict[str, Any], what: str, default: list[str]
    ) -> list[str]:
        """Set ``proc``'s command: the spec's ``argv``, else ``default`` (located at ``proc``);
        returned, for the caller to append to."""
        if data.get("argv"):
            self.argv(proc, self.strlist(data["argv"], f"{what}.argv", data, "argv"), data["argv"])
        else:
            proc.argv = default
            proc.args_start = len(default)
            proc.argv_locs = [proc.loc] * len(default)
        assert proc.argv is not None
        return proc.argv

    def extras(self, proc: Daemon | Leg | Router, data: dict[str, Any], what: str) -> None:
        """The spec's ``args`` (appended to ``proc``'s command) and ``env``. A flag of ``args`` that
        the command already has with another value is refused: which one wins is not obvious."""
        assert proc.argv is not None
        args = self.strlist(data.get("args") or [], f"{what}.args", data, "args")
        repeatable = flags_that_repeat(proc)
        for use in parse_flags(args, 0, proc.bool_flags, proc.multi_flags):
            have = proc.flag(use.name)
            if have is not None and have.value != use.value and use.name not in repeatable:
                given = "" if use.value is None else f" {use.value!r}"
                had = "" if have.value is None else f" {have.value!r}"
                raise SpecError(
                    f"{what}.args gives {use.name}{given} but the command already has {use.name}{had}; "
                    "keep one",
                    self.loc(data, "args"),
                )
        for extra in args:
            proc.argv.append(extra)
            proc.argv_locs.append(self.loc(data, "args"))
        self.env(proc, data.get("env"), data)

    def daemon(self, raw: Any, top: Any, python: str) -> Daemon:
        d = Daemon(name="kvd")
        data = self.mapping(raw, "daemon", top, "daemon", DAEMON_KEYS)
        d.name = str(data.get("name") or "kvd")
        d.loc = self.loc(top, "daemon")
        argv = self.command(d, data, "daemon", [python, *DAEMON_MODULE])
        for key, flag in DAEMON_FIELDS.items():
            val = data.get(key)
            if val is None:
                continue
            have = d.flag_value(flag)
            if have is None and not d.has_flag(flag):
                argv += [flag, str(val)]
                d.argv_locs += [self.loc(data, key)] * 2
            elif have != str(val):
                raise SpecError(
                    f"daemon.{key} is {val!r} but daemon.argv has {flag} {have!r}", self.loc(data, key)
                )
        self.extras(d, data, "daemon")
        if self.strict:  # the daemon's paths as --socket and --long-path take them
            for key in ("socket", "long_path"):
                path = d.flag_value(DAEMON_FIELDS[key])
                if path is not None:
                    where = self.loc(data, key) if key in data else d.where_flag(DAEMON_FIELDS[key])
                    self.check(values.absolute_path, path, f"daemon.{key}", where)
        return d

    def leg(self, raw: Any, legs: Any, i: int, python: str) -> Leg:
        data = self.mapping(raw, f"legs[{i}]", legs, i, LEG_KEYS)
        leg = Leg(name=str(data.get("name") or f"leg{i}"))
        leg.loc = self.loc(legs, i)
        role = data.get("role")
        if role is not None:
            if role not in ROLES:
                raise SpecError(
                    f"legs[{i}].role {role!r} is not one of {', '.join(ROLES)}", self.loc(data, "role")
                )
            leg.declared_role = str(role)
        argv = self.command(leg, data, f"legs[{i}]", [python, *ENGINE_MODULE])
        self.extras(leg, data, f"legs[{i}]")
        cfg = data.get("kv_transfer_config")
        if cfg is not None:
            if not leg.has_flag(KTC_FLAG):
                argv += [KTC_FLAG, ktc_json(_plain(cfg))]
                leg.argv_locs += [self.loc(data, "kv_transfer_config")] * 2
            elif leg.ktc() != _plain(cfg):
                raise SpecError(
                    f"legs[{i}].kv_transfer_config differs from the {KTC_FLAG} in its argv; keep one",
                    self.loc(data, "kv_transfer_config"),
                )
        return leg

    def router(self, raw: Any, routers: Any, i: int, python: str) -> Router:
        from infera.launch.router import ROUTER_MODULE

        data = self.mapping(raw, f"routers[{i}]", routers, i, PROCESS_KEYS)
        r = Router(name=str(data.get("name") or f"router{i}"))
        r.loc = self.loc(routers, i)
        self.command(r, data, f"routers[{i}]", [python, *ROUTER_MODULE])
        self.extras(r, data, f"routers[{i}]")
        return r


def _plain(value: Any) -> Any:
    """Strip position-keeping containers down to plain dicts and lists."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def flags_that_repeat(proc: Daemon | Leg | Router) -> frozenset[str]:
    """Flags ``proc`` takes more than once, each use adding a value (``--allow-uid``, ``--prefill``)."""
    if isinstance(proc, Daemon):
        return frozenset(f.name for f in FLAGS if f.kind == "list")
    if isinstance(proc, Router):
        return frozenset(("--prefill", "--decode"))
    return frozenset()


def from_data(data: Any, path: str, strict: bool = False) -> Deployment:
    """Build the model from a loaded spec (plain or position-keeping containers).

    ``strict`` (``kvd launch --spec``) also refuses what a deployment to render cannot have: unknown
    keys, a relative daemon socket or disk-tier path, a leg without a model or a kv-transfer-config,
    legs whose roles do not fit ``kind``, and a ``vllm_version`` that is not a version.
    """
    r = _Reader(path, strict)
    version = data.get("version", SPEC_VERSION) if isinstance(data, dict) else SPEC_VERSION
    if version != SPEC_VERSION:
        raise SpecError(
            f"spec version {version!r} is not supported (this kvd reads version {SPEC_VERSION})",
            r.loc(data, "version"),
        )
    if not isinstance(data, dict) or "legs" not in data:
        raise SpecError("a spec is a mapping with a 'legs' list", r.loc(data))
    r.mapping(data, "", None, None, TOP_KEYS)
    kind = data.get("kind")
    if kind not in (None, *KIND_ROLES):
        raise SpecError(f"kind {kind!r} is not {' or '.join(KIND_ROLES)}", r.loc(data, "kind"))
    python = str(data.get("python") or "python")
    vllm_version = _str(data.get("vllm_version"))
    if strict:
        r.check(values.vllm_version, vllm_version, "vllm_version", r.loc(data, "vllm_version"))
    dep = Deployment(kind=kind, python=python, image=data.get("image"), vllm_version=vllm_version)
    if data.get("daemon") is not None:
        dep.daemons.append(r.daemon(data["daemon"], data, python))
    legs = data["legs"]
    if not isinstance(legs, list):
        raise SpecError("legs must be a list", r.loc(data, "legs"))
    dep.legs = [r.leg(raw, legs, i, python) for i, raw in enumerate(legs)]
    routers = data.get("routers") or []
    if not isinstance(routers, list):
        raise SpecError("routers must be a list", r.loc(data, "routers"))
    dep.routers = [r.router(raw, routers, i, python) for i, raw in enumerate(routers)]
    seen: set[str] = {d.name for d in dep.daemons}
    named: list[tuple[str, Leg | Router]] = [(f"legs[{i}]", p) for i, p in enumerate(dep.legs)]
    named += [(f"routers[{i}]", p) for i, p in enumerate(dep.routers)]
    for what, proc in named:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", proc.name) or proc.name in ("all",):
            raise SpecError(
                f"{what}.name {proc.name!r} is not a simple name (letters, digits, . _ -)", proc.loc
            )
        if proc.name in seen:
            raise SpecError(f"{what}.name {proc.name!r} is used twice", proc.loc)
        seen.add(proc.name)
    if strict:
        _check_roles(dep, r.loc(data, "legs"))
    return dep


def _check_roles(dep: Deployment, where: Loc) -> None:
    """A strict spec's legs are whole engines (a model and a kv-transfer-config) and fit its
    ``kind``: ``single`` legs only, or prefill and decode legs."""
    if not dep.legs:
        raise SpecError("legs is empty: a deployment has at least one engine leg", where)
    for i, leg in enumerate(dep.legs):
        if leg.model() is None:
            raise SpecError(f"legs[{i}] has no --model: give it in argv or args", leg.loc)
        if leg.ktc() is None and not leg.has_flag(KTC_FLAG):
            raise SpecError(
                f"legs[{i}] has no kv_transfer_config: without one the engine uses neither kvd nor "
                "a KV transport",
                leg.loc,
            )
    if dep.kind is None:
        return
    allowed = KIND_ROLES[dep.kind]
    for i, leg in enumerate(dep.legs):
        if leg.role not in allowed:
            raise SpecError(
                f"legs[{i}] is a {leg.role} leg, but kind {dep.kind} has {' and '.join(allowed)} legs",
                leg.loc,
            )
    for role in allowed:
        if not any(leg.role == role for leg in dep.legs):
            raise SpecError(f"kind {dep.kind} needs a {role} leg, and legs has none", where)


def _str(v: Any) -> str | None:
    return None if v is None else str(v)
