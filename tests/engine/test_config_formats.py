"""Environment parsing, retention classes and the per-layer KV format verdicts."""

from __future__ import annotations

import io
import logging
import tracemalloc
from pathlib import Path

import pytest

from infera.engine.vllm import config, formats, retention
from infera.engine.vllm.config import parse_chunk_tokens, parse_roots, read_env
from infera.engine.vllm.retention import retention_of
from infera.errors import UsageError

REPO = Path(__file__).resolve().parents[2]


def test_read_env_defaults() -> None:
    env = read_env({})
    assert env.socket is None
    assert env.chunk_tokens is None
    assert env.ais == "0"
    assert not env.gpu_direct_requested


def test_read_env_values() -> None:
    env = read_env(
        {
            "INFERA_KVD_SOCKET": "/run/kvd.sock",
            "INFERA_KVD_CHUNK_TOKENS": "512",
            "INFERA_KVD_AIS": "auto",
            "INFERA_KVD_HIPFILE_ROOTS": "long=/nvme/kvd-long, scratch=/nvme2/x",
        }
    )
    assert env.socket == "/run/kvd.sock"
    assert env.chunk_tokens == 512
    assert env.hipfile_roots == {"long": "/nvme/kvd-long", "scratch": "/nvme2/x"}
    assert env.gpu_direct_requested
    assert not read_env({"INFERA_KVD_AIS": "auto"}).gpu_direct_requested
    assert read_env({"INFERA_KVD_AIS": "1"}).gpu_direct_requested


@pytest.mark.parametrize("text", ["abc", "0", "-5", "1.5"])
def test_bad_chunk_tokens_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError):
        parse_chunk_tokens(text)


def test_auto_chunk_tokens() -> None:
    assert parse_chunk_tokens("auto") is None
    assert parse_chunk_tokens(" AUTO ") is None


def test_bad_roots_and_ais() -> None:
    with pytest.raises(UsageError):
        parse_roots("/nvme/kvd-long")
    with pytest.raises(UsageError):
        read_env({"INFERA_KVD_AIS": "yes"})
    with pytest.raises(UsageError, match="names the root 'long' twice"):
        parse_roots("long=/nvme/a, long=/nvme/b")


class _Recording(dict[str, str]):
    """An environment that records which variables were asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        self.asked.append(key)
        return super().get(key, default)


def test_read_env_reads_exactly_the_variables_of_the_table() -> None:
    env = _Recording()
    read_env(env)
    assert sorted(env.asked) == sorted(v.name for v in config.VARIABLES)
    assert all(v.name.startswith("INFERA_KVD_") for v in config.VARIABLES)


def test_docs_engine_md_lists_every_variable_as_the_table_says() -> None:
    """docs/engine.md's table is config.docs_table(): a variable added (or changed) there without
    the page fails here, with the rows to paste."""
    text = (REPO / "docs" / "engine.md").read_text()
    table = config.docs_table()
    assert table in text, f"docs/engine.md's variable table is stale; it must read:\n{table}"
    rows = [ln for ln in text.splitlines() if ln.startswith("| `INFERA_KVD_")]
    assert rows == table.splitlines()[2:]


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("INFERA_KVD_REPORT_EVERY_S", "abc", "is not a number of seconds"),
        ("INFERA_KVD_REPORT_EVERY_S", "-1", "0 or more"),
        ("INFERA_KVD_REPORT_EVERY_S", "nan", "finite"),
        ("INFERA_KVD_REPORT_EVERY_S", "inf", "finite"),
        ("INFERA_KVD_SPIN_US", "abc", "is not a whole number of microseconds"),
        ("INFERA_KVD_SPIN_US", "-5", "between 0 and 100000"),
        ("INFERA_KVD_SPIN_US", "200000", "between 0 and 100000"),
        ("INFERA_KVD_LOAD_RATES", "ram=1,ram=2", "ram is set twice"),
        ("INFERA_KVD_HIPFILE_ROOTS", "long=/a,long=/b", "twice"),
    ],
)
def test_bad_values_are_refused_naming_the_variable(name: str, text: str, words: str) -> None:
    with pytest.raises(UsageError, match=name) as err:
        read_env({name: text})
    assert words in err.value.message
    assert "\n" not in err.value.message
    assert isinstance(config.check_value(name, text), UsageError)


def test_report_interval_and_spin() -> None:
    assert read_env({}).report_every_s == 5.0 and read_env({}).spin_us == 0
    env = read_env({"INFERA_KVD_REPORT_EVERY_S": "0", "INFERA_KVD_SPIN_US": " 50 "})
    assert env.report_every_s == 0.0 and env.spin_us == 50
    assert read_env({"INFERA_KVD_REPORT_EVERY_S": "0.5"}).report_every_s == 0.5


def test_extra_config_notice_names_each_key_and_its_variable() -> None:
    assert config.extra_config_notice({}) is None and config.extra_config_notice(None) is None
    text = config.extra_config_notice({"chunk_tokens": "abc", "socket": 5, "foo": 1})
    assert text is not None
    assert "ignored: chunk_tokens (use INFERA_KVD_CHUNK_TOKENS), foo, socket (use INFERA_KVD_SOCKET)" in text


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (None, "long"),
        ({}, "long"),
        ({"infera_retention": "none"}, "none"),
        ({"infera_retention": "SHORT"}, "short"),
        ({"infera_retention": "long"}, "long"),
        ({"infera_retention": "ephemeral"}, "long"),
        ({"other": 1}, "long"),
    ],
)
def test_retention_of(params: object, expected: str) -> None:
    assert retention_of(params) == expected


def test_unknown_retention_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="infera.engine.vllm"):
        assert retention_of({"infera_retention": "forever-xyz"}) == "long"
        assert retention_of({"infera_retention": "forever-xyz"}) == "long"
    assert sum("forever-xyz" in r.getMessage() for r in caplog.records) == 1


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A warn-once memory of its own (the module keeps one per process)."""
    monkeypatch.setattr(retention, "_unknown_retentions", retention._WarnOnce())


