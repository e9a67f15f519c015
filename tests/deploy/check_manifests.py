#!/usr/bin/env python3
"""Checks the Kubernetes manifests in a directory (every *.yaml) beyond YAML syntax.

Every object: apiVersion, kind and metadata.name. Every DaemonSet, for its tessera-server
container (the one that runs tessera-server), the properties below; each failure is printed as
`FILE: DaemonSet NAME, container CONTAINER: PROPERTY: what is wrong`, and a last line lists the
properties that failed (tests/deploy/check_deploy.sh reads it).

  gpu-once          exactly one container requests nvidia.com/gpu, and it is the server
                    (requests add up: a pod needs max(sum over containers, max over init
                    containers), so two requesting containers need two GPUs)
  host-ipc          no hostIPC
  probes            startup, readiness and liveness probes on the server; a grpc probe must
                    target a plaintext port: --health_listen's when the main port has TLS
  resources         CPU and memory requests and limits on every container (init included),
                    requests not above limits
  non-root          the server runs with runAsNonRoot: true and a numeric runAsUser other than 0
  hardening         the server: allowPrivilegeEscalation false, readOnlyRootFilesystem, drops
                    ALL capabilities, seccomp RuntimeDefault
  capabilities      no capabilities added to a container that runs as non-root (not effective:
                    no ambient capabilities)
  state-dir         --state_dir is a writable mounted volume the server's uid can write: a
                    hostPath chowned to that uid by a root init container with CHOWN, or an
                    emptyDir/PVC/ephemeral volume with fsGroup == the server's gid
  tolerations       tolerates the nvidia.com/gpu NoSchedule taint
  tls               --tls_cert and --tls_key, both files from a mounted Secret the server's
                    uid can read
  dev-shm           when MPS may be used (--mps not off): managed (--mps_manage), /dev/shm is a
                    memory emptyDir with a sizeLimit below the memory limit; otherwise (the
                    device plugin's MPS) the plugin mounts /dev/shm, so the pod must not
  mps-pipe          managed: --mps_base_dir on a mounted emptyDir; device plugin's MPS: no
                    --mps_manage, no CUDA_MPS_PIPE_DIRECTORY set by the manifest (the plugin
                    injects it), no container running nvidia-cuda-mps-control
  metrics           prometheus.io annotations, when present, match --metrics_listen's port,
                    which is a container port
  fleet             with --fleet_etcd (docs/fleet.md): --node_name is $(VAR) with VAR from the
                    downward API's spec.nodeName, --advertise_address is $(VAR):<the main
                    port> with VAR from status.podIP, and the admin token comes from a Secret
                    (registrations forwarded between nodes carry the caller's token)
  metrics-auth      a --metrics_listen off loopback has --metrics_token_file (or
                    --metrics_tls_client_ca with --metrics_tls_cert/--metrics_tls_key), its
                    files on a mounted Secret the server's uid can read (the server refuses
                    to start otherwise)
"""
import glob
import os
import re
import sys

import yaml

SERVER_BINARY = "tessera-server"
GPU = "nvidia.com/gpu"


class Report:
    def __init__(self):
        self.errors = []
        self.properties = []

    def fail(self, where, prop, message):
        self.errors.append(f"{where}: {prop}: {message}")
        if prop not in self.properties:
            self.properties.append(prop)


def quantity(value):
    """A Kubernetes quantity (CPU or bytes) as a float; None when absent or unparsable."""
    if value is None:
        return None
    text = str(value).strip()
    match = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", text)
    if not match:
        return None
    number, suffix = float(match.group(1)), match.group(2)
    factors = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10,
               "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    if suffix not in factors:
        return None
    return number * factors[suffix]


def flags(container):
    """--name=value (or bare --name: True) from a container's command and args."""
    out = {}
    for word in list(container.get("command") or []) + list(container.get("args") or []):
        word = str(word)
        if word.startswith("--"):
            name, eq, value = word[2:].partition("=")
            out[name] = value if eq else True
    return out


