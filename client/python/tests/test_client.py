"""The Python client against a real tessera-server (see conftest.py)."""
from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

import tessera
from tessera._proto import compute_pb2
from conftest import TRANSPORTS, run_in_threads

# The tests of moving tensors run over TCP and the Unix socket, with and without a region.
every_transport = pytest.mark.parametrize("client", TRANSPORTS, indirect=True)

DTYPES = [np.float32, np.float16, np.float64, np.int32, np.int64, np.uint8, np.bool_]


@every_transport
@pytest.mark.parametrize("dtype", DTYPES)
def test_put_numpy_round_trip(client: tessera.Client, dtype: type) -> None:
    a = (np.arange(24).reshape(2, 3, 4) % 7).astype(dtype)
    t = client.put(a)
    assert t.shape == (2, 3, 4)
    b = t.numpy()
    assert b.dtype == a.dtype and b.shape == a.shape
    np.testing.assert_array_equal(a, b)


@every_transport
def test_f16_values(client: tessera.Client) -> None:
    a = np.array([0.5, -2.25, 65504.0, 1e-4, np.inf], np.float16)
    t = client.put(a)
    assert t.dtype == "f16"
    np.testing.assert_array_equal(t.numpy(), a)


@every_transport
def test_bf16_round_trip_and_compute(client: tessera.Client) -> None:
    f = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
    bits = (f.view(np.uint32) >> 16).astype(np.uint16)  # exact: these values fit in bf16
    t = client.put(bits, dtype="bf16")
    assert t.dtype == "bf16" and t.shape == (4,)
    np.testing.assert_array_equal(t.numpy(), bits)
    doubled = client.run("add", t, t).numpy()
    assert doubled.dtype == np.uint16
    back = (doubled.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(back, 2 * f)
    with pytest.raises(tessera.InvalidArgument):
        client.put(f, dtype="bf16")


@every_transport
def test_scalar_and_empty(client: tessera.Client) -> None:
    scalar = client.put(np.float32(3.5))  # a 0-d array stays one: shape []
    assert scalar.shape == () and scalar.numpy().shape == () and scalar.numpy() == 3.5
    assert client.put(np.zeros((0, 4), np.float32)).numpy().shape == (0, 4)


@every_transport
def test_non_contiguous_and_big_endian(client: tessera.Client) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4).T
    np.testing.assert_array_equal(client.put(a).numpy(), a)
    b = np.arange(5, dtype=">i4")
    np.testing.assert_array_equal(client.put(b).numpy(), b)


@every_transport
def test_unsupported_dtype(client: tessera.Client) -> None:
    with pytest.raises(tessera.InvalidArgument):
        client.put(np.zeros(3, np.complex64))


