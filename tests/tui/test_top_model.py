"""Rates from counter deltas, restarts, client order and tolerant panels (no Textual app needed)."""

from __future__ import annotations

import io
import json
import unicodedata
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from infera.kvd.statctl import render_text, to_json
from infera.tui import clients as client_table
from infera.tui import panels
from infera.tui.model import SORT_ORDER, History, next_sort, sort_clients

RECORDED = json.loads((Path(__file__).parent / "data" / "stats.json").read_text())


def _stats(**counters: float) -> dict:
    base = {"pid": 10, "uptime_s": 1.0, "gets_total": 0, "sets_total": 0, "hits_total": 0, "misses_total": 0}
    return {**base, **counters}


def _plain(renderable: object, width: int = 160) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_first_reply_gives_no_rate() -> None:
    h = History(10)
    assert h.add(_stats(gets_total=5), 0.0) is None
    assert all(len(s) == 0 for s in h.series.values())


def test_rates_are_deltas_over_elapsed_time() -> None:
    h = History(10)
    h.add(_stats(gets_total=10, sets_total=4, bytes_out_total=0, hits_total=5, misses_total=5), 0.0)
    s = h.add(
        _stats(
            uptime_s=3.0, gets_total=30, sets_total=8, bytes_out_total=4096, hits_total=20, misses_total=10
        ),
        2.0,
    )
    assert s is not None
    assert s.rates["gets"] == 10.0
    assert s.rates["sets"] == 2.0
    assert s.rates["read"] == 2048.0
    assert s.recent_hit_ratio == 15 / 20
    assert list(h.series["gets"]) == [10.0]


def test_restart_starts_a_new_baseline_instead_of_a_negative_rate() -> None:
    h = History(10)
    h.add(_stats(gets_total=100), 0.0)
    h.add(_stats(gets_total=110, uptime_s=2.0), 1.0)
    assert h.add(_stats(pid=11, gets_total=3, uptime_s=0.5), 2.0) is None
    assert h.restarts == 1
    s = h.add(_stats(pid=11, gets_total=7, uptime_s=1.5), 3.0)
    assert s is not None and s.rates["gets"] == 4.0
    assert min(h.series["gets"]) >= 0


def test_restart_starts_the_sparklines_afresh() -> None:
    """What kvd top's help says: the sparklines (and peaks) restart with the daemon."""
    h = History(10)
    for i in range(4):
        h.add(_stats(gets_total=100 * i, uptime_s=float(i)), float(i))
    assert list(h.series["gets"]) == [100.0, 100.0, 100.0]
    h.add(_stats(pid=11, gets_total=3, uptime_s=0.5), 4.0)
    assert all(len(series) == 0 for series in h.series.values())
    h.add(_stats(pid=11, gets_total=5, uptime_s=1.5), 5.0)
    assert list(h.series["gets"]) == [2.0]


def test_counter_going_down_on_same_pid_counts_as_restart() -> None:
    h = History(10)
    h.add(_stats(sets_total=50, uptime_s=5), 0.0)
    assert h.add(_stats(sets_total=2, uptime_s=6), 1.0) is None
    assert h.restarts == 1


def test_history_keeps_only_the_window() -> None:
    h = History.for_window(interval=1.0, window_s=5)
    for i in range(20):
        h.add(_stats(gets_total=i * i, uptime_s=i), float(i))
    assert list(h.series["gets"]) == [float(2 * i - 1) for i in range(15, 20)]
    assert h.span_s(1.0) == 5.0


def test_sort_cycle_visits_every_order_and_wraps() -> None:
    seen = [SORT_ORDER[0]]
    for _ in SORT_ORDER:
        seen.append(next_sort(seen[-1]))
    assert seen[:-1] == list(SORT_ORDER) and seen[-1] == SORT_ORDER[0]


def test_data_path_sort_puts_fallbacks_first_and_requests_sort_descends() -> None:
    clients = RECORDED["clients"]
    first = sort_clients(clients, "data path")[0]
    assert first["fallback"] is True
    reqs = [c["requests"] for c in sort_clients(clients, "requests")]
    assert reqs == sorted(reqs, reverse=True)


def test_fill_bar_width_and_colour_thresholds() -> None:
    for frac in (0.0, 0.33, 0.5, 0.999, 1.0):
        assert len(panels.bar(frac, 20).plain) == 20
    assert panels.bar(0.97, 20).style == "red"
    assert panels.bar(0.5, 20).style == "green"
    assert panels.bar(0.85, 20).style == "yellow"
    assert set(panels.bar(None, 5).plain) == {"─"}


