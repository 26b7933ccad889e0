"""KVD6xx: containers."""

from __future__ import annotations

import os
from collections.abc import Iterator

from infera.launch.model import Deployment
from infera.launch.rules.registry import Context, Hit, Severity, rule


@rule(
    "KVD601",
    "boot-mounted-in-container",
    Severity.WARNING,
    "/boot is not mounted into a container.",
    "Remove the /boot mount and run ais-check (and `kvd doctor`) on the host instead.",
)
def boot_mount(dep: Deployment, ctx: Context) -> Iterator[Hit]:
    """
    ## What it does
    Finds `/boot` (or a directory under it) mounted from the host into a container: a Kubernetes
    `hostPath` volume, a compose `volumes:` entry, or `docker run -v /boot:...` in a script.

    ## Why it matters
    People mount `/boot` so that `ais-check` inside the container stops complaining. In a container
    there is no `dkms`, so `ais-check` falls back from the driver's own capability report to grepping
    the kernel config files under `/boot`. Mounting them feeds that weak fallback and produces a
    confident "P2PDMA: True" on hosts whose driver says False. The engine does not need `/boot`.

    ## Example
    ```yaml
    volumes:
      - name: boot
        hostPath: {path: /boot}
    ```

    Use instead: no `/boot` volume; check GPU-direct readiness on the host with
    `/opt/rocm/bin/ais-check` (its `amdgpu` line) and `kvd doctor`.

    ## Fix
    Delete the mount. Trust the `amdgpu` line of `ais-check` run on the host and the `AIS: registered`
    lines of `dmesg`.
    """
    for m in dep.mounts:
        path = os.path.normpath(m.host_path) if m.host_path else ""
        if path == "/boot" or path.startswith("/boot/"):
            yield Hit(
                f"{m.owner} mounts the host's {m.host_path} at {m.target}: it only feeds ais-check's weak "
                "fallback and makes it report P2PDMA support the driver does not have",
                m.loc,
            )