def test_unknown_retentions_cost_bounded_memory_and_log(fresh_warnings: None) -> None:
    """Any HTTP client picks kv_transfer_params: 10,000 distinct 1 MB values may not grow the
    engine's memory or its log (they were all kept, and logged in full)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger = logging.getLogger("infera.engine.vllm")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.WARNING)
    body = "x" * (1 << 20)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(10_000):
            value = f"{i:06d}" + body  # distinct from the first character on
            assert retention_of({"infera_retention": value}) == "long"
            del value
            grown = tracemalloc.get_traced_memory()[0] - base
            assert grown < 256 << 10, f"{grown} bytes kept after {i + 1} values"
            assert out.tell() < 8 << 10, f"{out.tell()} bytes logged after {i + 1} values"
    finally:
        tracemalloc.stop()
        logger.removeHandler(handler)
        logger.setLevel(level)
    lines = out.getvalue().splitlines()
    assert len(retention._unknown_retentions.seen) <= 32
    assert len(lines) == 33, "one line per remembered value, then one saying the rest go unlogged"
    assert "'000000xxxxxxxx" in lines[0] and f"({len(body) + 6} characters)" in lines[0]
    assert all(len(line) < 300 for line in lines)
    assert "not logging any more" in lines[-1]
    assert retention_of({"infera_retention": "SHORT"}) == "short", "known values still work"


@pytest.mark.parametrize("value", [5, 1.5, True, ["long"], {"x": "y" * 100_000}])
def test_non_string_retention_is_the_default_with_a_short_warning(
    fresh_warnings: None, value: object, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="infera.engine.vllm"):
        assert retention_of({"infera_retention": value}) == "long"
        assert retention_of({"infera_retention": value}) == "long"
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1
    assert f"is a {type(value).__name__}, not one of the strings" in messages[0]
    assert len(messages[0]) < 200


@pytest.mark.parametrize(
    ("kw", "offload", "kind"),
    [
        ({"cache_dtype": "auto", "token_bytes": 128}, True, "paged"),
        ({"cache_dtype": "fp8", "token_bytes": 64}, True, "paged"),
        ({"cache_dtype": "fp8_per_token_head", "token_bytes": 72}, False, "packed"),
        ({"cache_dtype": "auto", "quant_mode": "NVFP4"}, False, "packed"),
        ({"cache_dtype": "auto", "use_mla": True, "token_bytes": 1152, "head_size": 576}, True, "mla"),
        ({"cache_dtype": "fp8", "use_mla": True, "token_bytes": 576, "head_size": 576}, True, "mla"),
        (
            {"cache_dtype": "fp8_ds_mla", "use_mla": True, "token_bytes": 656, "head_size": 576},
            False,
            "packed",
        ),
        ({"cache_dtype": "fp8", "use_mla": True, "token_bytes": 584, "head_size": 584}, False, "packed"),
        ({"cache_dtype": "fp8", "use_mla": True, "token_bytes": 132, "indexer": True}, True, "dsa-indexer"),
        ({"cache_dtype": "weird_dtype", "token_bytes": 64}, False, "unknown"),
    ],
)
def test_classify(kw: dict[str, object], offload: bool, kind: str) -> None:
    args: dict[str, object] = {"use_mla": False, **kw}
    fmt = formats.classify("model.layers.3.self_attn.attn", attention=True, **args)  # type: ignore[arg-type]
    assert (fmt.offload, fmt.kind) == (offload, kind)


def test_classify_indexer_by_name_and_state_layers() -> None:
    fmt = formats.classify(
        "model.layers.0.self_attn.indexer.k_cache", attention=True, use_mla=True, cache_dtype="fp8"
    )
    assert fmt.offload and fmt.kind == "dsa-indexer"
    state = formats.classify("model.layers.0.mamba", attention=False, use_mla=False, cache_dtype="auto")
    assert not state.offload


def test_skip_message_names_the_layer() -> None:
    fmt = formats.classify(
        "model.layers.7.self_attn.attn",
        attention=True,
        use_mla=True,
        cache_dtype="fp8_ds_mla",
        token_bytes=656,
    )
    msg = formats.skip_message(fmt)
    assert msg.startswith("register_kv_caches: ")
    assert "model.layers.7.self_attn.attn" in msg
    assert msg.endswith("SKIPS it")