def command_text(container):
    return " ".join(str(w) for w in
                    list(container.get("command") or []) + list(container.get("args") or []))


def port_of(address):
    if not isinstance(address, str) or ":" not in address:
        return None
    try:
        return int(address.rsplit(":", 1)[1])
    except ValueError:
        return None


def security(pod, container, field):
    """The effective value of a securityContext field: the container's, else the pod's."""
    value = (container.get("securityContext") or {}).get(field)
    if value is None and field in ("runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile"):
        value = (pod.get("securityContext") or {}).get(field)
    return value


def volume_for(pod, container, path):
    """(volume, mount) whose mountPath is path or the closest parent of it; (None, None)."""
    best = (None, None)
    best_len = -1
    for mount in container.get("volumeMounts") or []:
        mp = mount.get("mountPath", "").rstrip("/") or "/"
        if path == mp or path.startswith(mp.rstrip("/") + "/"):
            if len(mp) > best_len:
                volume = next((v for v in pod.get("volumes") or []
                               if v.get("name") == mount.get("name")), None)
                best, best_len = (volume, mount), len(mp)
    return best


def gpu_count(container):
    resources = container.get("resources") or {}
    for kind in ("limits", "requests"):
        value = (resources.get(kind) or {}).get(GPU)
        if value is not None:
            return int(quantity(value) or 0)
    return 0


def chowned_by_init(pod, inits, volume, uid):
    """True when a root init container with CHOWN mounts `volume` and chowns its mount to
    `uid` (the kubelet creates hostPath directories root-owned; fsGroup does not apply)."""
    for c in inits:
        init_mount = next((m for m in c.get("volumeMounts") or []
                           if m.get("name") == volume.get("name")), None)
        if init_mount is None:
            continue
        text = command_text(c)
        owners = {int(m.group(1)) for m in
                  re.finditer(r"chown\s+(?:-\S+\s+)*(\d+)(?::\d+)?\s", text + " ")}
        c_uid = security(pod, c, "runAsUser")
        caps = (c.get("securityContext") or {}).get("capabilities") or {}
        has_chown = "ALL" not in (caps.get("drop") or []) or \
            "CHOWN" in (caps.get("add") or [])
        if (uid in owners and c_uid == 0 and has_chown
                and init_mount.get("mountPath") in text):
            return True
    return False