def test_chunked_upload_with_progress(client: tessera.Client) -> None:
    a = np.random.default_rng(1).standard_normal(300_000).astype(np.float32)
    seen: list = []
    t = client.put(a, chunk_bytes=64 << 10, progress=lambda done, total: seen.append(done))
    assert seen[-1] == a.nbytes and len(seen) == -(-a.nbytes // (64 << 10))
    down: list = []
    np.testing.assert_array_equal(t.numpy(progress=lambda d, n: down.append((d, n))), a)
    assert down[-1] == (a.nbytes, a.nbytes)


def test_downloads_on_several_threads_and_one_stopped_early(client: tessera.Client) -> None:
    # ReadTensor's messages are received on the thread that asks for them (the channel's
    # SingleThreadedUnaryStream option): downloads on several threads at once each get their
    # own bytes, a download its progress callback stops leaves the client usable, and one
    # past its deadline fails with DeadlineExceeded.
    arrays = [np.random.default_rng(seed).standard_normal(600_000).astype(np.float32)
              for seed in range(4)]
    tensors = [client.put(a) for a in arrays]

    def download(i: int) -> None:
        for _ in range(5):
            np.testing.assert_array_equal(tensors[i].numpy(), arrays[i])

    run_in_threads(download, 4)

    class Stop(Exception):
        pass

    def stop_after_first(done: int, total: int) -> None:
        raise Stop(f"{done} of {total}")

    with pytest.raises(Stop):
        tensors[0].numpy(progress=stop_after_first)
    np.testing.assert_array_equal(tensors[0].numpy(), arrays[0])
    saved, client.timeout = client.timeout, 1e-6
    with pytest.raises(tessera.DeadlineExceeded):
        tensors[1].numpy()
    client.timeout = saved
    np.testing.assert_array_equal(tensors[1].numpy(), arrays[1])


@pytest.mark.parametrize("big_client", TRANSPORTS, indirect=True)
def test_256mib_round_trip(big_client: tessera.Client) -> None:
    a = np.arange(64 << 20, dtype=np.float32)  # 256 MiB
    start = time.monotonic()
    t = big_client.put(a)
    b = t.numpy()
    elapsed = time.monotonic() - start
    assert t.size_bytes == 256 << 20
    np.testing.assert_array_equal(a, b)
    assert elapsed < 120, elapsed
    assert t.delete() == 256 << 20


@every_transport
def test_tensor_lookup_list_delete(client: tessera.Client) -> None:
    t = client.put(np.ones((2, 2), np.float32))
    same = client.tensor(t.handle)
    assert same.shape == (2, 2) and same.dtype == "f32" and same.size_bytes == 16
    assert t.handle in [x.handle for x in client.tensors()]
    assert t.refresh().shape == (2, 2)
    assert t.delete() == 16
    with pytest.raises(tessera.NotFound) as e:
        client.tensor(t.handle)
    assert e.value.code == grpc.StatusCode.NOT_FOUND and e.value.message
    with pytest.raises(tessera.NotFound):
        t.numpy()


def test_kernels(client: tessera.Client) -> None:
    kernels = {k.name: k for k in client.kernels()}
    mm = kernels["matmul"]
    assert mm.inputs == ["a", "b"] and "transpose_b" in mm.attrs
    assert mm.signature.startswith("matmul(a: f32") and not mm.tenant_defined


def test_run_matmul_with_attrs(client: tessera.Client) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 3)).astype(np.float32)
    b = rng.standard_normal((5, 3)).astype(np.float32)
    ta, tb = client.put(a), client.put(b)
    c = client.run("matmul", ta, tb, transpose_b=True, alpha=2.0)
    assert isinstance(c, tessera.Tensor) and c.shape == (4, 5)
    np.testing.assert_allclose(c.numpy(), 2.0 * a @ b.T, rtol=1e-5, atol=1e-5)
    s = client.run("sum", client.put(np.arange(6, dtype=np.int64).reshape(2, 3)),
                   axes=[1], keepdims=False)
    np.testing.assert_array_equal(s.numpy(), [3, 12])
    f = client.run("fill", value=1.5, dtype="f16", shape=[2, 2])
    np.testing.assert_array_equal(f.numpy(), np.full((2, 2), 1.5, np.float16))


def test_launch_wait_cancel_synchronize(client: tessera.Client) -> None:
    x = client.put(np.arange(4, dtype=np.float32))
    job = client.launch("relu", x)
    assert job.id
    job.wait(timeout=30)
    assert job.state == "SUCCEEDED" and job.done
    np.testing.assert_array_equal(job.outputs[0].numpy(), [0, 1, 2, 3])
    assert job.cancel().state == "SUCCEEDED"  # finished jobs stay finished
    client.launch("neg", x)
    assert client.synchronize(timeout=30) >= 0
    assert client.synchronize(stream=0, timeout=30) >= 0


def test_program(client: tessera.Client) -> None:
    a = client.put(np.array([[1.0, -2.0], [3.0, -4.0]], np.float32))
    with client.program() as p:
        c = p.add("matmul", a, a)
        d = p.add("relu", c)
        e = p.add("neg", d)
    assert p.job is not None and p.job.state == "SUCCEEDED"
    m = np.array([[1.0, -2.0], [3.0, -4.0]], np.float32)
    np.testing.assert_array_equal(d.numpy(), np.maximum(m @ m, 0))
    np.testing.assert_array_equal(e.tensor().numpy(), -np.maximum(m @ m, 0))
    assert len(p.job.outputs) == 3
    with pytest.raises(tessera.InvalidArgument) as err:
        with client.program() as q:
            q.add("add", a, client.put(np.ones(3, np.float32)))
    assert "broadcast" in err.value.message


