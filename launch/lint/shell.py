"""Read a shell script into the deployment model, following variables and exported environment.

The interpreter walks the simple commands in order and keeps what a reader would: shell variables
(``SOCK=/run/kvd.sock``), which of them are exported (``export``, ``set -a``), per-command
assignments (``VAR=x cmd``, ``env VAR=x cmd``), ``docker run -e``. ``$VAR`` and ``${VAR:-default}``
are expanded when the script sets them; anything else (``$1``, ``$(hostname)``) stays unknown, and
rules skip unknown values. Scripts inside scripts are read too: ``bash -c '...'``, ``bash <<EOF``
and ``ssh host <<EOF`` / ``ssh host 'cmd'``.
"""

from __future__ import annotations

import bisect
import copy
import os
import re
from dataclasses import dataclass, field

from infera.launch.lint.commands import EnvVal, Word, build_process, recognize
from infera.launch.lint.shtok import HereDoc, SWord, Tok, tokenize
from infera.launch.model import Deployment, Loc

PREWARM_PATH = "/v1/cache/prewarm"
_RESERVED = {
    "if",
    "then",
    "else",
    "elif",
    "fi",
    "do",
    "done",
    "while",
    "until",
    "!",
    "{",
    "}",
    "time",
    "function",
    "esac",
}
_ASSIGN_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
_SHELLS = {"bash", "sh", "dash", "zsh", "ksh"}
_SSH_VALUE_OPTS = set("bcDEeFIiJLlmOoPpQRSWw")


@dataclass
class _State:
    vars: dict[str, EnvVal] = field(default_factory=dict)
    exported: set[str] = field(default_factory=set)
    allexport: bool = False
    env_complete: bool = True

    def env(self) -> dict[str, EnvVal]:
        return {k: self.vars[k] for k in self.exported if k in self.vars}

    def child(self) -> _State:
        """What a sub-shell starts with: the exported variables only."""
        env = self.env()
        return _State(dict(env), set(env), False, self.env_complete)