def check_daemonset(path, ds, report):
    name = ds.get("metadata", {}).get("name")
    pod = (((ds.get("spec") or {}).get("template") or {}).get("spec")) or {}
    containers = pod.get("containers") or []
    inits = pod.get("initContainers") or []
    here = f"{path}: DaemonSet {name}"

    def at(container):
        return f"{here}, container {container.get('name')}"

    server = next((c for c in containers if SERVER_BINARY in command_text(c)), None)
    if server is None:
        server = next((c for c in containers if c.get("name") == SERVER_BINARY), None)
    if server is None:
        report.fail(here, "server", f"no container runs {SERVER_BINARY}")
        return
    f = flags(server)
    sv = at(server)
    uid = security(pod, server, "runAsUser")
    gid = security(pod, server, "runAsGroup")
    fs_group = (pod.get("securityContext") or {}).get("fsGroup")

    # gpu-once
    requesting = [c for c in inits + containers if gpu_count(c) > 0]
    app_sum = sum(gpu_count(c) for c in containers)
    init_max = max([gpu_count(c) for c in inits] or [0])
    needed = max(app_sum, init_max)
    if len(requesting) != 1:
        names = ", ".join(c.get("name") for c in requesting) or "none"
        report.fail(here, "gpu-once",
                    f"{GPU} is requested by {len(requesting)} containers ({names}); requests add "
                    f"up, so the pod needs {needed} GPU(s) (max of the sum over containers and "
                    f"the largest init container's): request the GPUs once, in {server['name']}")
    elif requesting[0] is not server:
        report.fail(at(requesting[0]), "gpu-once",
                    f"requests {GPU} but is not the server; the server must hold the GPUs")
    for c in inits + containers:
        res = c.get("resources") or {}
        lim, req = (res.get("limits") or {}).get(GPU), (res.get("requests") or {}).get(GPU)
        if lim is not None and req is not None and quantity(lim) != quantity(req):
            report.fail(at(c), "gpu-once", f"{GPU} request {req} differs from its limit {lim}")

    # host-ipc
    if pod.get("hostIPC") is True:
        report.fail(here, "host-ipc",
                    "hostIPC: true shares the node's IPC namespace; MPS daemon, server and "
                    "clients in one container need none")

    # probes
    tls_on = bool(f.get("tls_cert")) or bool(f.get("tls_key"))
    main_port = port_of(f.get("listen")) or 50051
    health = f.get("health_listen")
    health_port = port_of(health)
    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = server.get(probe_name)
        if not probe:
            report.fail(sv, "probes", f"no {probe_name}")
            continue
        grpc = probe.get("grpc")
        if grpc is None:
            continue
        port = grpc.get("port")
        if tls_on and port == main_port:
            report.fail(sv, "probes",
                        f"{probe_name} uses grpc on the TLS port {port}; the kubelet's grpc "
                        "probe is plaintext: probe --health_listen's port")
        elif port != main_port and port != health_port:
            report.fail(sv, "probes",
                        f"{probe_name} uses grpc port {port}, which is neither --listen's nor "
                        "--health_listen's")
    if health is not None and str(health).split(":")[0] in ("127.0.0.1", "localhost", "[::1]"):
        report.fail(sv, "probes",
                    f"--health_listen={health} is loopback; the kubelet probes the pod IP")

    # resources
    for c in inits + containers:
        res = c.get("resources") or {}
        for kind in ("requests", "limits"):
            for r in ("cpu", "memory"):
                if quantity((res.get(kind) or {}).get(r)) is None:
                    report.fail(at(c), "resources", f"no {r} {kind[:-1]}")
        for r in ("cpu", "memory"):
            req = quantity((res.get("requests") or {}).get(r))
            lim = quantity((res.get("limits") or {}).get(r))
            if req is not None and lim is not None and req > lim:
                report.fail(at(c), "resources", f"{r} request above its limit")

    # non-root
    if security(pod, server, "runAsNonRoot") is not True:
        report.fail(sv, "non-root", "runAsNonRoot is not true")
    if not isinstance(uid, int) or isinstance(uid, bool) or uid == 0:
        report.fail(sv, "non-root",
                    f"runAsUser is {uid!r}: set a numeric non-root uid (the image's USER may "
                    "be a name, which runAsNonRoot cannot verify)")

    # hardening
    sc = server.get("securityContext") or {}
    if sc.get("allowPrivilegeEscalation") is not False:
        report.fail(sv, "hardening", "allowPrivilegeEscalation is not false")
    if sc.get("readOnlyRootFilesystem") is not True:
        report.fail(sv, "hardening", "readOnlyRootFilesystem is not true")
    if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
        report.fail(sv, "hardening", "capabilities do not drop ALL")
    if (security(pod, server, "seccompProfile") or {}).get("type") != "RuntimeDefault":
        report.fail(sv, "hardening", "no seccompProfile RuntimeDefault")

    # capabilities
    for c in inits + containers:
        added = ((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or []
        c_uid = security(pod, c, "runAsUser")
        non_root = security(pod, c, "runAsNonRoot") is True or (
            isinstance(c_uid, int) and c_uid != 0)
        if added and non_root:
            report.fail(at(c), "capabilities",
                        f"adds {', '.join(added)} while running as non-root uid {c_uid}: not "
                        "effective (no ambient capabilities); drop it")

    # state-dir
    state = f.get("state_dir")
    if not isinstance(state, str) or not state.startswith("/"):
        given = "no --state_dir" if state is None else f"--state_dir={state}"
        report.fail(sv, "state-dir",
                    f"{given} in the manifest: give an absolute path on a mounted volume (a "
                    "default from the image cannot be checked)")
    else:
        volume, mount = volume_for(pod, server, state)
        if volume is None:
            report.fail(sv, "state-dir", f"--state_dir={state} is on no mounted volume")
        elif mount.get("readOnly"):
            report.fail(sv, "state-dir", f"--state_dir={state} is mounted read-only")
        elif "hostPath" in volume:
            if not chowned_by_init(pod, inits, volume, uid):
                report.fail(sv, "state-dir",
                            f"--state_dir={state} is hostPath {volume['hostPath'].get('path')}, "
                            f"which the kubelet creates root-owned and fsGroup does not change: "
                            f"add a root init container (CHOWN) that chowns it to uid {uid}")
        elif any(k in volume for k in ("emptyDir", "persistentVolumeClaim", "ephemeral")):
            if fs_group is None or fs_group != gid:
                report.fail(sv, "state-dir",
                            f"--state_dir={state}: fsGroup {fs_group} is not the server's gid "
                            f"{gid}")
        else:
            kinds = ", ".join(k for k in volume if k != "name")
            report.fail(sv, "state-dir", f"--state_dir={state} is on a {kinds} volume, not "
                        "writable state")

    # --unix_socket: on a hostPath directory (shared with the pods on the node), writable,
    # made the server's by a root init container like the state directory.
    unix_socket = flags(server).get("unix_socket")
    if unix_socket:
        directory = unix_socket.rsplit("/", 1)[0] or "/"
        volume, mount = volume_for(pod, server, directory)
        if volume is None or "hostPath" not in volume:
            report.fail(sv, "unix-socket",
                        f"--unix_socket={unix_socket} is not on a hostPath volume: pods on the "
                        "node cannot reach it")
        elif mount.get("readOnly"):
            report.fail(sv, "unix-socket", f"--unix_socket={unix_socket} is mounted read-only")
        elif not chowned_by_init(pod, inits, volume, uid):
            report.fail(sv, "unix-socket",
                        f"--unix_socket={unix_socket}: hostPath "
                        f"{volume['hostPath'].get('path')} is created root-owned: add a root "
                        f"init container (CHOWN) that chowns it to uid {uid}")

    # tolerations
    tolerated = False
    for t in pod.get("tolerations") or []:
        effect_ok = t.get("effect") in (None, "", "NoSchedule")
        if t.get("operator") == "Exists" and not t.get("key") and effect_ok:
            tolerated = True
        if t.get("key") == GPU and effect_ok and t.get("operator", "Equal") in ("Exists", "Equal"):
            tolerated = True
    if not tolerated:
        report.fail(here, "tolerations",
                    f"no toleration for the {GPU}:NoSchedule taint of GPU nodes")

    # tls
    for flag in ("tls_cert", "tls_key"):
        file = f.get(flag)
        if not isinstance(file, str) or not file:
            report.fail(sv, "tls", f"no --{flag} (the main port serves plaintext)")
            continue
        volume, _ = volume_for(pod, server, file)
        secret = (volume or {}).get("secret")
        if secret is None:
            report.fail(sv, "tls", f"--{flag}={file} is not on a mounted Secret")
            continue
        mode = secret.get("defaultMode", 0o644)
        # With fsGroup the kubelet makes Secret files group fsGroup and group-readable, and
        # every container has fsGroup among its groups.
        readable = bool(mode & 0o004) or fs_group is not None or uid == 0
        if not readable:
            report.fail(sv, "tls", f"--{flag}={file}: Secret mode {oct(mode)} with fsGroup "
                        f"{fs_group} is not readable by uid {uid}")

    # dev-shm and mps-pipe
    mps = f.get("mps", "auto")
    managed = f.get("mps_manage") in (True, "true", "1")
    env = {e.get("name"): e for e in server.get("env") or []}
    if mps != "off":
        shm_volume, shm_mount = volume_for(pod, server, "/dev/shm")
        if shm_mount is not None and shm_mount.get("mountPath", "").rstrip("/") != "/dev/shm":
            shm_volume, shm_mount = None, None
        if managed:
            empty = (shm_volume or {}).get("emptyDir")
            if shm_mount is None:
                report.fail(sv, "dev-shm",
                            "/dev/shm is the runtime's 64 MiB default; MPS clients' page-locked "
                            "memory is limited by it: mount an emptyDir {medium: Memory, "
                            "sizeLimit}")
            elif empty is None or empty.get("medium") != "Memory" or not empty.get("sizeLimit"):
                report.fail(sv, "dev-shm", "/dev/shm is not an emptyDir with medium: Memory and "
                            "a sizeLimit")
            else:
                size = quantity(empty["sizeLimit"])
                limit = quantity(((server.get("resources") or {}).get("limits") or {})
                                 .get("memory"))
                if limit is not None and size is not None and size >= limit:
                    report.fail(sv, "dev-shm",
                                f"/dev/shm sizeLimit {empty['sizeLimit']} is not below the "
                                "memory limit it is charged to")
            base = f.get("mps_base_dir")
            if not isinstance(base, str) or not base.startswith("/"):
                report.fail(sv, "mps-pipe", "--mps_manage without an absolute --mps_base_dir")
            else:
                volume, _ = volume_for(pod, server, base)
                if volume is None or "emptyDir" not in volume:
                    report.fail(sv, "mps-pipe",
                                f"--mps_base_dir={base} is not on a mounted emptyDir (the "
                                "daemon's pipes belong to this pod alone)")
            if "CUDA_MPS_PIPE_DIRECTORY" in env:
                report.fail(sv, "mps-pipe", "CUDA_MPS_PIPE_DIRECTORY set beside --mps_manage "
                            "(the server sets it from --mps_base_dir)")
        else:
            if shm_mount is not None:
                report.fail(sv, "dev-shm",
                            "mounts /dev/shm although MPS comes from the device plugin, which "
                            "mounts its own /dev/shm into the container")
            if shm_mount is None and ("CUDA_MPS_PIPE_DIRECTORY" in env or pod.get("hostIPC")):
                report.fail(sv, "dev-shm",
                            "/dev/shm is not sized for MPS (neither --mps_manage with a memory "
                            "emptyDir nor the device plugin's)")
            if "CUDA_MPS_PIPE_DIRECTORY" in env:
                report.fail(sv, "mps-pipe",
                            "sets CUDA_MPS_PIPE_DIRECTORY itself: with the device plugin's MPS "
                            "the plugin injects it; with a daemon of this pod use --mps_manage")
            for c in inits + containers:
                if "nvidia-cuda-mps-control" in command_text(c):
                    report.fail(at(c), "mps-pipe",
                                "runs nvidia-cuda-mps-control beside a server without "
                                "--mps_manage: use --mps_manage (one container), or the device "
                                "plugin's daemon")

    # metrics
    annotations = ((ds["spec"]["template"].get("metadata") or {}).get("annotations")) or {}
    if "prometheus.io/scrape" in annotations or "prometheus.io/port" in annotations:
        if annotations.get("prometheus.io/scrape") != "true":
            report.fail(here, "metrics", 'prometheus.io/scrape is not "true"')
        port = annotations.get("prometheus.io/port")
        metrics_port = port_of(f.get("metrics_listen"))
        if port is None or metrics_port is None or int(port) != metrics_port:
            report.fail(sv, "metrics",
                        f"prometheus.io/port {port} is not --metrics_listen's port")
        ports = {p.get("containerPort") for p in server.get("ports") or []}
        if port is not None and int(port) not in ports:
            report.fail(sv, "metrics", f"the metrics port {port} is not a container port")

    check_fleet(pod, server, f, sv, report)

    # metrics-auth
    listen = f.get("metrics_listen")
    if isinstance(listen, str) and listen:
        host = listen.rsplit(":", 1)[0].strip("[]")
        loopback = host in ("", "localhost", "::1") or host.startswith("127.")
        if not loopback:
            needed = (["metrics_token_file"] if f.get("metrics_token_file") else
                     ["metrics_tls_cert", "metrics_tls_key", "metrics_tls_client_ca"]
                     if f.get("metrics_tls_client_ca") else [])
            if not needed:
                report.fail(sv, "metrics-auth",
                            f"--metrics_listen={listen} is not loopback and has neither "
                            "--metrics_token_file nor --metrics_tls_client_ca: the server "
                            "refuses to start")
            for flag in needed:
                file = f.get(flag)
                volume, _ = volume_for(pod, server, file) if isinstance(file, str) else (None, None)
                secret = (volume or {}).get("secret")
                if secret is None:
                    report.fail(sv, "metrics-auth", f"--{flag}={file} is not on a mounted Secret")
                    continue
                mode = secret.get("defaultMode", 0o644)
                if not (bool(mode & 0o004) or fs_group is not None or uid == 0):
                    report.fail(sv, "metrics-auth", f"--{flag}={file}: Secret mode {oct(mode)} "
                                f"is not readable by uid {uid}")


def check_fleet(pod, server, f, sv, report):
    if not f.get("fleet_etcd"):
        return
    env = {e.get("name"): e for e in server.get("env") or []}

    def from_field(value, field):
        m = re.fullmatch(r"\$\((\w+)\)(:\d+)?", str(value or ""))
        if not m:
            return False
        e = env.get(m.group(1)) or {}
        return ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") == field

    if not from_field(f.get("node_name"), "spec.nodeName"):
        report.fail(sv, "fleet", "--node_name is not the node's name from the downward API "
                    "(spec.nodeName): two pods could claim one name, or a pod another node's")
    advertise = f.get("advertise_address")
    main_port = port_of(f.get("listen")) or 50051
    if not from_field(advertise, "status.podIP") or port_of(advertise) != main_port:
        report.fail(sv, "fleet", f"--advertise_address={advertise} is not $(VAR):{main_port} "
                    "with VAR from the downward API's status.podIP")
    token_file = f.get("admin_token_file")
    volume, _ = volume_for(pod, server, token_file) if isinstance(token_file, str) else (None, None)
    token_env = (env.get("TESSERA_ADMIN_TOKEN") or {}).get("valueFrom") or {}
    if (volume or {}).get("secret") is None and not token_env.get("secretKeyRef"):
        report.fail(sv, "fleet", "the admin token is not from a Secret every node reads: "
                    "registrations forwarded between nodes carry the caller's token")


def self_test(directory):
    """Each property must fail on a DaemonSet of DIRECTORY broken in that one way."""
    import copy

    def server(pod):
        return next(c for c in pod["containers"] if c["name"] == SERVER_BINARY)

    def set_arg(pod, name, value):
        args = [a for a in server(pod)["args"] if not a.startswith(f"--{name}=")
                and a != f"--{name}"]
        server(pod)["args"] = args + ([f"--{name}={value}"] if value is not None else [])

    def volume(pod, name):
        return next(v for v in pod["volumes"] if v["name"] == name)

    mutations = {
        "gpu-once": lambda p: p["initContainers"][0]["resources"]["limits"].update({GPU: 1}),
        "host-ipc": lambda p: p.update(hostIPC=True),
        "probes": lambda p: server(p).pop("startupProbe"),
        "resources": lambda p: server(p)["resources"]["limits"].pop("memory"),
        "non-root": lambda p: server(p)["securityContext"].pop("runAsNonRoot"),
        "hardening": lambda p: server(p)["securityContext"].pop("readOnlyRootFilesystem"),
        "capabilities": lambda p: server(p)["securityContext"]["capabilities"].update(
            add=["SYS_NICE"]),
        "state-dir": lambda p: p.pop("initContainers"),
        "tolerations": lambda p: p.pop("tolerations"),
        "tls": lambda p: set_arg(p, "tls_key", None),
        "dev-shm": lambda p: volume(p, "shm")["emptyDir"].pop("sizeLimit"),
        "mps-pipe": lambda p: volume(p, "mps").update(
            hostPath={"path": "/run/tessera-mps"}) or volume(p, "mps").pop("emptyDir"),
        "metrics": lambda p: set_arg(p, "metrics_listen", "0.0.0.0:9999"),
        "metrics-auth": lambda p: set_arg(p, "metrics_token_file", None),
        "unix-socket": lambda p: set_arg(p, "unix_socket", "/tmp/tessera.sock"),
    }
    # The device plugin's MPS: the plugin mounts /dev/shm and injects the pipe directory.
    plugin_mutations = {
        "dev-shm": lambda p: server(p)["volumeMounts"].append(
            {"name": "tmp", "mountPath": "/dev/shm"}),
        "mps-pipe": lambda p: server(p).setdefault("env", []).append(
            {"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/run/nvidia-mps"}),
    }
    fleet_mutations = {
        "fleet": lambda p: set_arg(p, "node_name", "gpu-node-1"),
    }
    failures = runs = 0
    for file, cases in (("daemonset.yaml", mutations),
                        ("daemonset-device-plugin-mps.yaml", plugin_mutations),
                        ("fleet/daemonset.yaml", fleet_mutations)):
        with open(os.path.join(directory, file)) as f:
            original = next(d for d in yaml.safe_load_all(f)
                            if d and d.get("kind") == "DaemonSet")
        for prop, mutate in cases.items():
            ds = copy.deepcopy(original)
            mutate(ds["spec"]["template"]["spec"])
            report = Report()
            check_daemonset(file, ds, report)
            runs += 1
            if prop not in report.properties:
                print(f"self-test: {file} with {prop} broken: not reported "
                      f"(got {report.properties})", file=sys.stderr)
                failures += 1
        report = Report()
        check_daemonset(file, copy.deepcopy(original), report)
        if report.errors:
            print(f"self-test: {file} unchanged fails: {report.errors}", file=sys.stderr)
            failures += 1
    print(f"self-test: {runs} broken manifests, each reported with the property broken: "
          f"{'ok' if failures == 0 else 'FAILED'}")
    return 1 if failures else 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--self-test":
        return self_test(sys.argv[2])
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print("usage: check_manifests.py DIRECTORY | --self-test DIRECTORY", file=sys.stderr)
        return 2
    report = Report()
    docs = []
    for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.yaml"))):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc is None:
                    continue
                for field in ("apiVersion", "kind"):
                    if field not in doc:
                        report.fail(path, "object", f"an object has no {field}")
                if not (doc.get("metadata") or {}).get("name"):
                    report.fail(path, "object", f"a {doc.get('kind')} has no metadata.name")
                docs.append((path, doc))
    daemonsets = [(p, d) for p, d in docs if d.get("kind") == "DaemonSet"]
    if not daemonsets:
        report.fail(sys.argv[1], "object", "no DaemonSet")
    for path, ds in daemonsets:
        check_daemonset(path, ds, report)

    for e in report.errors:
        print(e, file=sys.stderr)
    print(f"checked {len(docs)} object(s), {len(daemonsets)} DaemonSet(s): "
          f"{'FAILED' if report.errors else 'ok'}")
    if report.errors:
        print(f"failed properties: {','.join(report.properties)}")
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