def test_define_and_delete_kernel(client: tessera.Client) -> None:
    k = client.define_kernel("kernel twice(x: f32) -> (y: f32)\n{\n  y = 2.0 * x\n}\n")
    assert k.name == "twice" and k.tenant_defined and "twice" in k.source
    assert "twice" in [x.name for x in client.kernels()]
    y = client.run("twice", client.put(np.array([1.0, 2.5], np.float32)))
    np.testing.assert_array_equal(y.numpy(), [2.0, 5.0])
    with pytest.raises(tessera.AlreadyExists):
        client.define_kernel("kernel twice(x: f32) -> (y: f32)\n{\n  y = x\n}\n")
    with pytest.raises(tessera.InvalidArgument):
        client.define_kernel("kernel broken(x: f32) -> (y: f32)\n{\n  y = x +\n}\n")
    client.delete_kernel("twice")
    with pytest.raises(tessera.NotFound):
        client.delete_kernel("twice")
    with pytest.raises(tessera.NotFound):
        client.run("twice", client.put(np.ones(1, np.float32)))


def test_usage(client: tessera.Client) -> None:
    client.put(np.ones(256, np.float32))
    u = client.usage()
    assert u.tensors >= 1 and u.memory_tensor_bytes >= 1024
    assert u.memory_quota_bytes == 256 << 20


def test_errors_map_codes(server, client: tessera.Client) -> None:
    with pytest.raises(tessera.QuotaExceeded) as e:
        client.run("fill", value=0.0, dtype="f32", shape=[1 << 28])
    assert "quota" in e.value.message and e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(tessera.InvalidArgument):
        client.run("matmul", client.put(np.ones((2, 3), np.float32)),
                   client.put(np.ones((2, 3), np.float32)))
    with pytest.raises(tessera.NotFound):
        client.run("no_such_kernel")
    with tessera.Client(server.addr, token="tsk_nobody.bad") as bad:
        with pytest.raises(tessera.Unauthenticated):
            bad.kernels()
    with tessera.Client(server.addr, token=server.admin_token) as wrong:
        with pytest.raises(tessera.PermissionDenied):
            wrong.kernels()
    with tessera.Client("127.0.0.1:1", token="x", timeout=5) as down:
        with pytest.raises((tessera.Unavailable, tessera.DeadlineExceeded)):
            down.kernels()
    # Every error is a TesseraError.
    assert issubclass(tessera.QuotaExceeded, tessera.TesseraError)


def test_request_quotas_and_the_retry_hint(server, admin: tessera.Admin) -> None:
    tenant, key = admin.register("rate-1", memory_bytes=1 << 20, max_requests_in_flight=1,
                                 requests_per_second=5)
    assert tenant.quota.max_requests_in_flight == 1 and tenant.quota.requests_per_second == 5
    with tessera.Client(server.addr, token=key) as c:
        c.usage()  # the bucket's one call
        with pytest.raises(tessera.QuotaExceeded) as e:
            c.usage()
        assert "quota.requests_per_second" in e.value.message
        assert e.value.retry_after is not None and 0 < e.value.retry_after <= 0.2
        time.sleep(e.value.retry_after + 0.02)
        usage = c.usage()
        assert usage.requests_in_flight == 1  # this call
        assert usage.requests_refused_rate == 1 and usage.requests_refused_in_flight == 0
    admin.deregister("rate-1")


