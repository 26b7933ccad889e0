"""Kubernetes manifests, compose files and spec files read into the deployment model."""

from __future__ import annotations

import re
from typing import Any

from infera.launch.lint.commands import EnvVal, Word, build_process, recognize
from infera.launch.lint.shell import ShellReader, _State, read_shell_words
from infera.launch.model import Deployment, Loc, Mount, Process

POD_KINDS = {
    "Pod",
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "ReplicaSet",
    "Job",
    "CronJob",
    "ReplicationController",
    "PodTemplate",
}
_SHELLS = {"bash", "sh", "dash", "zsh", "/bin/bash", "/bin/sh", "/usr/bin/bash", "/usr/bin/env"}


def _pos(container: Any, key: Any) -> tuple[int, int]:
    fallback: tuple[int, int] = getattr(container, "pos", None) or (1, 1)
    if isinstance(key, int):
        items = getattr(container, "item_pos", [])
        return items[key] if key < len(items) else fallback
    found: tuple[int, int] | None = getattr(container, "val_pos", {}).get(key)
    return found or fallback


def _loc(path: str, container: Any, key: Any, span: tuple[int, int] | None = None) -> Loc:
    line, col = _pos(container, key)
    return Loc(path, line, col, span[0] if span else None, span[1] if span else None)


def _add(dep: Deployment, proc: Process, mounts: list[Mount]) -> None:
    dep.add(proc)
    dep.mounts.extend(mounts)


def _script_origin(text: str, line: int, col: int) -> tuple[int, int]:
    """Where the content of a YAML scalar starts: the next line for ``|``/``>`` blocks, else after the quote."""
    lines = text.splitlines()
    if 0 < line <= len(lines) and re.search(r"[|>][-+]?\d*\s*$", lines[line - 1]):
        nxt = lines[line] if line < len(lines) else ""
        return line + 1, len(nxt) - len(nxt.lstrip()) + 1
    return line, col + 1


def _run_words(
    dep: Deployment,
    words: list[Word],
    env: dict[str, EnvVal],
    complete: bool,
    name: str,
    loc: Loc,
    text: str,
    path: str,
) -> None:
    """Add what ``words`` starts (directly, or through ``sh -c 'script'``) to ``dep``."""
    heads = [w.text for w in words]
    if heads and heads[0] in _SHELLS:
        rest = heads[1:]
        if heads[0] == "/usr/bin/env" and rest:
            rest = rest[1:]
        if "-c" in rest:
            k = len(heads) - len(rest) + rest.index("-c") + 1
            wloc = words[k].loc if k < len(words) else None
            if wloc is not None and words[k].known:
                origin = _script_origin(text, wloc.line, wloc.col)
                state = _State({k2: v for k2, v in env.items()}, set(env), False, complete)
                reader = ShellReader(words[k].text, path, origin, state)
                sub = reader.read()
                for proc in sub.processes():
                    proc.name = name
                merged = dep.merge(sub)
                dep.daemons, dep.legs, dep.routers, dep.mounts, dep.prewarm_refs = (
                    merged.daemons,
                    merged.legs,
                    merged.routers,
                    merged.mounts,
                    merged.prewarm_refs,
                )
            return
    rec = recognize(words, env)
    if rec is None:
        return
    eff = rec.effective_env(env)
    proc, mounts = build_process(rec, name, eff, complete, loc)
    _add(dep, proc, mounts)


# -- Kubernetes -----------------------------------------------------------------------------


def _pod_specs(doc: Any) -> list[tuple[str, Any]]:
    if not isinstance(doc, dict):
        return []
    kind = doc.get("kind")
    if kind == "List":
        out = []
        for item in doc.get("items") or []:
            out.extend(_pod_specs(item))
        return out
    if kind not in POD_KINDS:
        return []
    name = str((doc.get("metadata") or {}).get("name") or kind)
    spec = doc.get("spec") or {}
    if kind == "Pod":
        return [(name, spec)]
    if kind == "PodTemplate":
        return [(name, (doc.get("template") or {}).get("spec") or {})]
    if kind == "CronJob":
        spec = ((spec.get("jobTemplate") or {}).get("spec")) or {}
    return [(name, ((spec.get("template") or {}).get("spec")) or {})]


