"""Fixtures: a real tessera-server on loopback with a temporary state directory."""
from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import pytest

import tessera

SERVER = os.environ.get("TESSERA_SERVER_BINARY") or os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "build", "server", "tessera-server")


# The fake CUDA driver's directory (tests/fake_cuda/driver), set by ctest when the CUDA module
# is built: a server started with backend="cuda" runs the module's real code on it.
FAKE_CUDA_DIR = os.environ.get("TESSERA_FAKE_CUDA_DIR", "")


class Server:
    """A tessera-server on 127.0.0.1 (a free port) with a temporary state directory; with
    ``unix_socket``, also on ``<state_dir>/t.sock`` (``unix_path``, ``unix_addr``; under /tmp
    when that path would be too long for a socket), whose descriptor socket
    ``unix_path + ".regions"`` takes shared-memory regions."""

    def __init__(self, backend: str = "cpu", args: Optional[List[str]] = None,
                 env: Optional[Dict[str, str]] = None, unix_socket: bool = False) -> None:
        if not os.access(SERVER, os.X_OK):
            raise RuntimeError(f"tessera-server not found at {SERVER} "
                               "(set TESSERA_SERVER_BINARY)")
        self.state_dir = tempfile.mkdtemp(prefix="tessera-py-")
        self.log_path = os.path.join(self.state_dir, "server.log")
        self._log = open(self.log_path, "w+")
        argv = [SERVER, "--listen=127.0.0.1:0", f"--state_dir={self.state_dir}"]
        self.unix_path = self.unix_addr = ""
        self._socket_dir = ""
        if unix_socket:
            self.unix_path = os.path.join(self.state_dir, "t.sock")
            if len(self.unix_path) + len(".regions") >= 108:  # sockaddr_un.sun_path
                self._socket_dir = tempfile.mkdtemp(prefix="tpy-", dir="/tmp")
                self.unix_path = os.path.join(self._socket_dir, "t.sock")
            self.unix_addr = "unix:" + self.unix_path
            argv.append(f"--unix_socket={self.unix_path}")
        server_env = dict(os.environ)
        if backend == "cuda":
            argv += ["--backend=cuda", "--mps=off"]
            server_env["LD_LIBRARY_PATH"] = FAKE_CUDA_DIR
        else:
            argv += ["--backend=cpu", "--cpu_memory_bytes=2GiB"]
        server_env.update(env or {})
        self.proc = subprocess.Popen(argv + (args or []), env=server_env,
                                     stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        self.addr = ""
        while time.monotonic() < deadline:
            with open(self.log_path) as f:
                m = re.search(r"listening on (\S+)", f.read())
            if m:
                self.addr = m.group(1)
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if not self.addr:
            self.stop()
            with open(self.log_path) as f:
                raise RuntimeError("tessera-server did not start:\n" + f.read())
        if server_env.get("TESSERA_ADMIN_TOKEN"):
            self.admin_token = server_env["TESSERA_ADMIN_TOKEN"]
        else:
            with open(os.path.join(self.state_dir, "admin.token")) as f:
                self.admin_token = f.read().strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        if self._socket_dir:
            shutil.rmtree(self._socket_dir, ignore_errors=True)


ETCD = os.environ.get("TESSERA_ETCD", "/usr/bin/etcd")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, below the kernel's ephemeral
    range when there is room: outgoing connections take their ports from that range, so one
    found free there can be taken before the server binds it (tests/testing/server_process.cc,
    FreePort)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    candidates = [random.randrange(10000, ephemeral_low) for _ in range(100)] \
        if ephemeral_low - 10000 >= 1000 else []
    for port in candidates + [0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError("no free loopback port")


def start_etcd(data_dir: str) -> Tuple[subprocess.Popen, str]:
    """Debian's etcd, one member on loopback ports with its data under ``data_dir``, once it
    accepts connections: (process, client URL for --fleet_etcd)."""
    if not os.access(ETCD, os.X_OK):
        raise RuntimeError(f"etcd not found at {ETCD}: install etcd-server "
                           "(deploy/install-deps.sh)")
    client, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [ETCD, "--name=test", f"--data-dir={data_dir}/etcd", f"--listen-client-urls={client}",
         f"--advertise-client-urls={client}", f"--listen-peer-urls={peer}",
         f"--initial-advertise-peer-urls={peer}", f"--initial-cluster=test={peer}",
         "--log-level=error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    host, port = client[len("http://"):].split(":")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, client


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    s = Server(unix_socket=True)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def admin(server: Server) -> Iterator[tessera.Admin]:
    with tessera.Admin(server.addr, token=server.admin_token) as a:
        yield a


def _tenant(admin: tessera.Admin, memory: int) -> Tuple[str, str]:
    tenant_id = "t-" + uuid.uuid4().hex[:10]
    _, key = admin.register(tenant_id, memory_bytes=memory)
    return tenant_id, key


@pytest.fixture
def tenant(admin: tessera.Admin) -> Iterator[Tuple[str, str]]:
    """A fresh tenant with 256 MiB; (tenant_id, api_key)."""
    tenant_id, key = _tenant(admin, 256 << 20)
    yield tenant_id, key
    admin.deregister(tenant_id)


#: The ways a Client moves tensors: TCP (through tessera._native, and through grpcio), and the
#: Unix socket with and without a region.
TRANSPORTS = ["tcp", "tcp-grpcio", "unix-region", "unix-stream"]


def run_in_threads(work: Callable[[int], None], count: int, timeout: float = 120) -> None:
    """Runs ``work(0)`` .. ``work(count - 1)`` on a thread each, at once, and fails with
    whatever they raised."""
    failures: List[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as e:  # noqa: BLE001  (reported below)
            failures.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not failures, failures


def connect(server: Server, key: str, transport: str = "tcp") -> tessera.Client:
    if transport in ("tcp", "tcp-grpcio"):
        return tessera.Client(server.addr, token=key, native=None if transport == "tcp" else False)
    return tessera.Client(server.unix_addr, token=key, regions=transport == "unix-region")


@pytest.fixture
def client(request: pytest.FixtureRequest, server: Server,
           tenant: Tuple[str, str]) -> Iterator[tessera.Client]:
    """The tenant's Client over TCP, or over the transport a test parametrizes it with
    (``@pytest.mark.parametrize("client", TRANSPORTS, indirect=True)``)."""
    with connect(server, tenant[1], getattr(request, "param", "tcp")) as c:
        yield c


@pytest.fixture
def big_client(request: pytest.FixtureRequest, server: Server,
               admin: tessera.Admin) -> Iterator[tessera.Client]:
    """A tenant with 1 GiB, for the 256 MiB round trip (TCP, or as parametrized)."""
    tenant_id, key = _tenant(admin, 1 << 30)
    with connect(server, key, getattr(request, "param", "tcp")) as c:
        yield c
    admin.deregister(tenant_id)
