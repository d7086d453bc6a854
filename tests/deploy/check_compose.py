"""Checks deploy/docker-compose.yml (and the GPU override), the Grafana provisioning, and the
Dockerfile against each other and against deploy/prometheus, offline (no engine, no images):

- `docker compose config` / `docker-compose config` accepts both files, when either is installed;
- the services, the bench profile, the build targets (stages of the Dockerfile);
- every bind-mounted file exists; Prometheus scrapes the attnserve service on its metrics port
  and finds its rule file; Grafana's data source is the Prometheus service and its dashboard
  provider reads the folder the dashboard is mounted into;
- the healthcheck is the Dockerfile's; the stop grace period outlasts the server's drain;
- the Dockerfile: stages cpu (default, last) and gpu on the right bases, runtime stages with no
  toolchain, non-root, both ports exposed, a HEALTHCHECK; .dockerignore keeps build trees out.

usage: check_compose.py REPO_ROOT      exit 0 passed, 1 failed
"""
import json
import os
import re
import shutil
import subprocess
import sys

import yaml

failures = []


def check(ok, message):
    if not ok:
        failures.append(message)
    return ok


def seconds(text):
    m = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", str(text))
    return int(m.group(1) or 0) * 60 + int(m.group(2) or 0)


def dockerfile_stages(path):
    """{stage name: (FROM image, [instruction lines])} in order; the last one is the default."""
    stages, current = {}, None
    text = re.sub(r"\\\n", " ", open(path).read())
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.I)
        if m:
            current = m.group(2) or f"stage{len(stages)}"
            stages[current] = (m.group(1), [])
        elif current:
            stages[current][1].append(line)
    return stages


def check_dockerfile(root):
    stages = dockerfile_stages(os.path.join(root, "Dockerfile"))
    names = list(stages)
    check(names and names[-1] == "cpu", f"Dockerfile: the default (last) stage is {names[-1:]}, not cpu")
    text = open(os.path.join(root, "Dockerfile")).read()
    check("ARG BASE_IMAGE=debian:bookworm-slim" in text, "Dockerfile: BASE_IMAGE default is not debian:bookworm-slim")
    check(re.search(r"^FROM nvidia/cuda:\$\{CUDA_VERSION\}-runtime-ubuntu", text, re.M) is not None,
          "Dockerfile: the gpu stage is not on an nvidia/cuda runtime image")
    check(stages.get("gpu", ("",))[0].startswith("nvidia/cuda:") and "-runtime-" in stages["gpu"][0],
          "Dockerfile: stage gpu base")
    check(stages.get("cpu", ("",))[0] == "${BASE_IMAGE}", "Dockerfile: stage cpu base")
    for final in ("cpu", "gpu"):
        if final not in stages:
            check(False, f"Dockerfile: no stage {final}")
            continue
        body = "\n".join(stages[final][1])
        check(re.search(r"build-essential|\bg\+\+|\bcmake\b|-dev\b", body) is None,
              f"Dockerfile: stage {final} installs build tools")
        check(re.search(r"^EXPOSE .*\b50051\b.*\b9464\b", body, re.M) is not None,
              f"Dockerfile: stage {final} does not EXPOSE 50051 and 9464")
        user = re.search(r"^USER (\S+)", body, re.M)
        check(user is not None and not user.group(1).startswith(("0", "root")),
              f"Dockerfile: stage {final} runs as root")
        check("HEALTHCHECK" in body and "attnserve-health-probe" in body,
              f"Dockerfile: stage {final} has no HEALTHCHECK through the health probe")
        check("ENTRYPOINT" in body, f"Dockerfile: stage {final} has no ENTRYPOINT")
    for copied in re.findall(r"^COPY (?!--from)(\S+)", text, re.M):
        if copied != ".":
            check(os.path.exists(os.path.join(root, copied)), f"Dockerfile: COPY {copied}: no such file")
    ignore = open(os.path.join(root, ".dockerignore")).read().split()
    for must in (".git", "build", "build-*", "**/node_modules"):
        check(must in ignore, f".dockerignore does not exclude {must}")
    return stages


def compose_cli(deploy):
    """Runs the installed compose's own validation, when there is one."""
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        probe = subprocess.run(cmd + ["version"], capture_output=True, text=True)
        if probe.returncode != 0:
            continue
        for files in (["docker-compose.yml"], ["docker-compose.yml", "docker-compose.gpu.yml"]):
            args = cmd + sum((["-f", f] for f in files), []) + ["--profile", "bench", "config", "-q"]
            out = subprocess.run(args, cwd=deploy, capture_output=True, text=True)
            check(out.returncode == 0, f"{' '.join(args)}: {out.stderr.strip()}")
        print(f"validated with {' '.join(cmd)}: {probe.stdout.splitlines()[0]}")
        return
    print("no docker compose / docker-compose here: structural checks only")


