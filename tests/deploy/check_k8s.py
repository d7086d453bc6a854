"""Renders every kustomize overlay of deploy/k8s with `kubectl kustomize` (offline) and checks
what the manifests promise: gRPC probes on the health service, a grace period longer than the
drain, a headless Service, the autoscaler's metrics (and that the prometheus-adapter example
serves the custom one), the PodDisruptionBudget, the ServiceMonitor, and GPUs only in the GPU
overlay. Every selector must match the pod labels and every named port must exist. The sessions
overlay runs the same pod as a StatefulSet: stable names as session owners, a volume per pod for
the session snapshot, no autoscaler.

usage: check_k8s.py DEPLOY_K8S_DIR      exit 0 passed, 1 failed, 77 no kubectl
"""
import os
import re
import shutil
import subprocess
import sys

import yaml

OVERLAYS = {"overlays/gpu": "gpu", "overlays/cpu": "cpu", ".": "gpu",  # "." is the default
            "overlays/sessions": "cpu"}
STATEFUL = {"overlays/sessions"}  # a StatefulSet with snapshot volumes, not a Deployment
SNAPSHOT_BUDGET_MS = 10000  # the drain's snapshot of a 1 GiB pool at 100 MB/s
GRPC_PORT, METRICS_PORT = 50051, 9464
failures = []


def check(ok, message):
    if not ok:
        failures.append(message)
    return ok


