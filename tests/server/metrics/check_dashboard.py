#!/usr/bin/python3
"""Checks the Grafana dashboard: valid JSON, every panel on the templated Prometheus data
source, every attnserve_ metric it names is one metrics.h documents, and every query parses
as PromQL (each is wrapped in a recording rule and given to `promtool check rules`).

Usage: check_dashboard.py DASHBOARD.json [METRICS_H]
Exit: 0 ok, 1 a check failed, 77 (ctest's SKIP_RETURN_CODE) when the JSON checks passed but
promtool is not installed, so the PromQL could not be checked.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def main():
    dashboard_path = sys.argv[1]
    header = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "../../../server/metrics/metrics.h")
    with open(dashboard_path) as f:
        try:
            dashboard = json.load(f)
        except json.JSONDecodeError as e:
            fail(f"{dashboard_path} is not valid JSON: {e}")

    # The family table of metrics.h: comment lines "//   attnserve_name   type ...".
    with open(header) as f:
        families = set(re.findall(r"^//\s+(attnserve_[a-z_]+)\s+(?:histogram|counter|gauge)",
                                  f.read(), re.M))
    if not families:
        fail(f"no family table found in {header}")

    variables = {v["name"] for v in dashboard.get("templating", {}).get("list", [])}
    if "DS_PROMETHEUS" not in variables:
        fail("no DS_PROMETHEUS data source variable")

    exprs = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        if panel.get("datasource", {}).get("uid") != "${DS_PROMETHEUS}":
            fail(f"panel {panel['title']!r} does not use ${{DS_PROMETHEUS}}")
        if not panel.get("targets"):
            fail(f"panel {panel['title']!r} has no queries")
        for target in panel["targets"]:
            exprs.append((panel["title"], target["expr"]))
    ids = [p["id"] for p in dashboard["panels"]]
    if len(ids) != len(set(ids)):
        fail("panel ids are not unique")

    for title, expr in exprs:
        for name in re.findall(r"\battnserve_[a-z_]+", expr):
            family = re.sub(r"_(bucket|sum|count)$", "", name)
            if name not in families and family not in families:
                fail(f"panel {title!r} uses {name}, which metrics.h does not document")

    promtool = shutil.which("promtool")
    if promtool is None:
        print("SKIP: JSON checks passed; promtool not found (Debian package 'prometheus'), "
              "so the PromQL was not parsed")
        sys.exit(77)
    # Grafana's variables, replaced by values of the same kind, so that promtool can parse.
    substitutions = {"$__rate_interval": "1m", "$__interval": "1m", "$job": ".*",
                     "$instance": ".*"}
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as rules:
        rules.write("groups:\n  - name: dashboard\n    rules:\n")
        for i, (title, expr) in enumerate(exprs):
            for key, value in substitutions.items():
                expr = expr.replace(key, value)
            if "$" in expr:
                fail(f"panel {title!r} uses an unknown variable: {expr}")
            rules.write(f"      - record: dashboard:expr_{i}\n        expr: {json.dumps(expr)}\n")
    try:
        result = subprocess.run([promtool, "check", "rules", rules.name],
                                capture_output=True, text=True)
    finally:
        os.unlink(rules.name)
    if result.returncode != 0:
        fail("promtool rejected a dashboard query:\n" + result.stdout + result.stderr)
    print(f"OK: {len(exprs)} queries in {len(dashboard['panels'])} panels")


if __name__ == "__main__":
    main()
