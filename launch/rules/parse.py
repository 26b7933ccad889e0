"""KVD000: a file ``kvd lint`` could not read as what it claims to be."""

from __future__ import annotations

from collections.abc import Iterator

from infera.launch.model import Deployment
from infera.launch.rules.registry import Context, Hit, Severity, rule


@rule(
    "KVD000",
    "parse-error",
    Severity.ERROR,
    "The file can be parsed (shell quoting, YAML, JSON, unit syntax) and is a non-empty text file.",
    "Fix the syntax error at the reported place; `bash -n FILE`, a YAML parser or `systemd-analyze verify FILE` "
    "shows the same spot.",
)
def parse_error(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Reports a file that `kvd lint` could not read as what it claims to be:

    * a file that is not text (bytes that are not UTF-8, or a NUL byte) or is empty: nothing in it
      can be checked;
    * a shell script with an unterminated quote, `$(`, backquote or here-document;
    * YAML or JSON that does not parse, and a spec file with the wrong shape;
    * a systemd unit that systemd would not read as written. **Errors:** a section header without its
      `]` (systemd refuses the whole file), a line without `=` or without a key before it, a section
      systemd does not know (it drops the section with every key in it; sections of your own start
      with `X-`), and a `.service` file with no `ExecStart=` (systemd refuses to start it).
      **Warnings:** a key before the first section, and a key in `[Unit]`, `[Service]` or `[Install]`
      that is certainly wrong: in the wrong case, not a CamelCase name, or a letter or two away from a
      known key (`ExecStrat=`). systemd skips those lines and starts the rest.

    systemd has hundreds of keys and adds some in every release, so a key `kvd lint` does not know is
    left alone unless it looks like a misspelling of one it knows.

    ## Why it matters
    A file that cannot be parsed cannot be checked, so every other rule is silent about it. In CI a
    silent pass on a broken file is worse than a failure: the error is reported so the run fails.
    systemd is quiet in the same way: it logs a line it skips and starts the unit without it, so a
    misspelt `ExecStart=` shows up only as a service that will not start.

    ## Example
    ```sh
    python -m infera.engine.vllm --model m \\
      --kv-transfer-config '{"kv_connector":"InferaKvdConnector"
    ```

    Use instead:
    {{KVD_ENGINE_SH}}

    ```ini
    [Servce]
    ExecStrat=/usr/bin/python3 -m infera.kvd --socket /run/infera-kvd.sock
    ```

    Use instead:
    ```ini
    [Service]
    ExecStart=/usr/bin/python3 -m infera.kvd --socket /run/infera-kvd.sock
    ```

    ## Fix
    Correct the syntax at the reported line. Force the file type with `--type` when `kvd lint` guessed
    it wrong (for example a YAML file without a `.yaml` suffix read from stdin). A file that is not
    text or is empty is usually the wrong path, or the output of a step that failed
    (`kubectl kustomize ... | kvd lint -`).
    """
    return iter(())
