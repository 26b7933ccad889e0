"""Big batches in slices: what one request may cost the other clients of the loop.

A batch op (PUT, GET, LOOKUP, ...) may carry up to :data:`infera.kvd.protocol.MAX_BATCH` items,
and its handler costs a few microseconds per item: a 65,536-key PUT held the loop for about 0.2 s
on the development VM, so a client sending such frames in a row pushed a healthy client's p99 past
a quarter of a second. A request with more than :data:`SLICE_ITEMS` items is therefore handled
:data:`SLICE_ITEMS` at a time, one slice per turn of the loop (``netio``): other clients' waiting
frames go between two slices. From the client's side nothing changes: one request, one reply with
everything in order, and its own later frames wait until the reply is out.

What stays whole: the request is checked in full before its first slice (a PUT with one bad length
still reserves nothing), and a LOOKUP stops at the first slice that ends its prefix. What is cut:
keys of one SEAL are linked into a chain within a slice only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infera.kvd.conn import Client, Reply

SLICE_ITEMS = 1024  # items of one batch handled per turn (a PUT slice costs ~3 ms on the dev VM)


def _sum(*fields: str) -> Callable[[dict[str, Any], dict[str, Any], int, int], bool]:
    def merge(total: dict[str, Any], part: dict[str, Any], base: int, n: int) -> bool:
        for f in fields:
            total[f] = total.get(f, 0) + part.get(f, 0)
        return True

    return merge


def _concat(field: str) -> Callable[[dict[str, Any], dict[str, Any], int, int], bool]:
    def merge(total: dict[str, Any], part: dict[str, Any], base: int, n: int) -> bool:
        total.setdefault(field, []).extend(part.get(field, ()))
        return True

    return merge


def _lookup(total: dict[str, Any], part: dict[str, Any], base: int, n: int) -> bool:
    """A LOOKUP's count is a prefix: the next slice only matters if this one was found whole."""
    count = part.get("count", 0)
    total["count"] = total.get("count", 0) + count
    if part.get("long"):
        total.setdefault("long", []).extend(base + i for i in part["long"])
    if part.get("loading"):
        total["loading"] = True
    if "held" in part and total.get("held", 0) == base:  # held is a prefix of the keys too
        total["held"] = base + part["held"]
    return count == n


def _prewarm(total: dict[str, Any], part: dict[str, Any], base: int, n: int) -> bool:
    total["queued"] = total.get("queued", 0) + part.get("queued", 0)
    total["read_gbps"] = part.get("read_gbps")
    return True


@dataclass(frozen=True)
class SliceSpec:
    """How one op's request is cut and its replies put back together."""

    fields: tuple[str, ...]  # parallel batch fields, cut at the same items
    kind: str  # "keys" or "ints": what the first field holds (checked in full before slice one)
    merge: Callable[[dict[str, Any], dict[str, Any], int, int], bool]  # False: stop here
    first_only: tuple[str, ...] = ()  # fields only the first slice carries (ADOPT's failed)


SPECS: dict[str, SliceSpec] = {
    "PUT": SliceSpec(("keys", "lengths"), "keys", _concat("slots")),
    "GET": SliceSpec(("keys",), "keys", _concat("items")),
    "LOOKUP": SliceSpec(("keys",), "keys", _lookup),
    "DELETE": SliceSpec(("keys",), "keys", _sum("deleted")),
    "PREWARM": SliceSpec(("keys",), "keys", _prewarm),
    "ADOPT": SliceSpec(("keys", "lengths"), "keys", _sum("adopted", "written_through"), ("failed",)),
    "SEAL": SliceSpec(("tokens",), "ints", _sum("sealed")),
    "ABORT": SliceSpec(("tokens",), "ints", _sum("aborted")),
    "RELEASE": SliceSpec(("leases",), "ints", _sum("released")),
}
# what a slice's request never carries: its reply is merged (and sent, or not) by the Sliced
_DROPPED = frozenset(("id", "noreply"))


def spec_for(msg: dict[str, Any]) -> SliceSpec | None:
    """The spec of a request too big for one slice; None for any other request."""
    spec = SPECS.get(msg.get("op"))  # type: ignore[arg-type]
    if spec is None:
        return None
    batch = msg.get(spec.fields[0])
    return spec if isinstance(batch, list) and len(batch) > SLICE_ITEMS else None