def _k8s_expand(word: Any, env: dict[str, EnvVal], loc: Loc) -> Word:
    """Kubernetes expands ``$(VAR)`` in command and args from the container's env; ``$$`` escapes."""
    text = str(word)
    known = True

    def sub(m: re.Match[str]) -> str:
        nonlocal known
        if m.group(0).startswith("$$"):
            return m.group(0)[1:]
        val = env.get(m.group(1))
        if val is None or val.value is None:
            known = known and val is None  # an undefined reference stays literal in Kubernetes
            return m.group(0)
        return val.value

    text = re.sub(r"\$\$\([A-Za-z_][A-Za-z0-9_]*\)|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, text)
    return Word(text, known, loc)


def read_k8s(docs: list[Any], path: str, text: str) -> Deployment:
    dep = Deployment()
    for doc in docs:
        for workload, pod in _pod_specs(doc):
            if not isinstance(pod, dict):
                continue
            volumes: dict[str, tuple[str, Loc]] = {}
            for vol in pod.get("volumes") or []:
                hp = vol.get("hostPath") if isinstance(vol, dict) else None
                if isinstance(hp, dict) and hp.get("path"):
                    volumes[str(vol.get("name"))] = (str(hp["path"]), _loc(path, hp, "path"))
            for field_name in ("initContainers", "containers"):
                for c in pod.get(field_name) or []:
                    if isinstance(c, dict):
                        _k8s_container(dep, c, workload, volumes, path, text)
    return dep


def _k8s_container(
    dep: Deployment, c: Any, workload: str, volumes: dict[str, tuple[str, Loc]], path: str, text: str
) -> None:
    name = f"{workload}/{c.get('name', 'container')}"
    env: dict[str, EnvVal] = {}
    complete = not c.get("envFrom")
    for item in c.get("env") or []:
        if not isinstance(item, dict) or "name" not in item:
            continue
        key = "value" if "value" in item else "name"
        val = None if "valueFrom" in item else ("" if item.get("value") is None else str(item["value"]))
        env[str(item["name"])] = EnvVal(val, _loc(path, item, key))
    cpos = getattr(c, "pos", (1, 1))
    span_end = cpos[0]
    words: list[Word] = []
    for key in ("command", "args"):
        seq = c.get(key)
        if isinstance(seq, list):
            for i, item in enumerate(seq):
                loc = _loc(path, seq, i)
                span_end = max(span_end, loc.line)
                words.append(_k8s_expand(item, env, loc))
    for vm in c.get("volumeMounts") or []:
        if isinstance(vm, dict) and str(vm.get("name")) in volumes:
            host, hloc = volumes[str(vm["name"])]
            dep.mounts.append(Mount(host, str(vm.get("mountPath", "")), hloc, f"container {name!r}"))
    if not words:
        return
    _run_words(dep, words, env, complete, name, Loc(path, cpos[0], cpos[1], cpos[0], span_end), text, path)


# -- compose --------------------------------------------------------------------------------


_COMPOSE_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def _compose_interp(value: Any, loc: Loc) -> Word:
    """Compose interpolation: ``$$`` is a dollar, ``${VAR:-default}`` its default, other variables unknown."""
    known = True

    def sub(m: re.Match[str]) -> str:
        nonlocal known
        if m.group(0) == "$$":
            return "$"
        if m.group(2) is not None:
            return m.group(3) or ""
        known = False
        return m.group(0)

    return Word(_COMPOSE_VAR.sub(sub, str(value)), known, loc)


def _compose_cmd(svc: Any, key: str, path: str, text: str) -> list[Word] | None:
    val = svc.get(key)
    if val is None:
        return None
    if isinstance(val, list):
        return [_compose_interp(item, _loc(path, val, i)) for i, item in enumerate(val)]
    line, col = _pos(svc, key)
    origin = _script_origin(text, line, col) if text else (line, col)
    raw = str(val).replace("$$", "\0")
    words = read_shell_words(raw, path, origin)
    return [Word(w.text.replace("\0", "$"), w.known, w.loc) for w in words]


def read_compose(doc: Any, path: str, text: str) -> Deployment:
    dep = Deployment()
    services = doc.get("services") or {}
    if not isinstance(services, dict):
        return dep
    for sname, svc in services.items():
        if not isinstance(svc, dict):
            continue
        env: dict[str, EnvVal] = {}
        complete = not svc.get("env_file")
        environ = svc.get("environment")
        if isinstance(environ, dict):
            for k, v in environ.items():
                loc = _loc(path, environ, k)
                env[str(k)] = EnvVal(None, loc) if v is None else _env_val(v, loc)
        elif isinstance(environ, list):
            for i, item in enumerate(environ):
                k, sep, v = str(item).partition("=")
                loc = _loc(path, environ, i)
                env[k] = _env_val(v, loc) if sep else EnvVal(None, loc)
        for i, vol in enumerate(svc.get("volumes") or []):
            host, target = None, ""
            if isinstance(vol, str):
                parts = vol.split(":")
                if len(parts) >= 2:
                    host, target = parts[0], parts[1]
            elif isinstance(vol, dict) and vol.get("type", "bind") == "bind":
                host, target = vol.get("source"), str(vol.get("target", ""))
            if host and str(host).startswith("/"):
                dep.mounts.append(
                    Mount(str(host), target, _loc(path, svc["volumes"], i), f"service {sname!r}")
                )
        entry = _compose_cmd(svc, "entrypoint", path, text)
        cmd = _compose_cmd(svc, "command", path, text) or []
        words = (entry or []) + cmd
        if not words:
            continue
        spos = getattr(svc, "pos", (1, 1))
        end = max([spos[0]] + [w.loc.line for w in words if w.loc])
        _run_words(
            dep, words, env, complete, str(sname), Loc(path, spos[0], spos[1], spos[0], end), text, path
        )
    return dep


def _env_val(v: Any, loc: Loc) -> EnvVal:
    if isinstance(v, bool):
        v = "true" if v else "false"
    w = _compose_interp(v, loc)
    return EnvVal(w.text if w.known else None, loc)
