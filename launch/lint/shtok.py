"""A POSIX/bash tokenizer that keeps positions: enough shell to read deployment scripts.

It handles single, double and ANSI-C quotes, backslash escapes, line continuations, comments,
``$VAR``/``${VAR:-default}``/``$(...)``/backticks (kept as segments so the interpreter can expand
them), redirections and here-documents (bodies are kept, so ``bash <<EOF`` scripts can be read too).
It does not execute anything and does not try to be a full shell grammar: control keywords come out as
plain words and the interpreter skips them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class ShellSyntaxError(Exception):
    def __init__(self, pos: int, message: str) -> None:
        super().__init__(message)
        self.pos = pos
        self.message = message


@dataclass
class Seg:
    kind: str  # "lit" | "var" | "cmd"
    text: str
    quoted: bool


@dataclass
class SWord:
    segs: list[Seg]
    pos: int
    end: int

    def literal(self) -> str | None:
        """The word's text when it has no expansions, else None."""
        if any(s.kind != "lit" for s in self.segs):
            return None
        return "".join(s.text for s in self.segs)


@dataclass
class HereDoc:
    delim: str
    strip_tabs: bool
    body: str = ""
    body_pos: int = 0


@dataclass
class Tok:
    kind: str  # "word" | "op" | "nl" | "redir"
    pos: int
    word: SWord | None = None
    op: str = ""
    heredoc: HereDoc | None = None


_OPS = ("&&", "||", ";;&", ";;", ";&", "|&", ";", "&", "|", "(", ")")
_REDIRS = ("<<<", "<<-", "<<", "<>", "<&", "<", ">>", ">&", ">|", ">", "&>>", "&>")
_META = set(" \t\r\n;&|()<>")
_ANSI = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "a": "\a",
    "b": "\b",
    "e": "\x1b",
    "0": "\0",
}


@dataclass
class _Parts:
    """The segments of one word (or of one double-quoted part of it) as the lexer reads them:
    literal characters gather until an expansion or a quoted part starts a new segment."""

    quoted: bool
    segs: list[Seg] = field(default_factory=list)
    buf: list[str] = field(default_factory=list)

    def char(self, text: str) -> None:
        self.buf.append(text)

    def flush(self) -> None:
        if self.buf:
            self.segs.append(Seg("lit", "".join(self.buf), self.quoted))
            self.buf.clear()

    def seg(self, seg: Seg) -> None:
        self.flush()
        self.segs.append(seg)