def main():
    root = os.path.abspath(sys.argv[1])
    deploy = os.path.join(root, "deploy")
    stages = check_dockerfile(root)
    compose = yaml.safe_load(open(os.path.join(deploy, "docker-compose.yml")))
    gpu = yaml.safe_load(open(os.path.join(deploy, "docker-compose.gpu.yml")))
    compose_cli(deploy)

    services = compose["services"]
    check(set(services) == {"attnserve", "prometheus", "grafana", "bench"}, f"services {list(services)}")
    check(services["bench"].get("profiles") == ["bench"], "bench is not behind the bench profile")
    for name in ("attnserve", "prometheus", "grafana"):
        check("profiles" not in services[name], f"{name} is behind a profile")

    a = services["attnserve"]
    check(a["build"]["target"] in stages and gpu["services"]["attnserve"]["build"]["target"] in stages,
          "compose build targets are not Dockerfile stages")
    check(os.path.isfile(os.path.normpath(os.path.join(deploy, a["build"]["context"], a["build"]["dockerfile"]))),
          "compose build context has no Dockerfile")
    check(a["healthcheck"]["test"][1].endswith("attnserve-health-probe"), "healthcheck is not the probe")
    grace_ms = int(a["environment"].get("ATTNSERVE_SHUTDOWN_GRACE_MS", 10000))
    check(seconds(a["stop_grace_period"]) * 1000 > grace_ms, "stop_grace_period is shorter than the drain")
    published = {p.split(":")[-1] for p in a["ports"]}
    check(published == {"50051", "9464"}, f"attnserve ports {published}")
    gd = gpu["services"]["attnserve"]["deploy"]["resources"]["reservations"]["devices"][0]
    check(gd["driver"] == "nvidia" and "gpu" in gd["capabilities"], "GPU override reserves no GPU")

    # Bind mounts exist.
    mounts = {}
    for name, svc in services.items():
        for v in svc.get("volumes", []):
            v = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", v)  # ${VAR:-default} -> default
            src, dst = v.split(":")[:2]
            if src.startswith((".", "/")):
                path = os.path.normpath(os.path.join(deploy, src))
                check(os.path.exists(path), f"{name}: bind mount {src} does not exist")
                mounts[(name, dst)] = path

    # Prometheus: scrapes attnserve's metrics port, loads the rules it is given.
    prom_cfg = mounts.get(("prometheus", "/etc/prometheus/prometheus.yml"))
    if check(prom_cfg is not None, "prometheus.yml is not mounted at /etc/prometheus/prometheus.yml"):
        cfg = yaml.safe_load(open(prom_cfg))
        targets = [t for job in cfg["scrape_configs"] for sc in job.get("static_configs", [])
                   for t in sc["targets"]]
        check("attnserve:9464" in targets, f"Prometheus does not scrape attnserve:9464 ({targets})")
        for rule in cfg.get("rule_files", []):
            check(("prometheus", os.path.join("/etc/prometheus", rule)) in mounts,
                  f"rule file {rule} is not mounted next to prometheus.yml")

    # Grafana: data source → the prometheus service; dashboards provider → the mounted JSON.
    prov = mounts.get(("grafana", "/etc/grafana/provisioning"))
    if check(prov is not None, "Grafana provisioning is not mounted"):
        ds = yaml.safe_load(open(os.path.join(prov, "datasources", "prometheus.yml")))["datasources"]
        check(any(d["type"] == "prometheus" and d["url"] == "http://prometheus:9090" and d.get("isDefault")
                  for d in ds), "no default Prometheus data source at http://prometheus:9090")
        providers = yaml.safe_load(open(os.path.join(prov, "dashboards", "attnserve.yml")))["providers"]
        dash = [(dst, p) for (svc, dst), p in mounts.items() if svc == "grafana" and dst.endswith(".json")]
        check(len(dash) == 1, "the dashboard JSON is not mounted into Grafana")
        if dash:
            dst, path = dash[0]
            check(any(os.path.dirname(dst) == p["options"]["path"] for p in providers),
                  f"no dashboard provider reads {os.path.dirname(dst)}")
            d = json.load(open(path))
            ds_vars = [v for v in d.get("templating", {}).get("list", []) if v.get("type") == "datasource"]
            check(any(v.get("query") == "prometheus" for v in ds_vars) or "${DS_PROMETHEUS}" not in json.dumps(d),
                  "the dashboard's data source variable would not find a Prometheus")

    # bench: waits for a healthy server and targets it.
    b = services["bench"]
    check(b["depends_on"]["attnserve"]["condition"] == "service_healthy", "bench does not wait for health")
    check(b["command"][0] == "attnserve-bench" and any(
        re.fullmatch(r"--target=(dns:///)?attnserve:50051", c) for c in b["command"]),
        "bench does not run attnserve-bench against attnserve:50051")

    for f in failures:
        print("FAIL:", f)
    print(f"{'FAILED' if failures else 'passed'}: compose, provisioning and Dockerfile, {len(failures)} problems")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