def render(kubectl, path):
    out = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {path} failed:\n{out.stderr}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def one(docs, kind, where, **match):
    found = [d for d in docs if d["kind"] == kind and
             all(d.get("spec", {}).get(k) == v for k, v in match.items())]
    check(len(found) == 1, f"{where}: expected one {kind} {match or ''}, found {len(found)}")
    return found[0] if found else None


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_overlay(name, flavour, docs):
    w = f"[{name}]"
    stateful = name in STATEFUL
    check(not any(d["kind"] == ("Deployment" if stateful else "StatefulSet") for d in docs),
          f"{w} renders both a Deployment and a StatefulSet")
    dep = one(docs, "StatefulSet" if stateful else "Deployment", w)
    if dep is None:
        return
    pod = dep["spec"]["template"]
    labels = pod["metadata"]["labels"]
    spec = pod["spec"]
    check(selects(dep["spec"]["selector"]["matchLabels"], labels), f"{w} {dep['kind']} selector")
    (c,) = spec["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check(ports == {"grpc": GRPC_PORT, "metrics": METRICS_PORT}, f"{w} container ports {ports}")
    check(spec.get("enableServiceLinks") is False, f"{w} enableServiceLinks must be false")
    sc = spec.get("securityContext", {})
    check(sc.get("runAsNonRoot") is True and sc.get("runAsUser") == 10001,
          f"{w} must run as the image's uid 10001, non-root")
    image = c["image"]
    check(image.endswith("-" + flavour), f"{w} image {image} is not the {flavour} image")

    # Probes: native gRPC probes on the server's port (grpc.health.v1, overall health).
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = c.get(probe, {})
        check(p.get("grpc", {}).get("port") == GRPC_PORT, f"{w} {probe} is not a gRPC probe on {GRPC_PORT}")
        check("service" not in p.get("grpc", {}), f"{w} {probe} must ask the overall health")

    # Configuration: the env ConfigMap exists, its keys are ATTNSERVE_<flag>.
    cm_names = [e["configMapRef"]["name"] for e in c.get("envFrom", [])]
    cms = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] in cm_names]
    check(len(cms) == 1, f"{w} envFrom ConfigMap {cm_names} not rendered")
    env = cms[0]["data"] if cms else {}
    check(all(re.fullmatch(r"ATTNSERVE_[A-Z0-9_]+", k) for k in env), f"{w} config keys {list(env)}")
    check(env.get("ATTNSERVE_BACKEND") == ("cuda" if flavour == "gpu" else "cpu"),
          f"{w} ATTNSERVE_BACKEND is {env.get('ATTNSERVE_BACKEND')}")
    check(env.get("ATTNSERVE_LISTEN", "").endswith(f":{GRPC_PORT}"), f"{w} ATTNSERVE_LISTEN")
    check(env.get("ATTNSERVE_METRICS_ADDRESS", "").endswith(f":{METRICS_PORT}"),
          f"{w} ATTNSERVE_METRICS_ADDRESS")

    # Decode sessions: each pod names itself in session ids by its pod IP and gRPC port, the
    # address the headless Service resolves to (clients route a session's calls there); in a
    # StatefulSet by its stable name, which the next pod of that name keeps (and with it the
    # snapshot, on a volume of its own).
    env_list = c.get("env", [])
    pod_env = {e["name"]: e for e in env_list}
    field = lambda name: pod_env.get(name, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    owner = pod_env.get("ATTNSERVE_SESSION_OWNER", {}).get("value")
    if stateful:
        check(field("POD_NAME") == "metadata.name" and field("POD_NAMESPACE") == "metadata.namespace",
              f"{w} POD_NAME and POD_NAMESPACE must come from the pod's metadata")
        check(owner == f"$(POD_NAME).attnserve-grpc.$(POD_NAMESPACE).svc.cluster.local:{GRPC_PORT}",
              f"{w} ATTNSERVE_SESSION_OWNER must be the pod's stable name, was {owner!r}")
        check(dep["spec"].get("serviceName") == "attnserve-grpc",
              f"{w} the StatefulSet's serviceName must be the headless Service")
    else:
        check(field("POD_IP") == "status.podIP", f"{w} POD_IP must come from status.podIP")
        check(owner == f"$(POD_IP):{GRPC_PORT}", f"{w} ATTNSERVE_SESSION_OWNER must be $(POD_IP):{GRPC_PORT}")
    # A variable is defined before the one whose value names it (Kubernetes expands only those).
    for i, e in enumerate(env_list):
        for ref in re.findall(r"\$\(([A-Z_]+)\)", e.get("value", "")):
            check(ref in [x["name"] for x in env_list[:i]], f"{w} {e['name']} names $({ref}) before it is set")
    snapshot_dir = env.get("ATTNSERVE_SESSION_SNAPSHOT_DIR")
    if stateful:
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        claims = {t["metadata"]["name"]: t for t in dep["spec"].get("volumeClaimTemplates", [])}
        check(snapshot_dir is not None and mounts.get(snapshot_dir) in claims,
              f"{w} ATTNSERVE_SESSION_SNAPSHOT_DIR {snapshot_dir!r} is not on a volume claim")
        size = claims.get(mounts.get(snapshot_dir), {}).get("spec", {}).get("resources", {}).get(
            "requests", {}).get("storage", "0")
        check(re.fullmatch(r"\d+Gi", size) is not None and int(size[:-2]) >= 1,
              f"{w} the snapshot volume ({size}) holds less than the 1 GiB pool")
    else:
        check(snapshot_dir is None, f"{w} a snapshot directory dies with a Deployment's pod")

    # A drain moves the pod's sessions to the pods the headless Service resolves to, on the
    # gRPC port (each pod leaves itself out: its owner is its own address there).
    headless = [d for d in docs if d["kind"] == "Service" and
                d["metadata"]["name"] == "attnserve-grpc" and d["spec"].get("clusterIP") == "None"]
    check(len(headless) == 1, f"{w} needs the headless Service attnserve-grpc")
    check(env.get("ATTNSERVE_SESSION_PEERS") == f"dns:attnserve-grpc:{GRPC_PORT}",
          f"{w} ATTNSERVE_SESSION_PEERS must be dns:attnserve-grpc:{GRPC_PORT} (the headless "
          f"Service), was {env.get('ATTNSERVE_SESSION_PEERS')!r}")

    # Drain: preStop sleep + --shutdown_grace_ms must end before SIGKILL.
    grace_ms = int(env.get("ATTNSERVE_SHUTDOWN_GRACE_MS", "10000"))  # the server's default
    pre_stop = c.get("lifecycle", {}).get("preStop", {})
    pre_stop_s = 0
    if "exec" in pre_stop and pre_stop["exec"]["command"][0] == "sleep":
        pre_stop_s = int(pre_stop["exec"]["command"][1])
    elif "sleep" in pre_stop:
        pre_stop_s = int(pre_stop["sleep"]["seconds"])
    tgps = spec.get("terminationGracePeriodSeconds", 30)
    snapshot_ms = SNAPSHOT_BUDGET_MS if snapshot_dir else 0
    check(tgps * 1000 >= pre_stop_s * 1000 + grace_ms + snapshot_ms + 5000,
          f"{w} terminationGracePeriodSeconds {tgps} s is not 5 s longer than preStop "
          f"{pre_stop_s} s + drain {grace_ms} ms + snapshot {snapshot_ms} ms")
    live = c["livenessProbe"]
    check(live["periodSeconds"] * live["failureThreshold"] * 1000 > grace_ms,
          f"{w} liveness could kill a draining pod")

    # GPUs in the GPU overlay only.
    res = c.get("resources", {})
    gpus = res.get("limits", {}).get("nvidia.com/gpu")
    if flavour == "gpu":
        check(gpus == 1, f"{w} nvidia.com/gpu limit is {gpus}")
        check(any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", [])),
              f"{w} no toleration for GPU nodes")
    else:
        check(gpus is None, f"{w} the CPU overlay asks for GPUs")
        check(str(env.get("ATTNSERVE_BACKEND_THREADS")) == str(res["requests"]["cpu"]),
              f"{w} CPU backend threads differ from the CPU request")
    check("cpu" in res.get("requests", {}), f"{w} no CPU request (the HPA's CPU target needs one)")

    # Services: a headless one for client-side balancing, an ordinary one with the metrics port.
    services = [d for d in docs if d["kind"] == "Service"]
    for s in services:
        check(selects(s["spec"]["selector"], labels), f"{w} Service {s['metadata']['name']} selects no pod")
        for p in s["spec"]["ports"]:
            check(p.get("targetPort") in ports, f"{w} Service port {p} names no container port")
    headless = [s for s in services if s["spec"].get("clusterIP") == "None"]
    check(len(headless) == 1 and [p["port"] for p in headless[0]["spec"]["ports"]] == [GRPC_PORT],
          f"{w} expected one headless Service on {GRPC_PORT}")

    if stateful:  # clients list the pods by name: a fixed count
        check(not any(d["kind"] == "HorizontalPodAutoscaler" for d in docs), f"{w} has an autoscaler")
    hpa = None if stateful else one(docs, "HorizontalPodAutoscaler", w)
    if hpa:
        check(hpa["apiVersion"] == "autoscaling/v2", f"{w} HPA apiVersion")
        ref = hpa["spec"]["scaleTargetRef"]
        check(ref["kind"] == "Deployment" and ref["name"] == dep["metadata"]["name"], f"{w} HPA target")
        kinds = {m["type"]: m for m in hpa["spec"]["metrics"]}
        check(kinds.get("Resource", {}).get("resource", {}).get("name") == "cpu", f"{w} HPA has no CPU metric")
        pods_metric = kinds.get("Pods", {}).get("pods", {}).get("metric", {}).get("name")
        check(pods_metric == "attnserve_requests_in_flight", f"{w} HPA custom metric {pods_metric}")
        check(2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"], f"{w} HPA bounds")

    pdb = one(docs, "PodDisruptionBudget", w)
    if pdb:
        check(selects(pdb["spec"]["selector"]["matchLabels"], labels), f"{w} PDB selects no pod")
        check(pdb["spec"].get("maxUnavailable") == 1 or pdb["spec"].get("minAvailable") is not None,
              f"{w} PDB bound")

    sm = one(docs, "ServiceMonitor", w)
    if sm:
        chosen = [s for s in services if selects(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
        check(len(chosen) == 1, f"{w} ServiceMonitor selects {len(chosen)} Services")
        names = {p["name"] for s in chosen for p in s["spec"]["ports"]}
        for e in sm["spec"]["endpoints"]:
            check(e["port"] in names and e.get("path", "/metrics") == "/metrics",
                  f"{w} ServiceMonitor endpoint {e}")


def check_adapter(root):
    path = os.path.join(root, "prometheus-adapter", "values.yaml")
    with open(path) as f:
        values = yaml.safe_load(f)
    served = {r["name"]["as"] for r in values["rules"]["custom"]}
    check("attnserve_requests_in_flight" in served, f"{path} does not serve attnserve_requests_in_flight")
    for r in values["rules"]["custom"]:
        check("<<.LabelMatchers>>" in r["metricsQuery"], f"{path}: rule without <<.LabelMatchers>>")


def main():
    root = os.path.abspath(sys.argv[1])
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print("SKIP: kubectl is not installed (its `kubectl kustomize` renders offline)")
        return 77
    version = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True).stdout
    print(version.strip())
    for rel, flavour in OVERLAYS.items():
        docs = render(kubectl, os.path.join(root, rel))
        print(f"{rel}: {', '.join(sorted(d['kind'] + '/' + d['metadata']['name'] for d in docs))}")
        check_overlay(rel, flavour, docs)
    check_adapter(root)
    for f in failures:
        print("FAIL:", f)
    print(f"{'FAILED' if failures else 'passed'}: {len(OVERLAYS)} renderings, {len(failures)} problems")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
