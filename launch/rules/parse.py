"""KVD000: a file ``kvd lint`` could not read as what it claims to be."""

from __future__ import annotations

from collections.abc import Iterator

from infera.launch.model import Deployment
from infera.launch.rules.registry import Context, Hit, Severity, rule


@rule(
    "KVD000",
    "parse-error",
    Severity.ERROR,
    "The file can be parsed (shell quoting, YAML, JSON, unit syntax).",
    "Fix the syntax error at the reported place; `bash -n FILE` or a YAML parser shows the same spot.",
)
def parse_error(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Reports a file that `kvd lint` could not parse: an unterminated quote in a shell script, invalid
    YAML or JSON, a spec file with the wrong shape.

    ## Why it matters
    A file that cannot be parsed cannot be checked, so every other rule is silent about it. In CI a
    silent pass on a broken file is worse than a failure: the error is reported so the run fails.

    ## Example
    ```sh
    python -m infera.engine.vllm --model m \\
      --kv-transfer-config '{"kv_connector":"InferaKvdConnector"
    ```

    Use instead:
    {{KVD_ENGINE_SH}}

    ## Fix
    Correct the syntax at the reported line. Force the file type with `--type` when `kvd lint` guessed
    it wrong (for example a YAML file without a `.yaml` suffix read from stdin).
    """
    return iter(())
