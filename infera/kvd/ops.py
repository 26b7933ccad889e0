"""The request handlers of the daemon, one method per protocol op (docs/protocol.md).

They run on the loop thread only. A handler returns the reply map, or None when the request has
no reply (``noreply``) or its reply will come later through ``Server.resume`` (a long tier is
reading the data). Bad input raises :class:`BadRequest`, which becomes a typed error reply; every
handler first checks the request's ``id`` (:func:`~infera.kvd.conn.check_id`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from infera import __version__
from infera.kvd import protocol as P
from infera.kvd.chunk import link
from infera.kvd.conn import (
    BadRequest,
    Client,
    Reply,
    check_id,
    hello_info,
    id_checked,
    report_fields,
    request_ints,
    request_keys,
)
from infera.kvd.keyspace import ikey_prefix
from infera.kvd.tiers.base import FileBackedTier

if TYPE_CHECKING:
    from infera.kvd.arena import Arena
    from infera.kvd.config import DaemonConfig
    from infera.kvd.slices import SliceSpec
    from infera.kvd.store import Chunk, Store
    from infera.kvd.tiers.base import LongTier

log = logging.getLogger("infera.kvd")


class Ops:
    """Mixin of the op handlers; :class:`infera.kvd.server.Server` provides the state."""

    cfg: DaemonConfig
    store: Store | None
    arena: Arena | None
    long: LongTier | None
    snapshot_cache: dict[str, Any]

    def refresh_snapshot(self) -> None:  # provided by Server
        raise NotImplementedError

    def resume(self, client: Client, msg: dict[str, Any], handler: Any) -> None:  # provided by Server
        raise NotImplementedError

    # -- argument helpers (infera.kvd.conn) -------------------------------------------------
    _keys = staticmethod(request_keys)
    _ints = staticmethod(request_ints)

    def check_batch(self, msg: dict[str, Any], spec: SliceSpec) -> None:
        """A request handled in slices, checked in full before the first (its handler checks
        each slice again): bad keys, items or lengths anywhere refuse it before anything is done."""
        check_id(msg)
        first = self._keys(msg, spec.fields[0]) if spec.kind == "keys" else self._ints(msg, spec.fields[0])
        for field in spec.fields[1:]:
            vals = self._ints(msg, field)
            if len(vals) != len(first):
                raise BadRequest(f"{spec.fields[0]!r} and {field!r} must have the same length")
            if min(vals, default=0) < 0:
                raise BadRequest(f"{field} must not be negative")

    @property
    def live_store(self) -> Store:
        """The store: set from start to stop, the only time handlers run."""
        assert self.store is not None
        return self.store

    @staticmethod
    def _end_held(held: dict[int, Chunk], tokens: list[int], end: Callable[[Chunk], object]) -> int:
        """Take the chunks of ``tokens`` out of a client's ``held`` map and ``end`` each (an abort or a
        release); unknown tokens are skipped. Returns how many were ended."""
        n = 0
        for token in tokens:
            chunk = held.pop(token, None)
            if chunk is not None:
                end(chunk)
                n += 1
        return n

    def ikeys(self, client: Client, keys: list[bytes]) -> list[bytes]:
        """The ikeys of ``keys`` in the client's namespace (hot: up to MAX_BATCH keys a request)."""
        prefix = ikey_prefix(client.ns_id)
        return [prefix + k for k in keys]

    # -- ops --------------------------------------------------------------------------------
    def op_ping(self, client: Client, msg: dict[str, Any]) -> Reply:
        return {"pong": True, "server_version": __version__}

    def op_hello(self, client: Client, msg: dict[str, Any]) -> Reply:
        assert self.store is not None and self.arena is not None
        versions = msg.get("versions")
        if (
            not isinstance(versions, list)
            or not versions
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in versions)
        ):
            raise BadRequest(
                "'versions' must be a non-empty list of integers: the protocol versions the client speaks"
            )
        common = sorted(set(versions) & set(range(P.MIN_PROTOCOL_VERSION, P.PROTOCOL_VERSION + 1)))
        if not common:
            raise BadRequest(
                f"no common protocol version: client speaks {versions}, daemon speaks "
                f"{P.MIN_PROTOCOL_VERSION}..{P.PROTOCOL_VERSION}",
                "version",
            )
        namespace = msg.get("namespace", "")
        if not isinstance(namespace, str) or len(namespace) > P.MAX_NAMESPACE_LEN:
            raise BadRequest(f"'namespace' must be a string of at most {P.MAX_NAMESPACE_LEN} characters")
        info = hello_info(msg)
        if not client.hello or namespace != client.namespace:
            # one namespace at a time (a new HELLO replaces it), a few per connection in all
            table = self.store.ns
            if namespace not in client.ns_seen and len(client.ns_seen) >= P.MAX_NAMESPACES_PER_CONN:
                table.refused_total += 1
                raise BadRequest(
                    f"a connection may use at most {P.MAX_NAMESPACES_PER_CONN} namespaces; reconnect"
                )
            try:
                nid = self.store.ns_id(namespace)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
            if client.hello:
                table.release(client.ns_id)
            client.ns_seen.add(namespace)
            client.ns_id = nid
            client.namespace = namespace
            client.ns_used = False
        client.info = info
        client.hello = True
        reply: dict[str, Any] = {
            "version": common[-1],
            "server_version": __version__,
            "client_id": client.id,
            "arena_size": self.arena.capacity,
            "long_tier": self.cfg.long_backend,
        }
        if self.cfg.long_backend == "disk" and self.cfg.long_path:
            reply["long_path"] = os.path.abspath(self.cfg.long_path)
        client.arena_mapped = bool(msg.get("want_arena", True))
        if client.arena_mapped:
            reply["arena_fd"] = True
            reply["_fds"] = [self.arena.fd]
        return reply

    def op_put(self, client: Client, msg: dict[str, Any]) -> Reply:
        store = self.live_store
        keys = self._keys(msg)
        lengths = self._ints(msg, "lengths")
        if len(lengths) != len(keys):
            raise BadRequest("'keys' and 'lengths' must have the same length")
        # every check comes before the first reservation: a PUT reserves all its keys or none
        if min(lengths, default=0) < 0:
            raise BadRequest("lengths must not be negative")
        retention = msg.get("retention", "long")
        if not isinstance(retention, str) or retention not in P.RETENTION_CODE:
            raise BadRequest(f"retention must be one of {', '.join(P.RETENTIONS)}")
        code = P.RETENTION_CODE[retention]
        overwrite = bool(msg.get("overwrite", False))
        # the caller writes the long-tier file itself (GPU-direct) and ADOPTs it: no write-through
        persisted = bool(msg.get("persisted", False)) and self.long is not None
        slots: list[Any] = []
        budget = client.budget
        budget.expire(store.clock())
        reserved = store.reserve_many(
            self.ikeys(client, keys), lengths, code, overwrite, budget.room, idle=not budget.used
        )
        for res in reserved:
            if res.chunk is None:
                slots.append(res.error)
                if res.error == "quota":
                    budget.refuse(client.label)
                continue
            if persisted:
                res.chunk.on_long = True
            budget.reserved(res.chunk)
            token = client.next_token
            client.next_token += 1
            client.reservations[token] = res.chunk
            slots.append([token, res.chunk.offset])
        return {"slots": slots}

    def op_seal(self, client: Client, msg: dict[str, Any]) -> Reply:
        store = self.live_store
        tokens = self._ints(msg, "tokens")
        sealed = 0
        prev = None
        unreserved = client.budget.unreserved
        for token in tokens:
            chunk = client.reservations.pop(token, None)
            if chunk is None:
                continue
            unreserved(chunk)
            if store.seal(chunk):
                sealed += 1
                if prev is not None:
                    link(prev, chunk)  # a batch's keys are usually a prompt's chunks, in order
                prev = chunk
        if msg.get("noreply"):
            return None
        return {"sealed": sealed}

    def op_abort(self, client: Client, msg: dict[str, Any]) -> Reply:
        store, budget = self.live_store, client.budget

        def end(chunk: Chunk) -> None:
            budget.unreserved(chunk)
            store.abort(chunk)

        n = self._end_held(client.reservations, self._ints(msg, "tokens"), end)
        return None if msg.get("noreply") else {"aborted": n}

    def op_get(self, client: Client, msg: dict[str, Any]) -> Reply:
        store = self.live_store
        keys = self._keys(msg)
        ikeys = self.ikeys(client, keys)
        long = self.long
        # ram_only: the caller reads long-tier misses itself (GPU-direct); no promotion, and
        # what it will read is not counted as a miss here (it reports its own counters)
        ram_only = bool(msg.get("ram_only", False))
        found = store.find_many(ikeys)  # (a prompt's keys: along its chain of chunks)
        # RAM misses the long tier holds are read into the arena by its threads; the reply waits
        # for them (see resume), the loop does not.
        fetch = not msg.get("_resumed") and not ram_only and None in found
        if long is not None and fetch and long.fetch(ikeys, lambda: self.resume(client, msg, self.op_get)):
            return None
        items: list[Any] = []
        hits = 0
        direct = 0
        lease = client.budget.lease
        for ikey, chunk in zip(ikeys, found, strict=True):
            if chunk is None:
                if ram_only and long is not None and long.contains(ikey):
                    direct += 1
                items.append(None)
                continue
            lease(chunk)  # counted, never refused (see infera.kvd.budget)
            store.lease(chunk)
            token = client.next_token
            client.next_token += 1
            client.leases[token] = chunk
            items.append([token, chunk.offset, chunk.length])
            hits += 1
        misses = len(keys) - hits - direct
        c = store.c
        c["gets_total"] += len(keys) - direct
        c["hits_total"] += hits
        c["misses_total"] += misses
        budget = client.budget
        if budget.over and not budget.over_warned:
            budget.expire(store.clock())  # (ended holds first: only leases can pass the limit)
            if budget.over:
                budget.warn_over(client.label)
        if direct:
            c["gets_direct_total"] = c.get("gets_direct_total", 0) + direct
        if long is not None and misses:
            long.count_misses(misses)  # found neither in RAM nor (any more) on the long tier
        return {"items": items}

    def op_release(self, client: Client, msg: dict[str, Any]) -> Reply:
        store, budget = self.live_store, client.budget

        def end(chunk: Chunk) -> None:
            budget.release(chunk)
            store.release(chunk)

        n = self._end_held(client.leases, self._ints(msg, "leases"), end)
        return None if msg.get("noreply") else {"released": n}

    def op_lookup(self, client: Client, msg: dict[str, Any]) -> Reply:
        store = self.live_store
        keys = self._keys(msg)
        hold = msg.get("hold_ms", 0)
        if type(hold) not in (int, float) or not 0 <= hold <= 600_000:  # (NaN is out of range too)
            raise BadRequest("'hold_ms' must be a number between 0 and 600000")
        ikeys = self.ikeys(client, keys)
        count, slots = store.present(ikeys)
        held = self._hold(client, store.index.objs[slots], hold, slots) if hold and count else 0
        on_long_only: list[int] = []  # indices of found keys that only the long tier holds
        if count < len(ikeys) and self.long is not None:
            # the rest may be on the long tier (a RAM miss in the middle continues there); the
            # long tier answers for all of them at once (one store round trip for L4)
            rest = ikeys[count:]
            in_ram = [store.find(ikey) for ikey in rest]
            on_long = iter(
                self.long.contains_many([k for k, ch in zip(rest, in_ram, strict=True) if ch is None])
            )
            for chunk in in_ram:
                if chunk is not None:
                    store.touch(chunk)
                    if hold and self._hold(client, (chunk,), hold) and held == count:
                        held += 1  # still a prefix of held chunks
                elif not next(on_long):
                    break
                else:
                    on_long_only.append(count)
                count += 1
        c = store.c
        c["lookups_total"] += 0 if msg.get("_more") else 1  # a big one's later slices: same request
        c["lookup_keys_total"] += len(keys)
        c["lookup_hit_keys_total"] += count
        reply: dict[str, Any] = {"count": count}
        if hold:
            reply["held"] = held
        if on_long_only:
            reply["long"] = on_long_only
        if self.long is not None and self.long.loading:
            reply["loading"] = True
        return reply

    def _hold(self, client: Client, chunks: Any, hold_ms: float, slots: Any = None) -> int:
        """Hold the leading ``chunks`` (their index ``slots``, when known) for ``hold_ms`` as far
        as the client's pin budget allows (:mod:`infera.kvd.budget`); how many are held."""
        store = self.live_store
        now = store.clock()
        until = now + hold_ms / 1000.0
        budget = client.budget
        n = len(chunks) if budget.limit is None else budget.hold(chunks, until, now)
        if n < len(chunks):
            store.c["holds_refused_quota_total"] += len(chunks) - n
        if slots is not None:
            store.index.touch_many(slots[:n], until)
        else:
            for chunk in chunks[:n]:
                store.index.hold(chunk, until)
        return n

    def op_delete(self, client: Client, msg: dict[str, Any]) -> Reply:
        store = self.live_store
        ikeys = self.ikeys(client, self._keys(msg))
        n = store.delete(ikeys)
        if self.long is not None:
            n = max(n, self.long.delete(ikeys))
        return {"deleted": n}

    def op_prewarm(self, client: Client, msg: dict[str, Any]) -> Reply:
        keys = self._keys(msg)
        if self.long is None:
            raise BadRequest(
                "PREWARM needs a long tier: start the daemon with --long-path/--long-bytes", "unsupported"
            )
        queued = self.long.prewarm(self.ikeys(client, keys))
        return {"queued": queued, "read_gbps": self.long.read_rate()}

    def op_report(self, client: Client, msg: dict[str, Any]) -> Reply:
        clean = report_fields(msg.get("report"))
        if clean["fallback"] and not client.report.get("fallback"):
            log.warning(
                "%s fell back to %s: %s",
                client.label,
                clean.get("data_path", "?"),
                clean.get("fallback_reason", "no reason given"),
            )
        client.report = clean
        return None if msg.get("noreply") else {}

    def op_adopt(self, client: Client, msg: dict[str, Any]) -> Reply:
        """Chunk files the client wrote itself under the disk tier's path (GPU-direct): index
        them, so LOOKUP, capacity and eviction cover them. ``failed`` names chunks the client
        reserved with ``persisted`` but could not write: the daemon writes those through."""
        long = self.long
        if not isinstance(long, FileBackedTier):
            raise BadRequest("ADOPT needs the disk long tier (--long-path)", "unsupported")
        keys = self._keys(msg)
        lengths = self._ints(msg, "lengths")
        if len(lengths) != len(keys) or any(n < 0 for n in lengths):
            raise BadRequest("'keys' and 'lengths' must have the same length (lengths >= 0)")
        failed = self._keys(msg, "failed") if msg.get("failed") else []
        adopted = long.adopt(self.ikeys(client, keys), lengths)
        rewritten = long.write_through(self.ikeys(client, failed)) if failed else 0
        return None if msg.get("noreply") else {"adopted": adopted, "written_through": rewritten}

    def op_stats(self, client: Client, msg: dict[str, Any]) -> Reply:
        self.refresh_snapshot()
        return {"stats": self.snapshot_cache}


# Every op handler checks the request's id first: one wrapper per op of the protocol's table.
for _op in P.OPS:
    setattr(Ops, f"op_{_op.lower()}", id_checked(getattr(Ops, f"op_{_op.lower()}")))
