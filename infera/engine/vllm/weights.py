"""A fingerprint of the model weights an engine loads, for the namespace (docs/namespace.md).

vLLM's block hashes cover the tokens (and ``cache_salt``, LoRA, multimodal inputs), never the
weights: an RL loop or a hot fix that swaps the weights under the same model path would go on
finding the KV the old weights computed. So the namespace carries this fingerprint, and new
weights start a new namespace.

What goes in:

* a local model directory (or single weight file): the name, size and modification time (ns) of
  every weight file at its top level (``*.safetensors``, ``*.bin``, ``*.pt``, ``*.pth``,
  ``*.gguf``, ...), the BLAKE2b of every ``*.index.json`` (the safetensors/bin index) and of
  ``config.json``;
* a Hugging Face hub id: the commit that ``revision`` (default ``main``) resolves to in the local
  hub cache, and the same file facts for that snapshot; without a cached snapshot, the id and
  revision as given;
* ``model_weights`` (vLLM's remote weights location, e.g. ``s3://``) and the revision as given;
* ``load_format=dummy``: only that (the weights are generated, never read from files).

Only ``stat`` and two small reads: nothing reads the weights themselves. A copy that changes
modification times (``cp`` without ``-p``) gives a new fingerprint: a miss, never a wrong hit.
Weights swapped inside a running engine (``collective_rpc("reload_weights")``, RL weight sync)
do not go through these files and are not seen; restart the engine (or change the model path).

Plain Python: no vLLM, no torch, no network.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack", ".npz")
INDEX_SUFFIX = ".index.json"
CONFIG = "config.json"
SMALL_READ = 16 << 20  # an index or config larger than this is fingerprinted by its stat only
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class WeightsInfo:
    """The fingerprint (16 hex digits) and what it was computed from."""

    fingerprint: str
    source: str  # "dir", "file", "hub-cache", "hub", "dummy"
    revision: str | None = None
    files: tuple[tuple[str, int, int], ...] = ()
    digests: dict[str, str] = field(default_factory=dict)
    location: str | None = None

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size, _ in self.files)

    def describe(self) -> str:
        where = f" at {self.location}" if self.location else ""
        rev = f", revision {self.revision}" if self.revision else ""
        if self.source == "dummy":
            return "dummy weights (load_format=dummy)"
        if self.source == "hub":
            return f"hub model{rev} (no local snapshot: id and revision only)"
        return f"{len(self.files)} weight files, {self.total_bytes} bytes{rev}{where}"


def hub_cache_dir(environ: dict[str, str] | None = None) -> str:
    """The Hugging Face hub cache, as ``huggingface_hub`` finds it (without importing it)."""
    env = os.environ if environ is None else environ
    if env.get("HF_HUB_CACHE"):
        return env["HF_HUB_CACHE"]
    if env.get("HUGGINGFACE_HUB_CACHE"):
        return env["HUGGINGFACE_HUB_CACHE"]
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"
    )
    return os.path.join(home, "hub")


def hub_snapshot(repo_id: str, revision: str | None, cache: str) -> tuple[str, str] | None:
    """(commit, snapshot directory) of ``repo_id`` at ``revision`` in the local hub cache, or None."""
    repo = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    rev = revision or "main"
    commit = rev if _COMMIT.fullmatch(rev) else None
    if commit is None:
        try:
            with open(os.path.join(repo, "refs", rev)) as fh:
                commit = fh.read().strip()
        except OSError:
            return None
    snap = os.path.join(repo, "snapshots", commit)
    return (commit, snap) if os.path.isdir(snap) else None


def _digest_file(path: str, size: int) -> str | None:
    if size > SMALL_READ:
        return None
    try:
        with open(path, "rb") as fh:
            return hashlib.blake2b(fh.read(), digest_size=16).hexdigest()
    except OSError:
        return None


def _scan(directory: str) -> tuple[list[tuple[str, int, int]], dict[str, str]]:
    """Weight files (name, size, mtime ns) and digests of the index and config files."""
    files: list[tuple[str, int, int]] = []
    digests: dict[str, str] = {}
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return files, digests
    for name in names:
        path = os.path.join(directory, name)
        try:
            st = os.stat(path)  # hub snapshots are links to blobs: their size and time count
        except OSError:
            continue
        if not os.path.isfile(path):
            continue
        if name.endswith(INDEX_SUFFIX) or name == CONFIG:
            d = _digest_file(path, st.st_size)
            digests[name] = d if d is not None else f"stat:{st.st_size}:{st.st_mtime_ns}"
        elif name.endswith(WEIGHT_SUFFIXES):
            files.append((name, st.st_size, st.st_mtime_ns))
    return files, digests


def weights_info(
    model: str,
    *,
    revision: str | None = None,
    model_weights: str | None = None,
    load_format: str | None = None,
    environ: dict[str, str] | None = None,
) -> WeightsInfo:
    """The fingerprint of what ``model`` (a directory, a file or a hub id) loads; see the module doc."""
    fmt = str(load_format or "auto").lower()
    facts: dict[str, Any] = {"revision": revision, "model_weights": model_weights or None}
    if fmt == "dummy":
        facts["source"] = "dummy"
        return _make(facts, "dummy", revision)
    files: list[tuple[str, int, int]] = []
    digests: dict[str, str] = {}
    location: str | None = None
    if os.path.isdir(model):
        source, location = "dir", os.path.abspath(model)
        files, digests = _scan(location)
    elif os.path.isfile(model):
        source, location = "file", os.path.abspath(model)
        st = os.stat(location)
        files = [(os.path.basename(location), st.st_size, st.st_mtime_ns)]
    else:
        snap = hub_snapshot(model, revision, hub_cache_dir(environ))
        if snap is not None:
            source, location = "hub-cache", snap[1]
            facts["revision"] = snap[0]  # the commit: `main` and its commit name the same weights
            files, digests = _scan(location)
        else:
            source = "hub"
            facts["model"] = model
    facts.update(source=source, files=files, digests=digests)
    return _make(facts, source, facts["revision"], tuple(files), digests, location)


def _make(
    facts: dict[str, Any],
    source: str,
    revision: str | None,
    files: tuple[tuple[str, int, int], ...] = (),
    digests: dict[str, str] | None = None,
    location: str | None = None,
) -> WeightsInfo:
    blob = json.dumps(facts, sort_keys=True, separators=(",", ":"), default=str).encode()
    fp = hashlib.blake2b(blob, digest_size=8).hexdigest()
    return WeightsInfo(fp, source, revision, files, dict(digests or {}), location)


__all__ = ["WeightsInfo", "hub_cache_dir", "hub_snapshot", "weights_info"]
