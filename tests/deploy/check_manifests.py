#!/usr/bin/env python3
"""Checks deploy/kubernetes/*.yaml beyond YAML syntax: every object has apiVersion, kind and
metadata.name, and the DaemonSet has what MPS needs (host IPC, a pipe directory shared by the
daemon and server containers, SYS_NICE for the daemon, GPUs requested, gRPC health probes)."""
import glob
import sys

import yaml

errors = []
docs = []
for path in sorted(glob.glob(sys.argv[1] + "/*.yaml")):
    with open(path) as f:
        for doc in yaml.safe_load_all(f):
            if doc is None:
                continue
            for field in ("apiVersion", "kind"):
                if field not in doc:
                    errors.append(f"{path}: an object has no {field}")
            if not doc.get("metadata", {}).get("name"):
                errors.append(f"{path}: a {doc.get('kind')} has no metadata.name")
            docs.append((path, doc))

daemonsets = [(p, d) for p, d in docs if d.get("kind") == "DaemonSet"]
if not daemonsets:
    errors.append("no DaemonSet")
for path, ds in daemonsets:
    spec = ds["spec"]["template"]["spec"]
    if spec.get("hostIPC") is not True:
        errors.append(f"{path}: hostIPC must be true for MPS")
    containers = {c["name"]: c for c in spec["containers"]}
    daemon = next((c for c in containers.values() if "mps" in c["name"]), None)
    server = next((c for c in containers.values() if "tessera" in c["name"]), None)
    if daemon is None or server is None:
        errors.append(f"{path}: needs an MPS daemon container and a tessera container")
        continue
    if "SYS_NICE" not in daemon.get("securityContext", {}).get("capabilities", {}).get("add", []):
        errors.append(f"{path}: the MPS daemon container needs SYS_NICE")
    pipe = {}
    for c in (daemon, server):
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        pipe[c["name"]] = env.get("CUDA_MPS_PIPE_DIRECTORY")
        mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
        if pipe[c["name"]] not in mounts:
            errors.append(f"{path}: {c['name']} does not mount its CUDA_MPS_PIPE_DIRECTORY")
        if "nvidia.com/gpu" not in c.get("resources", {}).get("limits", {}):
            errors.append(f"{path}: {c['name']} requests no nvidia.com/gpu")
    if len(set(pipe.values())) != 1:
        errors.append(f"{path}: the daemon and the server use different pipe directories")
    annotations = ds["spec"]["template"]["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/scrape") != "true":
        errors.append(f"{path}: the pod template needs prometheus.io/scrape: \"true\"")
    port = annotations.get("prometheus.io/port")
    args = " ".join(server.get("args", []))
    if port is None or f"--metrics_listen=0.0.0.0:{port}" not in args:
        errors.append(f"{path}: prometheus.io/port must be the server's --metrics_listen port")
    ports = {p.get("containerPort") for p in server.get("ports", [])}
    if port is not None and int(port) not in ports:
        errors.append(f"{path}: the metrics port {port} is not a container port")
    for probe in ("readinessProbe", "livenessProbe"):
        if "grpc" not in server.get(probe, {}):
            errors.append(f"{path}: the server's {probe} must use grpc.health.v1 (grpc:)")

for e in errors:
    print(e, file=sys.stderr)
print(f"checked {len(docs)} object(s): {'FAILED' if errors else 'ok'}")
sys.exit(1 if errors else 0)