def test_panels_accept_an_empty_reply() -> None:
    for render in (panels.capacity_text, panels.health_table, panels.long_table, panels.warnings_text):
        assert _plain(render({}))
    assert client_table.client_rows({}, "pid") == []
    assert "n/a" in _plain(panels.cache_table({}, None))


def test_long_tier_with_only_backend_and_state_renders() -> None:
    text = _plain(panels.long_table({"tiers": {"long": {"backend": "lmcache", "state": "loading"}}}))
    assert "lmcache (L4)" in text and "loading" in text


def test_long_tier_extra_fields_are_shown_flattened() -> None:
    text = _plain(panels.long_table(RECORDED))
    assert "latency_ms.get_p99" in text and "4.1" in text
    assert "errors_total" in text and "endpoint" in text
    assert "put timed out" in text


def test_warnings_include_daemon_warnings_fallbacks_and_a_degraded_long_tier() -> None:
    lines = panels.warning_lines(RECORDED)
    assert lines[0] == RECORDED["warnings"][0]
    assert any("fell back to posix" in line and "/dev/kfd" in line for line in lines)
    assert any("mooncake is degraded" in line for line in lines)


def test_fallback_rows_are_flagged_and_say_why() -> None:
    rows = {key: (cells, flagged) for key, cells, flagged in client_table.client_rows(RECORDED, "pid")}
    fallback = next(c for c in RECORDED["clients"] if c["fallback"])
    cells, flagged = rows[str(fallback["id"])]
    assert flagged
    assert cells[6] == "posix (fallback)"
    assert cells[-1].startswith("GPU-direct unavailable")
    normal = next(c for c in RECORDED["clients"] if not c["fallback"])
    assert rows[str(normal["id"])][1] is False


PINNED = client_table.CLIENT_COLUMNS.index("pinned")
GIB = 1 << 30


def _client(**fields: object) -> dict:
    return {"id": 1, "pid": 7, "name": "eng", **fields}