class Sliced:
    """One request being handled slice by slice; it sits at the front of its client's inbox."""

    __slots__ = ("base", "done", "msg", "n", "spec", "total", "waiting")

    def __init__(self, msg: dict[str, Any], spec: SliceSpec) -> None:
        self.msg = msg
        self.spec = spec
        self.n = len(msg[spec.fields[0]])
        self.base = 0  # first item of the next slice
        self.total: dict[str, Any] = {}
        self.waiting = False  # a slice's handler waits for a tier (see Server.resume)
        self.done = False

    def next_request(self) -> dict[str, Any]:
        """The request of the next slice: the fields cut at the same items, the rest as sent."""
        lo, hi = self.base, self.base + SLICE_ITEMS
        sub = {k: v for k, v in self.msg.items() if k not in _DROPPED}
        for f in self.spec.fields:
            if isinstance(sub.get(f), list):
                sub[f] = sub[f][lo:hi]
        if lo:
            for f in self.spec.first_only:
                sub.pop(f, None)
            sub["_more"] = True  # counters counted per request skip later slices
        sub["_sliced"] = self
        return sub

    def add(self, reply: dict[str, Any]) -> None:
        """Fold one slice's reply in; ``done`` once the batch is through or its answer is known."""
        n = min(SLICE_ITEMS, self.n - self.base)
        go_on = self.spec.merge(self.total, reply, self.base, n)
        self.base += n
        self.done = not go_on or self.base >= self.n

    def reply(self) -> dict[str, Any] | None:
        """The request's one reply (None for a ``noreply`` request)."""
        return None if self.msg.get("noreply") else self.total


class SliceRunner:
    """Mixin of the loop that runs :class:`Sliced` requests; :class:`infera.kvd.server.Server`
    provides the state and the methods named here."""

    # (annotations only: a stub here would shadow the real methods in the server's MRO)
    _ready: dict[int, Client]
    _answer: Callable[[Client, Any, Callable[[], Reply]], None]  # Server
    _dispatch: Callable[[Client, Any, str], Reply]  # Server
    _interest: Callable[[Client], None]  # NetOut
    check_batch: Callable[[dict[str, Any], SliceSpec], None]  # Ops

    def _start_sliced(self, client: Client, msg: dict[str, Any], spec: SliceSpec) -> None:
        """Check the whole request (a bad one is answered as ever), then run its first slice;
        the rest follow in the client's next turns (``NetIO._run_inbox``)."""
        try:
            self.check_batch(msg, spec)
        except Exception as exc:
            self._answer_error(client, msg, exc)
            return
        job = Sliced(msg, spec)
        client.inbox.appendleft(job)
        self._run_slice(client, job)

    def _answer_error(self, client: Client, msg: dict[str, Any], error: Exception) -> None:
        """Answer ``msg`` with ``error`` as ``Server._answer`` answers any handler's (typed,
        counted, logged; nothing for a ``noreply`` request)."""

        def fail() -> Reply:
            raise error

        self._answer(client, msg, fail)

    def _run_slice(self, client: Client, job: Sliced) -> None:
        sub = job.next_request()
        self._slice_step(client, job, lambda: self._dispatch(client, sub, ""))

    def _slice_step(self, client: Client, job: Sliced, run: Callable[[], Reply]) -> None:
        """Run one slice's handler (or a resumed one, ``Server.resume``) and fold its reply in; the
        last slice, or an error in any, answers the request and takes it off the inbox."""
        error: Exception | None = None
        try:
            part = run()
        except Exception as exc:  # answered below (_answer_error)
            part, error = None, exc
        job.waiting = part is None and error is None  # a tier is reading: resume continues it
        if part is not None:
            job.add(part)
        if error is not None or job.done:
            client.inbox.remove(job)
            if error is not None:  # what earlier slices did stands (reservations end with the connection)
                self._answer_error(client, job.msg, error)
            else:
                reply = job.reply()
                if reply is not None:
                    self._answer(client, job.msg, lambda: reply)
        if client.inbox and not client.out_paused and not job.waiting:
            self._ready[client.id] = client
        self._interest(client)


def at_front_waiting(inbox: Any) -> bool:
    """Whether a client's inbox starts with a sliced request waiting for a tier (no turn needed)."""
    return bool(inbox) and isinstance(inbox[0], Sliced) and inbox[0].waiting


__all__ = ["SLICE_ITEMS", "SPECS", "SliceRunner", "SliceSpec", "Sliced", "at_front_waiting", "spec_for"]