@dataclass
class Lexer:
    src: str
    i: int = 0
    toks: list[Tok] = field(default_factory=list)
    pending: list[HereDoc] = field(default_factory=list)

    def run(self) -> list[Tok]:
        s, n = self.src, len(self.src)
        while self.i < n:
            c = s[self.i]
            if c in " \t\r":
                self.i += 1
            elif c == "\\" and s.startswith("\n", self.i + 1):
                self.i += 2
            elif c == "#":
                j = s.find("\n", self.i)
                self.i = n if j < 0 else j
            elif c == "\n":
                self.toks.append(Tok("nl", self.i))
                self.i += 1
                if self.pending:
                    self._heredoc_bodies()
            elif c in "<>" or s.startswith("&>", self.i):
                self._redir()
            else:
                op = next((o for o in _OPS if s.startswith(o, self.i)), None)
                if op is not None:
                    self.toks.append(Tok("op", self.i, op=op))
                    self.i += len(op)
                    continue
                word = self._word()
                lit = word.literal()
                if lit is not None and lit.isdigit() and self.i < n and s[self.i] in "<>":
                    self._redir()
                    continue
                self.toks.append(Tok("word", word.pos, word=word))
        if self.pending:
            raise ShellSyntaxError(n, f"here-document delimited by {self.pending[0].delim!r} is not closed")
        return self.toks

    def _redir(self) -> None:
        s = self.src
        start = self.i
        op = next(o for o in _REDIRS if s.startswith(o, self.i))
        self.i += len(op)
        if op in ("<", ">") and s.startswith("(", self.i):  # process substitution
            end = _balanced(s, self.i + 1, start)
            self.i = end + 1
            return
        while self.i < len(s) and s[self.i] in " \t":
            self.i += 1
        if self.i >= len(s) or s[self.i] in _META:
            raise ShellSyntaxError(start, f"redirection {op} has no target")
        target = self._word()
        tok = Tok("redir", start, word=target, op=op)
        if op in ("<<", "<<-"):
            delim = "".join(seg.text if seg.kind == "lit" else "$" + seg.text for seg in target.segs)
            tok.heredoc = HereDoc(delim, op == "<<-")
            self.pending.append(tok.heredoc)
        self.toks.append(tok)

    def _heredoc_bodies(self) -> None:
        s = self.src
        for doc in self.pending:
            doc.body_pos = self.i
            lines = []
            while True:
                if self.i >= len(s):
                    raise ShellSyntaxError(
                        doc.body_pos, f"here-document delimited by {doc.delim!r} is not closed"
                    )
                j = s.find("\n", self.i)
                line = s[self.i : len(s) if j < 0 else j]
                self.i = len(s) if j < 0 else j + 1
                check = line.lstrip("\t") if doc.strip_tabs else line
                if check == doc.delim:
                    break
                lines.append(line + "\n")
            doc.body = "".join(lines)
        self.pending = []

    def _word(self) -> SWord:
        s, n = self.src, len(self.src)
        start = self.i
        out = _Parts(quoted=False)
        while self.i < n:
            c = s[self.i]
            if c in _META:
                break
            if c == "\\":
                if self.i + 1 < n:
                    if s[self.i + 1] != "\n":
                        out.char(s[self.i + 1])
                    self.i += 2
                else:
                    self.i += 1
                continue
            if c == "'":
                j = s.find("'", self.i + 1)
                if j < 0:
                    raise ShellSyntaxError(self.i, "unterminated single quote")
                out.seg(Seg("lit", s[self.i + 1 : j], True))
                self.i = j + 1
                continue
            if c == "$" and s.startswith("'", self.i + 1):
                out.seg(Seg("lit", self._ansi(), True))
                continue
            if c == '"' or (c == "$" and s.startswith('"', self.i + 1)):
                out.flush()
                if c == "$":
                    self.i += 1
                out.segs.extend(self._double())
                continue
            self._char_or_expansion(out)
        out.flush()
        return SWord(out.segs, start, self.i)

    def _ansi(self) -> str:
        s = self.src
        start = self.i
        self.i += 2
        out: list[str] = []
        while self.i < len(s):
            c = s[self.i]
            if c == "'":
                self.i += 1
                return "".join(out)
            if c == "\\" and self.i + 1 < len(s):
                nxt = s[self.i + 1]
                out.append(_ANSI.get(nxt, "\\" + nxt))
                self.i += 2
                continue
            out.append(c)
            self.i += 1
        raise ShellSyntaxError(start, "unterminated $'...' quote")

    def _double(self) -> list[Seg]:
        s = self.src
        start = self.i
        self.i += 1
        out = _Parts(quoted=True)
        while self.i < len(s):
            c = s[self.i]
            if c == '"':
                self.i += 1
                out.flush()
                if not out.segs:
                    out.segs.append(Seg("lit", "", True))
                return out.segs
            if c == "\\" and self.i + 1 < len(s):
                nxt = s[self.i + 1]
                if nxt == "\n":
                    pass
                elif nxt in '$`"\\':
                    out.char(nxt)
                else:
                    out.char("\\" + nxt)
                self.i += 2
                continue
            self._char_or_expansion(out)
        raise ShellSyntaxError(start, "unterminated double quote")

    def _char_or_expansion(self, out: _Parts) -> None:
        """The character at the cursor, into ``out``: an expansion's segment at ``$`` or a
        backquote, else (also a ``$`` that starts none) a literal character."""
        c = self.src[self.i]
        seg: Seg | None = None
        if c == "`":
            seg = self._backtick(out.quoted)
        elif c == "$":
            seg = self._dollar(out.quoted)
        if seg is None:
            out.char(c)
            self.i += 1
        else:
            out.seg(seg)

    def _dollar(self, quoted: bool) -> Seg | None:
        s = self.src
        i = self.i
        nxt = s[i + 1] if i + 1 < len(s) else ""
        if nxt == "{":
            end = _balanced(s, i + 2, i, "{", "}")
            self.i = end + 1
            return Seg("var", s[i + 2 : end], quoted)
        if nxt == "(":
            end = _balanced(s, i + 2, i)
            self.i = end + 1
            return Seg("cmd", s[i + 2 : end], quoted)
        if nxt.isalpha() or nxt == "_":
            j = i + 1
            while j < len(s) and (s[j].isalnum() or s[j] == "_"):
                j += 1
            self.i = j
            return Seg("var", s[i + 1 : j], quoted)
        if nxt and (nxt.isdigit() or nxt in "@*#?$!-"):
            self.i = i + 2
            return Seg("var", nxt, quoted)
        return None

    def _backtick(self, quoted: bool) -> Seg:
        s = self.src
        j = self.i + 1
        while j < len(s) and s[j] != "`":
            j += 2 if s[j] == "\\" else 1
        if j >= len(s):
            raise ShellSyntaxError(self.i, "unterminated backquote")
        seg = Seg("cmd", s[self.i + 1 : j], quoted)
        self.i = j + 1
        return seg


def _balanced(s: str, i: int, start: int, open_: str = "(", close: str = ")") -> int:
    """Index of the ``close`` matching an already-consumed ``open_``, skipping quoted text."""
    depth = 1
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "'" and open_ == "(":
            j = s.find("'", i + 1)
            if j < 0:
                break
            i = j + 1
            continue
        if c == '"':
            j = i + 1
            while j < len(s) and s[j] != '"':
                j += 2 if s[j] == "\\" else 1
            i = j + 1
            continue
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ShellSyntaxError(start, f"unterminated {'$' + open_}")


def tokenize(src: str) -> list[Tok]:
    return Lexer(src).run()
