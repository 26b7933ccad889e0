"""systemd units and env files read into the deployment model."""

from __future__ import annotations

import os
import re

from infera.launch.lint.commands import EnvVal, Word, build_process, recognize
from infera.launch.lint.shtok import ShellSyntaxError
from infera.launch.model import Daemon, Deployment, Leg, Loc

_C_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "s": " ",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
}
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def logical_lines(text: str) -> list[tuple[str, list[tuple[int, int]]]]:
    """Unit-file lines with backslash continuations joined; each char keeps its (line, col)."""
    out: list[tuple[str, list[tuple[int, int]]]] = []
    buf: list[str] = []
    pos: list[tuple[int, int]] = []
    for n, raw in enumerate(text.splitlines(), 1):
        stripped = raw.lstrip()
        if not buf and (not stripped or stripped[0] in "#;"):
            continue
        if buf and stripped[:1] in ("#", ";"):
            continue  # systemd skips comment lines inside a continuation
        line = raw.rstrip()
        cont = line.endswith("\\")
        if cont:
            line = line[:-1]
        for col, ch in enumerate(line, 1):
            buf.append(ch)
            pos.append((n, col))
        if cont:
            buf.append(" ")
            pos.append((n, len(line) + 1))
            continue
        out.append(("".join(buf), pos))
        buf, pos = [], []
    if buf:
        out.append(("".join(buf), pos))
    return out


def split_systemd(text: str, pos: list[tuple[int, int]], env: dict[str, EnvVal], path: str) -> list[Word]:
    """Split a systemd command line: quotes, C escapes, ``%%``, ``$$`` and ``${VAR}`` from Environment=."""
    words: list[Word] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            break
        start = i
        buf: list[str] = []
        known = True
        quote = ""
        while i < n:
            c = text[i]
            if quote:
                if c == quote:
                    quote = ""
                    i += 1
                    continue
            elif c.isspace():
                break
            elif c in "'\"":
                quote = c
                i += 1
                continue
            if c == "\\" and i + 1 < n:
                buf.append(_C_ESCAPES.get(text[i + 1], text[i + 1]))
                i += 2
                continue
            if c == "%" and i + 1 < n:
                if text[i + 1] != "%":
                    known = False
                buf.append("%" if text[i + 1] == "%" else text[i : i + 2])
                i += 2
                continue
            if c == "$" and i + 1 < n:
                if text[i + 1] == "$":
                    buf.append("$")
                    i += 2
                    continue
                m = re.match(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", text[i:])
                if m:
                    val = env.get(m.group(1) or m.group(2))
                    if val is None or val.value is None:
                        known = False
                        buf.append(m.group(0))
                    else:
                        buf.append(val.value)
                    i += m.end()
                    continue
            buf.append(c)
            i += 1
        if quote:
            line, col = pos[start] if start < len(pos) else (1, 1)
            raise ShellSyntaxError(0, f"unterminated quote starting at line {line} column {col}")
        line, col = pos[start] if start < len(pos) else (1, 1)
        words.append(Word("".join(buf), known, Loc(path, line, col)))
    return words


def read_unit(text: str, path: str) -> Deployment:
    """A systemd service unit: Environment=, EnvironmentFile=, ExecStart=."""
    dep = Deployment()
    env: dict[str, EnvVal] = {}
    complete = True
    section = ""
    name = os.path.basename(path)
    execs: list[tuple[list[Word], Loc]] = []
    for text_line, pos in logical_lines(text):
        s = text_line.strip()
        if s.startswith("[") and s.endswith("]"):
            section = s[1:-1]
            continue
        if section != "Service" or "=" not in s:
            continue
        lead = len(text_line) - len(text_line.lstrip())
        key, _, value = text_line.strip().partition("=")
        key = key.strip()
        off = lead + text_line.strip().index("=") + 1
        while off < len(text_line) and text_line[off] == " ":
            off += 1
        vpos = pos[off:]
        value = text_line[off:]
        if key == "Environment":
            if not value.strip():
                env.clear()
                continue
            for w in split_systemd(value, vpos, {}, path):
                k, sep, v = w.text.partition("=")
                if sep and _KEY_RE.match(k):
                    env[k] = EnvVal(v if w.known else None, w.loc)
        elif key in ("EnvironmentFile", "PassEnvironment"):
            complete = False
        elif key == "UnsetEnvironment":
            for w in split_systemd(value, vpos, {}, path):
                env.pop(w.text.partition("=")[0], None)
        elif key == "ExecStart" and value.strip():
            j = 0
            while j < len(value) and value[j] in "@-:+!|":
                j += 1
            line, col = vpos[0] if vpos else (1, 1)
            execs.append(
                (
                    split_systemd(value[j:], vpos[j:], env, path),
                    Loc(path, line, col, line, vpos[-1][0] if vpos else line),
                )
            )
    for words, loc in execs:
        rec = recognize(words, env)
        if rec is None:
            continue
        eff = rec.effective_env(env)
        proc, mounts = build_process(rec, name, eff, complete, loc)
        dep.add(proc)
        dep.mounts.extend(mounts)
    return dep


def read_env_file(text: str, path: str) -> Deployment:
    """``KEY=value`` lines: the environment of one process whose command is elsewhere."""
    name = os.path.basename(path)
    proc: Daemon | Leg = Daemon(name=name) if name in ("kvd.env", "infera-kvd.env") else Leg(name=name)
    proc.loc = Loc(path, 1, 1)
    for n, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        if not s or s[0] in "#;":
            continue
        if s.startswith("export "):
            s = s[7:].lstrip()
        key, sep, value = s.partition("=")
        key = key.strip()
        if not sep or not _KEY_RE.match(key):
            raise ShellSyntaxError(0, f"line {n}: expected KEY=value, got {raw.strip()!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
            if raw.strip().partition("=")[2].strip()[0] == '"':
                value = re.sub(r"\\(.)", r"\1", value)
        proc.env[key] = value
        proc.env_locs[key] = Loc(path, n, raw.index(key) + 1)
    dep = Deployment()
    dep.add(proc)
    return dep