def test_pinned_cell_shows_bytes_and_the_share_of_the_quota() -> None:
    cells = client_table.client_cells(
        _client(pinned_bytes=3 * GIB // 2, quota_bytes=4 * GIB, quota_refused=0)
    )
    assert cells[PINNED] == "1.5 GiB 38%"
    assert client_table.client_cells(_client(pinned_bytes=0, quota_bytes=GIB))[PINNED] == "0 B 0%"
    # leases are never refused, so a share past 100 % is shown as it is (a lease leak)
    assert client_table.pinned_cell(_client(pinned_bytes=3 * GIB, quota_bytes=2 * GIB)) == "3.0 GiB 150%"


def test_pinned_cell_without_a_quota_shows_only_bytes() -> None:
    # the daemon sends quota_bytes null under --client-quota 100; 0 or odd types read the same
    for quota in (None, 0, "x"):
        assert client_table.pinned_cell(_client(pinned_bytes=5 << 20, quota_bytes=quota)) == "5.0 MiB"
    assert client_table.pinned_cell(_client(pinned_bytes=5 << 20)) == "5.0 MiB"


def test_pinned_cell_is_a_dash_from_a_daemon_without_pin_budgets() -> None:
    assert client_table.client_cells(_client(requests=3, leases=1))[PINNED] == "-"
    assert PINNED in client_table.RIGHT_ALIGNED
    rows = {key: cells for key, cells, _flagged in client_table.client_rows(RECORDED, "pid")}
    assert rows["4"][PINNED] == "-"  # vllm-engine-2 in the recording has no pin fields
    assert rows["2"][PINNED] == "1.5 MiB 24%"


def test_refused_pin_quota_marks_the_cell_and_the_daemon_says_why() -> None:
    c = _client(pinned_bytes=GIB, quota_bytes=GIB, quota_refused=12)
    assert client_table.pinned_cell(c) == "1.0 GiB 100% !"
    calm = _client(pinned_bytes=GIB, quota_bytes=GIB, quota_refused=0)
    assert not client_table.pinned_cell(calm).endswith("!")
    # the why is the daemon's own warning (one place), shown once
    lines = panels.warning_lines(RECORDED)
    assert sum("pin quota" in line for line in lines) == 1
    assert any(line.startswith("client vllm-engine-1 (pid 4102) had 12 PUT keys") for line in lines)
    rows = {key: cells for key, cells, _flagged in client_table.client_rows(RECORDED, "pid")}
    assert rows["3"][PINNED].endswith(" !")


def test_pinned_sort_puts_the_largest_first_and_missing_fields_last() -> None:
    clients = [
        _client(id=1, pid=30, pinned_bytes=2 << 20),
        _client(id=2, pid=10),  # an older daemon: no field, sorts as 0
        _client(id=3, pid=20, pinned_bytes=9 << 20),
        _client(id=4, pid=5, pinned_bytes=0),
    ]
    assert [c["id"] for c in sort_clients(clients, "pinned")] == [3, 1, 4, 2]
    assert SORT_ORDER.index("pinned") == SORT_ORDER.index("requests") + 1
    assert [c["name"] for c in sort_clients(RECORDED["clients"], "pinned")][:2] == [
        "vllm-engine-1",
        "vllm-engine-0",
    ]


# what msgpack can carry: NaN and infinities, byte strings, map keys of any scalar type
JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=8) | st.integers() | st.binary(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
FIELDS = [
    "gets_total",
    "sets_total",
    "hits_total",
    "misses_total",
    "lookups_total",
    "lookup_keys_total",
    "lookup_hit_keys_total",
    "chunks",
    "arena_bytes_used",
    "arena_bytes_capacity",
    "evictions_total",
    "clients",
    "warnings",
    "tiers",
    "pid",
    "uptime_s",
    "version",
    "clients_connected",
    "clients_omitted",
    "long_backend",
    "bytes_in_total",
    "bytes_out_total",
]
LONG_FIELDS = sorted(
    panels.LONG_KNOWN
    | {"x", "path", "connected", "endpoint", "latency_ms", "errors", "reconcile_added", "files_other_version"}
)
CLIENT_FIELDS = [
    "pid",
    "name",
    "fallback",
    "fallback_reason",
    "data_path",
    "requests",
    "id",
    "pinned_bytes",
    "quota_bytes",
    "quota_refused",
    "counters",
    "kv_layout",
    "namespace",
    "role",
    "model",
    "connected_s",
]


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.sampled_from(FIELDS), JSONISH, max_size=8),
    st.dictionaries(st.sampled_from(LONG_FIELDS), JSONISH),
    st.lists(st.dictionaries(st.sampled_from(CLIENT_FIELDS), JSONISH) | JSONISH, max_size=3),
)
def test_panels_and_stat_never_raise_on_odd_replies(top: dict, long: dict, clients: list) -> None:
    """A newer, older or odd server may send fields of other types; the screen must still draw,
    ``kvd stat`` still print (its JSON still JSON), and no control character reach the terminal."""
    variants = [top, {**top, "tiers": {"long": long}}, {**top, "clients": clients}]
    for stats in variants:
        for all_fields in (False, True):
            text = render_text(stats, all_fields)
            assert all(_safe(line) for line in text.split("\n")), repr(text)
        json.loads(to_json(stats), parse_constant=_no_constant)
        for render in (panels.capacity_text, panels.health_table, panels.long_table, panels.warnings_text):
            _plain(render(stats))
        _plain(panels.cache_table(stats, None))
        _plain(panels.status_line(stats, "/s", connected=True))
        for sort in SORT_ORDER:
            client_table.client_rows(stats, sort)
        h = History(3)
        h.add(stats, 0.0)
        h.add(stats, 1.0)
        for sort in SORT_ORDER:
            for _key, cells, _hl in client_table.client_rows(stats, sort):
                assert all(_safe(c) for c in cells), cells


def _safe(text: str) -> bool:
    """No control character, line separator or bidirectional override (what a terminal acts on)."""
    return not any(
        unicodedata.category(ch) in ("Cc", "Zl", "Zp") or ch in "\u202a\u202b\u202d\u202e" for ch in text
    )


def _no_constant(name: str) -> None:
    raise AssertionError(f"kvd stat --json wrote {name}, which is not JSON")


def test_client_text_cannot_split_a_row_or_reach_the_terminal_raw() -> None:
    client = {
        "pid": 7,
        "name": "eng\nine\x1b[2J",
        "model": "m\u202e",
        "fallback": True,
        "fallback_reason": "a\rb",
    }
    cells = client_table.client_cells(client)
    assert cells[1] == "eng\\nine\\x1b[2J" and cells[4] == "m\\u202e" and cells[-1] == "a\\rb"
    warned = _plain(panels.warnings_text({"clients": [client], "warnings": ["w\x1b]0;title\x07"]}))
    assert "\x1b" not in warned and "\\x1b]0;title\\x07" in warned


def test_a_wrong_typed_long_tier_field_is_shown_as_absent() -> None:
    """It used to raise (ValueError: Unknown format code 'f' for a str) and the whole screen
    said DISCONNECTED; docs/top.md promises such a field is shown as absent."""
    long = {
        "backend": "disk",
        "state": "ready",
        "reconcile": "finished",
        "reconcile_s": "soon",
        "index_load_s": "x",
    }
    text = _plain(panels.long_table({"tiers": {"long": long}}))
    assert "reconcile" in text and "finished" in text and "soon" not in text
    assert "index load" not in text
