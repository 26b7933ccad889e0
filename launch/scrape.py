"""``kvd launch ... --prometheus``: the Prometheus scrape jobs of a deployment (one more file).

The daemon's job scrapes its ``--metrics-port`` on 127.0.0.1 (where it listens); the engines' job
scrapes each leg's API port (vLLM's ``/metrics``, 8000 unless ``--port`` says otherwise).
"""

from __future__ import annotations

from infera.errors import UsageError
from infera.launch.model import Deployment

FILE = "prometheus-kvd.yml"
VLLM_DEFAULT_PORT = "8000"


def scrape_config(dep: Deployment) -> str:
    from infera.launch.render import _env

    daemon = dep.daemons[0] if dep.daemons else None
    port = daemon.flag_value("--metrics-port") if daemon is not None else None
    if not port:
        raise UsageError(
            "--prometheus: the daemon serves no metrics",
            hint="add --metrics-port PORT (e.g. 9464) to the daemon's flags",
        )
    engines = [f"127.0.0.1:{leg.flag_value('--port') or VLLM_DEFAULT_PORT}" for leg in dep.legs]
    return _env().get_template("prometheus.yml.j2").render(kvd_port=port, engine_targets=engines)
