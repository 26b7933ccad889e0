"""What the daemon and the demo check before they start: environment-only settings, a --long-path
that is a file, demo sizes the host cannot hold, and a demo daemon that fails anyway. Each is one
``error:`` line (and its hint), the right exit status, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_daemon import refused_start
from typer.testing import CliRunner

from infera.cli import app
from infera.errors import UsageError
from infera.kvd import envvars
from infera.kvd.arena import check_fits_host
from infera.kvd.config import build_config
from infera.kvd.demo import demo_sizes, run_demo


def _serve(short_tmp: Path, *extra: str) -> list[str]:
    return ["--socket", str(short_tmp / "s.sock"), "--max-bytes", "8M", *extra]


def _disk(short_tmp: Path) -> list[str]:
    return ["--long-path", str(short_tmp / "long"), "--long-bytes", "8M"]


@pytest.mark.parametrize(
    ("name", "value", "takes"),
    [
        ("INFERA_KVD_DISK_WRITERS", "abc", "a whole number from 1 to 64"),
        ("INFERA_KVD_DISK_READERS", "0", "a whole number from 1 to 64"),
        ("INFERA_KVD_DISK_READERS", "2.5", "a whole number from 1 to 64"),
        ("INFERA_KVD_DISK_RETRY_S", "soon", "a number of seconds from 0.01 to 3600"),
        ("INFERA_KVD_DISK_RETRY_S", "nan", "a number of seconds from 0.01 to 3600"),
        ("INFERA_KVD_DISK_STOP_S", "inf", "a number of seconds from 0 to 3600"),
        ("INFERA_KVD_DISK_DIRECT", "yes", "a whole number from 0 to 1"),
    ],
)
def test_a_bad_disk_setting_in_the_environment_is_one_line_and_status_2(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str, takes: str
) -> None:
    monkeypatch.setenv(name, value)
    result = CliRunner().invoke(app, ["serve", *_serve(short_tmp, *_disk(short_tmp))])
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [
        f"error: {name}: {value!r} is not {takes}",
        f"hint: it sets {envvars.VARS[name].what}; unset it for the default",
    ]
    assert not (short_tmp / "long").exists()  # refused before anything was made


def test_the_real_command_refuses_before_it_starts(short_tmp: Path) -> None:
    env = {**os.environ, "INFERA_KVD_DISK_WRITERS": "abc"}
    out = subprocess.run(
        [sys.executable, "-m", "infera.kvd", *_serve(short_tmp, *_disk(short_tmp))],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("error: INFERA_KVD_DISK_WRITERS: 'abc' is not a whole number from 1 to 64")
    assert "Traceback" not in out.stderr


def test_a_disk_setting_is_not_read_without_the_disk_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERA_KVD_DISK_WRITERS", "abc")  # as a stray flag of another backend
    build_config(socket="/tmp/x.sock", max_bytes="8M")  # no error: RAM only never reads it
    with pytest.raises(UsageError, match="INFERA_KVD_DISK_WRITERS"):
        build_config(socket="/tmp/x.sock", max_bytes="8M", long_path="/tmp/x-long", long_bytes="8M")


def test_good_values_are_read_and_unset_ones_are_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERA_KVD_DISK_WRITERS", " 8 ")
    monkeypatch.setenv("INFERA_KVD_DISK_RETRY_S", "0.5")
    monkeypatch.setenv("INFERA_KVD_DISK_READERS", "")
    assert envvars.get("INFERA_KVD_DISK_WRITERS", 2) == 8
    assert envvars.get("INFERA_KVD_DISK_RETRY_S", 1.0) == 0.5
    assert envvars.get("INFERA_KVD_DISK_READERS", 4) == 4
    assert envvars.get("INFERA_KVD_DISK_STOP_S", 10.0) == 10.0


def test_every_infera_kvd_variable_the_daemon_reads_is_in_the_table() -> None:
    """No other read of an INFERA_KVD_ variable under infera/kvd: flags have theirs (the flag
    table), the client its socket and trusted uids (their own errors), the rest go through here."""
    import re

    kvd = Path(__file__).resolve().parents[2] / "infera" / "kvd"
    allowed = {"INFERA_KVD_SOCKET", "INFERA_KVD_TRUST_UID", "INFERA_KVD_SPIN_US"}
    direct = set()
    for path in kvd.rglob("*.py"):
        for m in re.finditer(r"environ\.get\(\s*\"(INFERA_KVD_\w+)\"", path.read_text()):
            direct.add(m.group(1))
    assert direct <= allowed, sorted(direct - allowed)


# -- --long-path -----------------------------------------------------------------------------------
def test_a_long_path_that_is_a_file_is_a_usage_error(short_tmp: Path) -> None:
    afile = short_tmp / "passwd"
    afile.write_text("root:x:0:0\n")
    text = refused_start([*_serve(short_tmp), "--long-path", str(afile), "--long-bytes", "8M"])
    assert f"error: --long-path {afile} is a regular file, not a directory" in text
    result = CliRunner().invoke(
        app, ["serve", *_serve(short_tmp), "--long-path", str(afile / "sub"), "--long-bytes", "8M"]
    )
    assert result.exit_code == 2, result.output
    assert result.output.startswith(
        f"error: --long-path {afile / 'sub'}: {afile} is a regular file, not a directory"
    )


# -- kvd demo --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--chunks", "0"], "error: --chunks: 0 is not a positive number of chunks"),
        (["--chunks", "-1"], "error: --chunks: -1 is not a positive number of chunks"),
        (["--chunk-size", "0"], "error: --chunk-size: '0' is not a positive size"),
        (["--chunks", "100", "--chunk-size", "100T"], "error: --chunks 100 of --chunk-size 100T need a"),
    ],
)
def test_demo_sizes_are_usage_errors(args: list[str], says: str) -> None:
    result = CliRunner().invoke(app, ["demo", *args])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(says), result.output
    assert "Traceback" not in result.output and "starting a kvd daemon" not in result.output


def test_demo_checks_its_arena_with_the_daemons_own_check(short_tmp: Path) -> None:
    meminfo = short_tmp / "meminfo"
    meminfo.write_text("MemTotal:        1048576 kB\n")  # a 1 GiB host

    def fits(n: int) -> None:
        check_fits_host(n, str(meminfo))

    assert demo_sizes(64, "1M", fits)[1] == 129 << 20  # twice 64 chunks and their headers
    with pytest.raises(UsageError, match=r"need a 2.0 GiB arena .*more than this host's memory \(1.0 GiB\)"):
        demo_sizes(1000, "1M", fits)


def test_a_demo_daemon_that_fails_says_why_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The daemon's own error, read from its log before the demo removes it, not a path to a
    log that is gone."""
    monkeypatch.setenv("INFERA_KVD_DISK_WRITERS", "abc")  # the demo's daemon inherits it and refuses
    with pytest.raises(Exception) as caught:
        run_demo(2, "4K")
    err = caught.value
    assert type(err).__name__ == "KvdError"
    assert str(err) == (
        "the demo daemon exited with status 2: INFERA_KVD_DISK_WRITERS: 'abc' is not a whole number from 1 to 64"
    )
    assert getattr(err, "hint", "").startswith("it sets the disk tier's writer threads")
    assert "daemon.log" not in str(err) and "\n" not in str(err)
    assert "daemon stopped and temporary files removed" in capsys.readouterr().out
