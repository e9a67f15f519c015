"""The client against servers started for one test: TLS, mutual TLS, and a job that fails on
the CUDA module (the fake driver, where ctest provides it)."""
from __future__ import annotations

import os
import subprocess
import tempfile
from typing import Iterator

import numpy as np
import pytest

import tessera
from conftest import FAKE_CUDA_DIR, Server

CERTS_SCRIPT = r"""set -e
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
key ca.key
openssl req -x509 -new -key ca.key -out ca.pem -days 1 -subj /CN=tessera-test-ca
key server.key
openssl req -new -key server.key -out server.csr -subj /CN=localhost
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
  -extfile server.ext -out server.pem 2>/dev/null
key client.key
openssl req -new -key client.key -out client.csr -subj /CN=tessera-test-client
printf 'extendedKeyUsage=clientAuth\n' > client.ext
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
  -extfile client.ext -out client.pem 2>/dev/null
"""


@pytest.fixture(scope="module")
def certs() -> Iterator[str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate (openssl CLI)."""
    with tempfile.TemporaryDirectory(prefix="tessera-py-certs-") as d:
        subprocess.run(["/bin/sh", "-c", CERTS_SCRIPT], cwd=d, check=True)
        yield d


def read(d: str, name: str) -> bytes:
    with open(os.path.join(d, name), "rb") as f:
        return f.read()


def test_tls(certs: str) -> None:
    server = Server(args=[f"--tls_cert={certs}/server.pem", f"--tls_key={certs}/server.key"])
    try:
        ca = read(certs, "ca.pem")
        with tessera.Admin(server.addr, token=server.admin_token, tls=True,
                           root_certificates=ca) as admin:
            assert admin.server_info().version
            _, key = admin.register("tls-tenant", memory_bytes=16 << 20)
        with tessera.Client(server.addr, token=key, root_certificates=ca) as client:
            np.testing.assert_array_equal(client.put(np.arange(5, dtype=np.int32)).numpy(),
                                          np.arange(5, dtype=np.int32))
        # Plaintext against a TLS port, and TLS trusting the system roots only, do not connect.
        with tessera.Admin(server.addr, token=server.admin_token, timeout=5) as plain:
            with pytest.raises(tessera.Unavailable):
                plain.server_info()
        with tessera.Admin(server.addr, token=server.admin_token, tls=True, timeout=5) as wrong:
            with pytest.raises(tessera.Unavailable):
                wrong.server_info()
    finally:
        server.stop()


def test_mutual_tls(certs: str) -> None:
    server = Server(args=[f"--tls_cert={certs}/server.pem", f"--tls_key={certs}/server.key",
                          f"--tls_client_ca={certs}/ca.pem"])
    try:
        ca = read(certs, "ca.pem")
        with tessera.Admin(server.addr, token=server.admin_token, root_certificates=ca,
                           certificate_chain=read(certs, "client.pem"),
                           private_key=read(certs, "client.key")) as admin:
            assert admin.server_info().version
        # Without a client certificate the handshake fails.
        with tessera.Admin(server.addr, token=server.admin_token, root_certificates=ca,
                           timeout=5) as anonymous:
            with pytest.raises(tessera.Unavailable):
                anonymous.server_info()
    finally:
        server.stop()


@pytest.mark.skipif(not FAKE_CUDA_DIR, reason="the CUDA module and fake driver are not built "
                    "(TESSERA_FAKE_CUDA_DIR unset)")
def test_job_failed_on_the_wire() -> None:
    # The CUDA module on the fake driver with a kernel compiler that cannot run: a tenant's own
    # kernel cannot be built, so the step that uses it fails at run time and the job ends
    # FAILED after the steps before it ran.
    server = Server(backend="cuda", env={"TESSERA_KERNEL_COMPILER": "/nonexistent/compiler"})
    try:
        with tessera.Admin(server.addr, token=server.admin_token) as admin:
            assert admin.server_info().backend == "cuda"
            _, key = admin.register("failing", memory_bytes=64 << 20)
        with tessera.Client(server.addr, token=key) as client:
            client.define_kernel("kernel twice(x: f32) -> (y: f32)\n{\n  y = 2.0 * x\n}\n")
            x = client.put(np.arange(4, dtype=np.float32))
            with pytest.raises(tessera.JobFailed) as failed:
                client.run("twice", x)
            assert failed.value.step == 0 and failed.value.job_id
            assert "compiler" in failed.value.message
            with pytest.raises(tessera.JobFailed) as later:
                with client.program() as p:
                    y = p.add("neg", x)
                    p.add("twice", y)
            assert later.value.step == 1, later.value.message
            np.testing.assert_array_equal(y.numpy(), -np.arange(4, dtype=np.float32))
            # A catalog kernel still runs.
            np.testing.assert_array_equal(client.run("neg", x).numpy(),
                                          -np.arange(4, dtype=np.float32))
    finally:
        server.stop()
