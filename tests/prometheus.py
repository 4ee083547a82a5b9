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


def scrape(temp_dir: Path) -> str:
    """Every target of the cluster's Prometheus service discovery file (in its `--temp-dir`),
    scraped once, joined."""
    groups = json.loads((temp_dir / DISCOVERY).read_text())
    targets = [t for group in groups for t in group["targets"]]
    return "\n".join(urllib.request.urlopen(f"http://{t}/metrics", timeout=10).read().decode()
                     for t in targets)


def scraped_once_exported(temp_dir: Path, names: set[str], timeout_s: float = 90) -> str:
    """The scrape once every metric of `names` is in it (Ray exports every few seconds); fails
    naming those still missing after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = scrape(temp_dir)
        missing = sorted(n for n in names if n not in text)
        if not missing:
            return text
        assert time.monotonic() < deadline, f"not in Prometheus's scrape after {timeout_s:.0f} s: {missing}"
        time.sleep(5)
