"""What Prometheus would scrape from a Ray cluster, and the series the shipped Grafana dashboard
plots: the Serve tests check the one against the other by metric name."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parents[1] / "serve_apps" / "grafana_dashboard.json"
DISCOVERY = "prom_metrics_service_discovery.json"
"""Ray's file-based service discovery for Prometheus, in the head's temp dir: every node's
metrics endpoint, which a Prometheus scrape config points at."""
COUNTED_ON_EVENTS = {"ray_peftbd_session_resumes", "ray_peftbd_accepted_per_position"}
"""Dashboard series that appear only once such an event happened (a state rebuilt, a draft
token accepted: untrained drafters rarely do)."""


def dashboard_metrics() -> set[str]:
    """The `ray_peftbd_*` metric names grafana_dashboard.json plots (suffixes stripped)."""
    return set(re.findall(r"ray_peftbd_\w+?(?=_bucket|_sum|_count|_total|\{|\[)",
                          DASHBOARD.read_text()))


def scrape(temp_dir: Path) -> tuple[str, list[str]]:
    """Every target of the cluster's Prometheus service discovery file (in its `--temp-dir`),
    scraped once: the reachable ones' text joined, and the targets that were down (as Prometheus,
    which marks a target down and scrapes the rest: Ray lists endpoints, such as a component's
    on the machine's address, that a loopback-only cluster does not serve)."""
    groups = json.loads((temp_dir / DISCOVERY).read_text())
    texts, down = [], []
    for target in (t for group in groups for t in group["targets"]):
        try:
            texts.append(urllib.request.urlopen(f"http://{target}/metrics", timeout=10).read().decode())
        except OSError as exc:  # URLError, a refused or reset connection, a timeout
            down.append(f"{target} ({exc})")
    return "\n".join(texts), down


def scraped_once_exported(temp_dir: Path, names: set[str], timeout_s: float = 90) -> str:
    """The scrape once every metric of `names` is in it (Ray exports every few seconds); fails
    naming those still missing, and the targets that were down, after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        text, down = scrape(temp_dir)
        missing = sorted(n for n in names if n not in text)
        if not missing:
            return text
        assert time.monotonic() < deadline, (f"not in Prometheus's scrape after {timeout_s:.0f} s: "
                                             f"{missing}; targets down: {down or 'none'}")
        time.sleep(5)