class ShellReader:
    def __init__(
        self, text: str, path: str, origin: tuple[int, int] = (1, 1), state: _State | None = None
    ) -> None:
        self.text = text
        self.path = path
        self.origin = origin
        self.state = state or _State()
        self.starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
        self.dep = Deployment()
        self.counts: dict[str, int] = {}

    # -- positions ---------------------------------------------------------------------------
    def lc(self, pos: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.starts, pos)
        col = pos - self.starts[line - 1] + 1
        if line == 1:
            col += self.origin[1] - 1
        return line + self.origin[0] - 1, col

    def loc(self, pos: int, first: int | None = None, last: int | None = None) -> Loc:
        line, col = self.lc(pos)
        return Loc(
            self.path,
            line,
            col,
            self.lc(first)[0] if first is not None else None,
            self.lc(last)[0] if last is not None else None,
        )

    # -- expansion -----------------------------------------------------------------------------
    def expand(self, w: SWord, span: tuple[int, int] | None = None) -> Word:
        out: list[str] = []
        known = True
        for seg in w.segs:
            if seg.kind == "lit":
                out.append(seg.text)
            elif seg.kind == "var":
                val = self._var(seg.text)
                if val is None:
                    known = False
                    out.append("${" + seg.text + "}")
                else:
                    out.append(val)
            else:
                known = False
                out.append("$(" + seg.text + ")")
        first, last = span if span else (None, None)
        return Word("".join(out), known, self.loc(w.pos, first, last))

    def _var(self, expr: str) -> str | None:
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-=])(.*))?", expr, re.S)
        if not m:
            return None
        name, op, default = m.group(1), m.group(2), m.group(3)
        cur = self.state.vars.get(name)
        if cur is not None and (cur.value or not op or not op.startswith(":")):
            return cur.value
        if op and "$" not in (default or "") and "`" not in (default or ""):
            return default or ""
        return None

    # -- reading -------------------------------------------------------------------------------
    def read(self) -> Deployment:
        toks = tokenize(self.text)
        cmd: list[Tok] = []
        for tok in toks:
            if tok.kind in ("op", "nl"):
                if cmd:
                    self._command(cmd)
                cmd = []
            else:
                cmd.append(tok)
        if cmd:
            self._command(cmd)
        return self.dep

    def _command(self, toks: list[Tok]) -> None:
        words = [t.word for t in toks if t.kind == "word" and t.word is not None]
        heredocs = [t.heredoc for t in toks if t.heredoc is not None]
        while words and words[0].literal() in _RESERVED and not any(s.quoted for s in words[0].segs):
            words.pop(0)
        if not words:
            return
        span = (words[0].pos, max(w.end for w in words) - 1)
        assigns: dict[str, EnvVal] = {}
        i = 0
        while i < len(words):
            name_val = self._assignment(words[i], span)
            if name_val is None:
                break
            assigns[name_val[0]] = name_val[1]
            i += 1
        rest = words[i:]
        if not rest:
            for k, v in assigns.items():
                self.state.vars[k] = v
                if self.state.allexport:
                    self.state.exported.add(k)
            return
        if self._builtin(rest, span):
            return
        expanded = [self.expand(w, span) for w in rest]
        for w in expanded:
            if PREWARM_PATH in w.text and w.loc is not None:
                self.dep.prewarm_refs.append(w.loc)
        env = {**self.state.env(), **assigns}
        if self._nested(expanded, heredocs, env):
            return
        rec = recognize(expanded, env)
        if rec is None:
            return
        eff = rec.effective_env(env)
        start = self.loc(span[0], span[0], span[1])
        name = f"{os.path.basename(self.path)}:{start.line}"
        proc, mounts = build_process(rec, name, eff, self.state.env_complete, start)
        self.dep.add(proc)
        self.dep.mounts.extend(mounts)

    def _assignment(self, w: SWord, span: tuple[int, int]) -> tuple[str, EnvVal] | None:
        if not w.segs or w.segs[0].kind != "lit" or w.segs[0].quoted:
            return None
        m = _ASSIGN_RE.match(w.segs[0].text)
        if not m:
            return None
        rest = SWord([copy.copy(w.segs[0]), *w.segs[1:]], w.pos, w.end)
        rest.segs[0].text = rest.segs[0].text[m.end() :]
        val = self.expand(rest, span)
        value: str | None = val.text if val.known else None
        if m.group(2) == "+":
            prev = self.state.vars.get(m.group(1))
            value = (prev.value + value) if prev and prev.value is not None and value is not None else None
        return m.group(1), EnvVal(value, self.loc(w.pos, *span))

    def _builtin(self, words: list[SWord], span: tuple[int, int]) -> bool:
        head = words[0].literal()
        args = words[1:]
        st = self.state
        if head in ("export", "declare", "typeset", "local", "readonly"):
            exporting = head == "export" or any(
                (a.literal() or "").startswith("-") and "x" in (a.literal() or "") for a in args
            )
            unexport = any(a.literal() == "-n" for a in args) and head == "export"
            for a in args:
                lit = a.literal()
                if lit is not None and lit.startswith("-"):
                    continue
                nv = self._assignment(a, span)
                if nv is not None:
                    st.vars[nv[0]] = nv[1]
                    name = nv[0]
                else:
                    name = (lit or "").strip()
                    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                        continue
                    if name not in st.vars:
                        continue  # exported from the caller's environment: unknown to us
                if unexport:
                    st.exported.discard(name)
                elif exporting or st.allexport:
                    st.exported.add(name)
            return True
        if head == "unset":
            for a in args:
                lit = a.literal()
                if lit and not lit.startswith("-"):
                    st.vars.pop(lit, None)
                    st.exported.discard(lit)
            return True
        if head == "set":
            lits = [a.literal() or "" for a in args]
            for j, lit in enumerate(lits):
                if lit.startswith("-") and "a" in lit and not lit.startswith("--"):
                    st.allexport = True
                elif lit.startswith("+") and "a" in lit:
                    st.allexport = False
                elif lit in ("-o", "+o") and j + 1 < len(lits) and lits[j + 1] == "allexport":
                    st.allexport = lit == "-o"
            return True
        if head in ("source", "."):
            st.env_complete = False
            return True
        return False

    def _nested(self, words: list[Word], heredocs: list[HereDoc], env: dict[str, EnvVal]) -> bool:
        """``bash -c '...'``, ``bash <<EOF``, ``ssh host ...``: read the inner script, return True."""
        if not words:
            return False
        head = os.path.basename(words[0].text)
        if head in _SHELLS:
            for j, w in enumerate(words[1:], 1):
                if w.text == "-c" and j + 1 < len(words):
                    inner = words[j + 1]
                    if inner.known and inner.loc is not None:
                        self._sub(inner.text, (inner.loc.line, inner.loc.col + 1), self._child(env))
                    return True
            if heredocs and heredocs[-1].body:
                self._heredoc(heredocs[-1], self._child(env))
                return True
            return False
        if head == "ssh":
            j = 1
            while j < len(words) and words[j].text.startswith("-"):
                opt = words[j].text
                j += 2 if len(opt) == 2 and opt[1] in _SSH_VALUE_OPTS else 1
            rest = words[j + 1 :]
            if (
                heredocs
                and heredocs[-1].body
                and (
                    not rest
                    or (os.path.basename(rest[0].text) in _SHELLS and "-c" not in [w.text for w in rest])
                )
            ):
                self._heredoc(heredocs[-1], _State())
                return True
            if rest:
                text = " ".join(w.text for w in rest)
                if rest[0].known and rest[0].loc is not None:
                    quoted_one = len(rest) == 1
                    self._sub(text, (rest[0].loc.line, rest[0].loc.col + (1 if quoted_one else 0)), _State())
                return True
            if heredocs and heredocs[-1].body:
                self._heredoc(heredocs[-1], _State())
                return True
        return False

    def _child(self, env: dict[str, EnvVal]) -> _State:
        st = self.state.child()
        for k, v in env.items():
            st.vars[k] = v
            st.exported.add(k)
        return st

    def _heredoc(self, doc: HereDoc, state: _State) -> None:
        line, _ = self.lc(doc.body_pos)
        self._sub(doc.body, (line, 1), state)

    def _sub(self, text: str, origin: tuple[int, int], state: _State) -> None:
        inner = ShellReader(text, self.path, origin, state)
        dep = inner.read()
        self.dep = self.dep.merge(dep)


def read_shell(text: str, path: str) -> Deployment:
    """Parse a shell script; raises :class:`~infera.launch.lint.shtok.ShellSyntaxError` on bad syntax."""
    return ShellReader(text, path).read()


def read_shell_words(text: str, path: str, origin: tuple[int, int]) -> list[Word]:
    """Split one command line (a systemd ``ExecStart=``, a compose string command) into words."""
    reader = ShellReader(text, path, origin)
    return [reader.expand(t.word) for t in tokenize(text) if t.kind == "word" and t.word is not None]