def test_job_failed_carries_step_and_message(client: tessera.Client) -> None:
    # The CPU backend has no kernel that fails at run time on demand; check the mapping
    # of a FAILED job as the server reports it.
    proto = compute_pb2.Job(job_id="j1", state=compute_pb2.JOB_STATE_FAILED, error_code=13,
                            error_message="step 2 (matmul): device fault")
    with pytest.raises(tessera.JobFailed) as e:
        tessera.Job(client, proto).check()
    assert e.value.step == 2 and e.value.job_id == "j1"
    assert "device fault" in e.value.message and e.value.code == grpc.StatusCode.INTERNAL
    cancelled = compute_pb2.Job(job_id="j2", state=compute_pb2.JOB_STATE_CANCELLED,
                                error_code=4, error_message="deadline passed while queued")
    with pytest.raises(tessera.DeadlineExceeded):
        tessera.Job(client, cancelled).check()


def test_env_defaults(server, tenant, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_ADDR", server.addr)
    monkeypatch.setenv("TESSERA_TOKEN", tenant[1])
    with tessera.Client() as c:
        assert c.addr == server.addr
        assert c.kernels()


def test_tenants_isolated(server, admin: tessera.Admin) -> None:
    _, key_a = admin.register("iso-a", memory_bytes=1 << 20)
    _, key_b = admin.register("iso-b", memory_bytes=1 << 20)
    try:
        with tessera.Client(server.addr, token=key_a) as a, \
                tessera.Client(server.addr, token=key_b) as b:
            t = a.put(np.ones(4, np.float32))
            with pytest.raises(tessera.NotFound):
                b.tensor(t.handle)
            with pytest.raises(tessera.NotFound):
                b._read(t.handle, None)
            with pytest.raises(tessera.NotFound):
                b.run("relu", t.handle)
            assert b.tensors() == []
            a.define_kernel("kernel mine(x: f32) -> (y: f32)\n{\n  y = x\n}\n")
            assert "mine" not in [k.name for k in b.kernels()]
    finally:
        admin.deregister("iso-a")
        admin.deregister("iso-b")


def test_admin_calls(server, admin: tessera.Admin) -> None:
    tenant, key = admin.register("adm-1", memory_bytes=1 << 20, display_name="Team",
                                 labels={"env": "test"}, max_streams=2)
    assert key.startswith("tsk_adm-1.") and tenant.quota.max_streams == 2
    assert admin.get("adm-1").display_name == "Team"
    assert "adm-1" in [t.tenant_id for t in admin.list()]
    updated = admin.update("adm-1", display_name="Team B", labels={"env": "prod"})
    assert updated.display_name == "Team B" and updated.labels["env"] == "prod"
    new_key = admin.rotate_key("adm-1")
    assert new_key != key
    with tessera.Client(server.addr, token=key) as old:
        with pytest.raises(tessera.Unauthenticated):
            old.kernels()
    with tessera.Client(server.addr, token=new_key) as new:
        assert new.kernels()
    info = admin.server_info()
    assert info.backend == "cpu" and info.tenant_count >= 1
    assert admin.mps_status() is not None
    assert admin.terminate_work("adm-1") == 0
    with pytest.raises(tessera.AlreadyExists):
        admin.register("adm-1", memory_bytes=1 << 20)
    with pytest.raises(tessera.InvalidArgument):
        admin.register("Bad_Id", memory_bytes=1 << 20)
    assert admin.deregister("adm-1") == 1 << 20
    with pytest.raises(tessera.NotFound):
        admin.get("adm-1")
    with tessera.Admin(server.addr, token="wrong") as bad:
        with pytest.raises(tessera.Unauthenticated):
            bad.list()


def test_launch_options_and_step_refs(client: tessera.Client) -> None:
    x = client.put(np.array([-1.0, 2.0], np.float32))
    job = client.launch("relu", x, stream=0, queue_timeout=30.0, timeout=30)
    assert job.wait(timeout=30).state == "SUCCEEDED"
    with client.program(timeout=30) as p:
        r = p.add("relu", x.handle)
        s = p.add("add", r[0], x)
    np.testing.assert_array_equal(s.numpy(), [-1.0, 4.0])
    np.testing.assert_array_equal(r.tensor().numpy(), [0.0, 2.0])
    with pytest.raises(tessera.InvalidArgument):
        client.run("relu", np.ones(2, np.float32))  # arrays must be put first
