"""Client and Admin: the Compute and TenantAdmin services with numpy interop."""
from __future__ import annotations

import os
import queue
import re
import threading
import weakref
from typing import (Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple,
                    TypeVar, Union)

import grpc
import grpc.experimental
import numpy as np
from google.protobuf import duration_pb2, field_mask_pb2

from . import _buffers, _regions, errors
from ._proto import compute_pb2 as pb
from ._proto import compute_pb2_grpc
from ._proto import tenant_admin_pb2 as apb
from ._proto import tenant_admin_pb2_grpc

try:  # the C++ client library's transfers (native.cc), built with the package's stubs
    from . import _native
except ImportError:
    _native = None  # type: ignore[assignment]

DEFAULT_ADDR = "127.0.0.1:50051"
#: The server's default --max_message_bytes; chunks stay well below it.
MAX_MESSAGE_BYTES = 64 << 20
#: put's WriteTensor chunk size. With chunks written ahead (_write_requests), 2-3 MiB upload
#: 256 MiB faster than 4 MiB (whose copies leave the CPU's caches) and than 1 MiB (whose
#: per-message thread hand-offs in grpcio cost more than they save); docs/python.md.
DEFAULT_CHUNK_BYTES = 2 << 20
# The largest inline CreateTensor the server accepts (larger: WriteTensor).
CREATE_TENSOR_MAX_BYTES = 16 << 20
#: ReadTensor's chunk_bytes. grpcio (1.51) copies each message it receives three times
#: (slices into a growing bytearray, then into bytes) before _read copies it into the array;
#: at 1 MiB those intermediate copies stay in the CPU's cache, at 4 MiB they go to memory:
#: a 256 MiB download takes about a fifth less CPU time (docs/python.md, "Bulk transfers").
READ_CHUNK_BYTES = 1 << 20
#: Set to 0, Clients made with ``native=None`` stream through grpcio even where tessera._native
#: is built (docs/python.md, "Bulk transfers").
ENV_NATIVE = "TESSERA_PY_NATIVE"
#: How long close() (or the finalizer of a client never closed) waits to unregister regions.
REGION_CLOSE_TIMEOUT_S = 10.0


def _varint(raw: bytes, pos: int) -> Tuple[int, int]:
    """A protobuf varint at ``raw[pos:]``: (value, position after it)."""
    value = shift = 0
    while True:
        if pos >= len(raw):
            raise errors.DataLoss("a ReadTensor message ends inside a varint")
        b = raw[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _fields(raw: bytes, pos: int, end: int) -> Iterator[Tuple[int, int, int, int]]:
    """The fields of the message in ``raw[pos:end]``: (number, wire type, value or start,
    end of a length-delimited value)."""
    while pos < end:
        key, pos = _varint(raw, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(raw, pos)
            yield number, wire, value, pos
        elif wire == 2:
            length, pos = _varint(raw, pos)
            if pos + length > end:
                raise errors.DataLoss("a ReadTensor message's field runs past its end")
            yield number, wire, pos, pos + length
            pos += length
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise errors.DataLoss(f"a ReadTensor message has a field of wire type {wire}")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _write_chunk(offset: int, data: memoryview) -> bytes:
    """WriteTensorRequest{chunk: Chunk{offset, data}} in protobuf's wire format, the data
    copied once (field numbers from proto/tessera/v1/compute.proto)."""
    # As protobuf writes it: proto3 leaves out fields that hold their default.
    inner_head = (b"\x08" + _encode_varint(offset) if offset else b"") + (
        b"\x12" + _encode_varint(len(data)) if len(data) else b"")
    return b"".join((b"\x12", _encode_varint(len(inner_head) + len(data)), inner_head, data))


def _write_requests(header: bytes, data: memoryview, chunk_bytes: int,
                    progress: Optional[Progress]) -> Iterator[bytes]:
    """WriteTensor's request messages: ``header``, then ``data`` in chunks of ``chunk_bytes``,
    each written (_write_chunk) by a thread of its own one chunk ahead of the one gRPC sends.

    grpcio asks for the next message only once it has sent the last, so a chunk written when
    asked for is a copy on the upload's critical path; written ahead, it overlaps the sending
    of the one before (docs/python.md, "Bulk transfers"). ``progress(done, total)`` is called
    as the message after each chunk is asked for, i.e. once the chunk is sent.
    """
    total = len(data)
    # One written chunk waits while gRPC sends the one before and the thread writes the next.
    ready: "queue.Queue[Any]" = queue.Queue(maxsize=1)
    stop = threading.Event()

    def write_ahead() -> None:
        try:
            for offset in range(0, total, chunk_bytes):
                message = _write_chunk(offset, data[offset:offset + chunk_bytes])
                if stop.is_set():
                    return
                ready.put(message)
        except BaseException as e:  # handed to the consumer, which raises it
            ready.put(e)

    yield header
    writer = threading.Thread(target=write_ahead, name="tessera-write-ahead", daemon=True)
    writer.start()
    try:
        for offset in range(0, total, chunk_bytes):
            message = ready.get()
            if isinstance(message, BaseException):
                raise message
            yield message
            if progress:
                progress(min(offset + chunk_bytes, total), total)
    finally:
        # The call ended early (an error, a redirect) or is done: a thread blocked on a full
        # queue takes this get as room for its last put, then sees `stop` and returns.
        stop.set()
        try:
            ready.get_nowait()
        except queue.Empty:
            pass


def _read_tensor_response(raw: bytes) -> Tuple[Optional[pb.TensorInfo], int, memoryview]:
    """A ReadTensorResponse's info (None when absent), chunk offset and chunk data, the data a
    view of ``raw`` (no copy)."""
    view = memoryview(raw)
    info: Optional[pb.TensorInfo] = None
    offset, data = 0, view[0:0]
    for number, wire, start, end in _fields(raw, 0, len(raw)):
        if number == 1 and wire == 2:
            info = pb.TensorInfo.FromString(raw[start:end])
        elif number == 2 and wire == 2:
            for inner, inner_wire, value, inner_end in _fields(raw, start, end):
                if inner == 1 and inner_wire == 0:
                    offset = value
                elif inner == 2 and inner_wire == 2:
                    data = view[value:inner_end]
    return info, offset, data

Progress = Callable[[int, int], None]
"""A progress callback: ``progress(bytes_done, bytes_total)``."""

_DTYPES: Dict[str, Tuple[int, np.dtype]] = {
    "f32": (pb.DTYPE_F32, np.dtype("<f4")),
    "f16": (pb.DTYPE_F16, np.dtype("<f2")),
    "bf16": (pb.DTYPE_BF16, np.dtype("<u2")),
    "f64": (pb.DTYPE_F64, np.dtype("<f8")),
    "i32": (pb.DTYPE_I32, np.dtype("<i4")),
    "i64": (pb.DTYPE_I64, np.dtype("<i8")),
    "u8": (pb.DTYPE_U8, np.dtype("u1")),
    "bool": (pb.DTYPE_BOOL, np.dtype("?")),
}
_BY_ENUM = {enum: (name, dt) for name, (enum, dt) in _DTYPES.items()}
_BY_NUMPY = {np.dtype(dt).newbyteorder("=") if dt.byteorder == "<" else dt: name
             for name, (_, dt) in _DTYPES.items() if name != "bf16"}


def _dtype_name(array: np.ndarray, dtype: Optional[str]) -> str:
    if dtype is not None:
        if dtype not in _DTYPES:
            raise errors.InvalidArgument(
                f"unknown dtype {dtype!r}; one of {', '.join(_DTYPES)}")
        if dtype == "bf16" and array.dtype.itemsize != 2:
            raise errors.InvalidArgument(
                "bf16 takes a 2-byte array (the bf16 bits as uint16, or an ml_dtypes "
                f"bfloat16 array), not {array.dtype}")
        return dtype
    name = _BY_NUMPY.get(array.dtype.newbyteorder("="))
    if name is None:
        raise errors.InvalidArgument(
            f"numpy dtype {array.dtype} has no Tessera dtype; pass dtype= or convert "
            f"(supported: {', '.join(_DTYPES)})")
    return name


_malloc_tuned = False


def _keep_transfer_buffers_mapped() -> None:
    """Once per process, on glibc: keep freed multi-MiB blocks (each chunk gRPC hands over)
    in the heap instead of returning them to the system, so that the next chunk does not
    page-fault its memory in again. Measured on a 256 MiB download: 0.6x of the C++ client
    before, 0.8-0.9x after. Costs up to 128 MiB of freed heap kept by the process; set
    TESSERA_PY_MALLOPT=0 to leave malloc as it is."""
    global _malloc_tuned
    if _malloc_tuned or os.environ.get("TESSERA_PY_MALLOPT") == "0":
        return
    _malloc_tuned = True
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
        # Setting either stops glibc's own adjustment of both, so both are set.
        libc.mallopt(m_mmap_threshold, 32 << 20)  # the largest glibc accepts on 64-bit
        libc.mallopt(m_trim_threshold, 128 << 20)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to tune


def _raise(error: grpc.RpcError) -> None:
    raise errors.from_rpc_error(error) from None


def _unary(method: Callable, request: Any, metadata: Tuple[Tuple[str, str], ...],
           timeout: Optional[float]) -> Any:
    try:
        return method(request, metadata=metadata, timeout=timeout)
    except grpc.RpcError as e:
        _raise(e)


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def _attr(name: str, value: Any) -> pb.AttrValue:
    v = pb.AttrValue()
    if isinstance(value, (bool, np.bool_)):
        v.b = bool(value)
    elif isinstance(value, (int, np.integer)):
        v.i = int(value)
    elif isinstance(value, (float, np.floating)):
        v.f = float(value)
    elif isinstance(value, str):
        v.s = value
    elif isinstance(value, (list, tuple, np.ndarray)):
        items = list(value)
        if all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in items):
            v.ints.values.extend(int(x) for x in items)
        elif all(isinstance(x, (int, float, np.integer, np.floating)) for x in items):
            v.floats.values.extend(float(x) for x in items)
        else:
            raise errors.InvalidArgument(f"attribute {name}: a list of ints or floats")
    else:
        raise errors.InvalidArgument(
            f"attribute {name}: unsupported type {type(value).__name__}")
    return v


def _channel(addr: str, tls: bool, root_certificates: Optional[bytes],
             private_key: Optional[bytes], certificate_chain: Optional[bytes],
             max_message_bytes: int) -> grpc.Channel:
    options = [
        ("grpc.max_receive_message_length", -1),  # the server enforces its own limit
        ("grpc.max_send_message_length", max_message_bytes),
        # ReadTensor's messages are received on the thread that iterates them, not handed
        # over one by one from the channel's polling thread: a 256 MiB download took about
        # 135 ms of wall and 125 ms of CPU time instead of 180 and 160 (docs/python.md,
        # "Bulk transfers"). ReadTensor is the package's only server-streaming call.
        (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
    ]
    if tls or root_certificates or certificate_chain:
        creds = grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
        return grpc.secure_channel(addr, creds, options=options)
    return grpc.insecure_channel(addr, options=options)


class _Connection:
    """Where a Client's calls go: an address, its channel and the stubs on it. Replaced whole
    when the client follows its tenant to another node; never changed."""

    def __init__(self, addr: str, channel: grpc.Channel) -> None:
        self.addr = addr
        self.channel = channel
        # The C++ client library's connection to addr for bulk transfers (tessera._native),
        # made on the first one (Client._native_of) and closed with the channel.
        self.native: Any = None
        self.native_timeout = -1.0
        self.stub = compute_pb2_grpc.ComputeStub(channel)
        # ReadTensor with the response bytes as they arrive: _read finds each chunk's data in
        # them and copies it once, into the array (protobuf's parse would copy it twice more).
        self.read_raw = channel.unary_stream(
            "/tessera.v1.Compute/ReadTensor",
            request_serializer=pb.ReadTensorRequest.SerializeToString,
            response_deserializer=None)
        # WriteTensor with requests the caller serialized (_write_chunk writes a chunk's bytes
        # once, where protobuf's message and serializer would copy them twice more).
        self.write_raw = channel.stream_unary(
            "/tessera.v1.Compute/WriteTensor",
            request_serializer=None,
            response_deserializer=pb.TensorInfo.FromString)

    def name_of(self, method: Callable) -> Optional[str]:
        """The name of ``method`` when it is one of this connection's stub methods."""
        return next((k for k, v in vars(self.stub).items() if v is method), None)


class _NativeRpcError(grpc.RpcError):
    """A failed call of tessera._native, shaped as grpcio's errors are (code, details,
    trailing metadata with the retry hint), so that following the tenant and converting to
    a TesseraError treat both alike."""

    def __init__(self, code: int, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self._code = _code(code) or grpc.StatusCode.UNKNOWN
        self._message = message
        self._trailers: Tuple[Tuple[str, str], ...] = (
            (("grpc-retry-pushback-ms", str(retry_after_ms)),) if retry_after_ms >= 0 else ())

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message

    def trailing_metadata(self) -> Tuple[Tuple[str, str], ...]:
        return self._trailers


def _trailer(error: grpc.RpcError, key: str) -> str:
    if not hasattr(error, "trailing_metadata"):
        return ""
    for name, value in error.trailing_metadata() or ():
        if name == key:
            return value if isinstance(value, str) else value.decode()
    return ""


T = TypeVar("T")


class _Base:
    def __init__(self, addr: Optional[str], token: Optional[str], tls: bool,
                 root_certificates: Optional[bytes], private_key: Optional[bytes],
                 certificate_chain: Optional[bytes], timeout: Optional[float],
                 max_message_bytes: int) -> None:
        self.addr = addr or os.environ.get("TESSERA_ADDR") or DEFAULT_ADDR
        token = token if token is not None else os.environ.get("TESSERA_TOKEN")
        self._metadata: Tuple[Tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ())
        self.timeout = timeout
        self.max_message_bytes = max_message_bytes
        _keep_transfer_buffers_mapped()
        self._channel_args = (tls, root_certificates, private_key, certificate_chain,
                              max_message_bytes + (1 << 20))
        self._channel = _channel(self.addr, *self._channel_args)
        self._token = token or ""

    def _call(self, method: Union[str, Callable], request: Any,
              timeout: Optional[float] = None) -> Any:
        """Calls ``method`` (a method name of the stub, or one of its methods)."""
        if isinstance(method, str):
            method = getattr(self._stub, method)
        return _unary(method, request, self._metadata,
                      timeout if timeout is not None else self.timeout)

    def close(self) -> None:
        """Closes the channel."""
        self._channel.close()

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Tensor:
    """A tensor on the server, named by its handle.

    >>> t = client.put(np.arange(6, dtype=np.float32).reshape(2, 3))
    >>> t.shape, t.dtype
    ((2, 3), 'f32')
    >>> t.numpy()
    array([[0., 1., 2.], [3., 4., 5.]], dtype=float32)
    """

    def __init__(self, client: "Client", info: pb.TensorInfo) -> None:
        self._client = client
        self.info = info

    @property
    def handle(self) -> str:
        return self.info.handle

    @property
    def dtype(self) -> str:
        """The Tessera dtype name: f32, f16, bf16, f64, i32, i64, u8 or bool."""
        return _BY_ENUM[self.info.dtype][0]

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(self.info.shape)

    @property
    def size_bytes(self) -> int:
        return self.info.size_bytes

    def numpy(self, progress: Optional[Progress] = None, copy: bool = True) -> np.ndarray:
        """Downloads the tensor as a numpy array: through the client's region over a Unix
        socket (ReadTensorIntoRegion), else ReadTensor in chunks. bf16 comes back as uint16
        holding the bf16 bits (``.view(ml_dtypes.bfloat16)`` if you have it).

        ``copy=False`` returns, when the bytes came through a region, a read-only view of the
        region itself (no copy): it holds this download only until the next put or get
        through this client (see ``Client.get``). Otherwise the array is the caller's."""
        return self._client._read(self.handle, progress, self.size_bytes, copy)

    def refresh(self) -> "Tensor":
        """Re-reads the tensor's description (GetTensor)."""
        self.info = self._client._call("GetTensor",
                                       pb.GetTensorRequest(handle=self.handle))
        return self

    def delete(self) -> int:
        """Frees the tensor; returns the bytes returned to the quota."""
        r = self._client._call("DeleteTensor",
                               pb.DeleteTensorRequest(handle=self.handle))
        return r.released_bytes

    def __repr__(self) -> str:
        return f"Tensor({self.handle!r}, dtype={self.dtype}, shape={self.shape})"


Operand = Union[Tensor, str, np.ndarray]


class Job:
    """A launched kernel or program. ``state`` is one of QUEUED, RUNNING, SUCCEEDED,
    FAILED, CANCELLED."""

    def __init__(self, client: "Client", proto: pb.Job) -> None:
        self._client = client
        self.proto = proto

    @property
    def id(self) -> str:
        return self.proto.job_id

    @property
    def state(self) -> str:
        return pb.JobState.Name(self.proto.state).replace("JOB_STATE_", "")

    @property
    def done(self) -> bool:
        return self.state in ("SUCCEEDED", "FAILED", "CANCELLED")

    @property
    def outputs(self) -> List[Tensor]:
        """The tensors the job writes or creates (a program: every step's, in order)."""
        return [Tensor(self._client, info) for info in self.proto.outputs]

    def wait(self, timeout: Optional[float] = None) -> "Job":
        """Waits up to ``timeout`` seconds (None: until it finishes) and raises JobFailed,
        Cancelled or DeadlineExceeded if it did not succeed."""
        request = pb.WaitJobRequest(job_id=self.id)
        if timeout is not None:
            request.timeout.CopyFrom(_duration(timeout))
        self.proto = self._client._call("WaitJob", request,
                                        timeout=None if timeout is None else timeout + 30)
        if not self.done:
            raise errors.DeadlineExceeded(
                f"job {self.id} still {self.state} after {timeout} s")
        return self.check()

    def cancel(self) -> "Job":
        """Cancels the job if it is still queued (a running job finishes)."""
        self.proto = self._client._call("CancelJob",
                                        pb.CancelJobRequest(job_id=self.id))
        return self

    def check(self) -> "Job":
        """Raises if the job ended FAILED or CANCELLED; returns self otherwise."""
        if self.proto.state == pb.JOB_STATE_FAILED:
            message = self.proto.error_message
            m = re.search(r"\bstep (\d+)", message)
            code = _code(self.proto.error_code)
            raise errors.JobFailed(message, job_id=self.id,
                                   step=int(m.group(1)) if m else None, code=code)
        if self.proto.state == pb.JOB_STATE_CANCELLED:
            code = _code(self.proto.error_code)
            exc = errors.from_code(code or grpc.StatusCode.CANCELLED,
                                   self.proto.error_message or "job cancelled")
            raise exc
        return self

    def __repr__(self) -> str:
        return f"Job({self.id!r}, {self.state})"


def _code(value: int) -> Optional[grpc.StatusCode]:
    for c in grpc.StatusCode:
        if c.value[0] == value:
            return c
    return None


class Kernel:
    """A kernel from ListKernels: the catalog's or this tenant's own."""

    def __init__(self, proto: pb.KernelInfo) -> None:
        self.proto = proto
        self.name = proto.name
        self.description = proto.description
        self.tenant_defined = proto.tenant_defined
        self.source = proto.source
        self.inputs = [p.name for p in proto.inputs]
        self.outputs = [p.name for p in proto.outputs]
        self.attrs = {a.name: a.type for a in proto.attrs}

    @property
    def signature(self) -> str:
        """E.g. ``matmul(a: f32|f16, b: f32|f16) -> (c: f32|f16)``."""
        def params(ps: Sequence[pb.KernelParam]) -> str:
            return ", ".join(
                f"{p.name}{'?' if p.optional else ''}: "
                + "|".join(_BY_ENUM[d][0] for d in p.dtypes if d in _BY_ENUM) for p in ps)
        args = [params(self.proto.inputs)] + [f"{a.name}: {a.type}" for a in self.proto.attrs]
        return (f"{self.name}({', '.join(a for a in args if a)}) -> "
                f"({params(self.proto.outputs)})")

    def __repr__(self) -> str:
        return f"Kernel({self.signature})"


class StepRef:
    """An output of a program step, usable as an operand of a later step. After the
    program has run, ``ref.tensor()`` is the tensor it produced."""

    def __init__(self, program: "Program", step: int, output: int = 0) -> None:
        self.program, self.step, self.output = program, step, output

    def __getitem__(self, output: int) -> "StepRef":
        return StepRef(self.program, self.step, output)

    def tensor(self) -> Tensor:
        return self.program.output(self)

    def numpy(self) -> np.ndarray:
        return self.tensor().numpy()


class Program:
    """Ordered launches on one stream, submitted as one job (Submit) when the ``with``
    block ends.

    >>> with client.program() as p:
    ...     c = p.add("matmul", a, b)
    ...     d = p.add("relu", c)
    >>> d.numpy()
    """

    def __init__(self, client: "Client", stream: int, wait: bool,
                 timeout: Optional[float]) -> None:
        self._client = client
        self.stream, self.wait, self.timeout = stream, wait, timeout
        self.steps: List[pb.ProgramStep] = []
        self._output_counts: List[int] = []
        self.job: Optional[Job] = None

    def add(self, kernel: str, *inputs: Union[Operand, StepRef], **attrs: Any) -> StepRef:
        """Appends a step; returns a reference to its first output (``ref[i]``: i-th)."""
        step = pb.ProgramStep(kernel=kernel)
        for x in inputs:
            if isinstance(x, StepRef):
                step.inputs.add().step_output.CopyFrom(
                    pb.StepOutput(step=x.step, output=x.output))
            else:
                step.inputs.add().handle = self._client._handle(x)
        for k, v in attrs.items():
            step.attrs[k].CopyFrom(_attr(k, v))
        self.steps.append(step)
        self._output_counts.append(self._client._output_count(kernel))
        return StepRef(self, len(self.steps) - 1)

    def submit(self) -> Job:
        """Submits the program (the ``with`` block does this on exit)."""
        request = pb.SubmitRequest(steps=self.steps, stream=self.stream, wait=self.wait)
        self.job = Job(self._client, self._client._call(
            "Submit", request, timeout=self.timeout))
        if self.wait:
            self.job.check()
        return self.job

    def output(self, ref: StepRef) -> Tensor:
        if self.job is None:
            raise errors.FailedPrecondition("the program has not been submitted")
        if not self.job.done:
            self.job.wait()
        index = sum(self._output_counts[:ref.step]) + ref.output
        return self.job.outputs[index]

    def __enter__(self) -> "Program":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.submit()


class Client(_Base):
    """A tenant's connection to the Compute service.

    ``addr`` defaults to $TESSERA_ADDR (else 127.0.0.1:50051), ``token`` to $TESSERA_TOKEN.
    ``tls=True`` uses TLS with the system roots (or ``root_certificates`` PEM bytes;
    ``private_key``/``certificate_chain`` for mutual TLS). ``timeout`` is the default
    deadline of each call in seconds (None: none).

    With a ``unix:PATH`` address (a server started with ``--unix_socket=PATH`` on this node),
    tensors move through a shared-memory region the client registers with the server on its
    first transfer and unregisters on ``close()``. ``regions=False`` (or the environment
    variable ``TESSERA_REGIONS=0`` when ``regions`` is None) moves them through the gRPC
    streams instead, as over TCP. See docs/python.md, "The Unix socket and regions".

    In a fleet of servers (docs/fleet.md) the client connects to the node its tenant lives
    on when ``addr`` names another node (one question at connect time), and its calls carry
    ``tessera-follow-home: 1``; ``follow_home=False`` keeps ``addr`` as given and sends no
    such metadata, so that node forwards the calls to the tenant's home. It also follows a
    tenant that moves while it is connected (docs/api.md, "After a move"): a call answered
    with the redirect is run once more at the new home, and a call that fails Unavailable
    makes the client ask ``addr`` where the tenant lives now, for the next call.
    ``client.addr`` is where calls go now.

    Over the gRPC streams (TCP, or ``unix:`` with regions off), ``put`` and ``get`` of more
    than one message move the bytes through the C++ client library (the extension module
    tessera._native, built with the package's stubs) with the GIL released: as fast as a C++
    client. ``native=False`` (or ``TESSERA_PY_NATIVE=0`` when ``native`` is None) streams
    through grpcio instead, as does a transfer with a ``progress`` callback, and every
    transfer where the module is not built; ``client.uses_native`` says which.

    >>> with tessera.Client("127.0.0.1:50051", token=key) as client:
    ...     t = client.put(np.zeros((4, 4), np.float16))
    """

    def __init__(self, addr: Optional[str] = None, token: Optional[str] = None,
                 tls: bool = False, root_certificates: Optional[bytes] = None,
                 private_key: Optional[bytes] = None,
                 certificate_chain: Optional[bytes] = None, timeout: Optional[float] = None,
                 max_message_bytes: int = MAX_MESSAGE_BYTES,
                 regions: Optional[bool] = None, follow_home: bool = True,
                 native: Optional[bool] = None) -> None:
        super().__init__(addr, token, tls, root_certificates, private_key, certificate_chain,
                         timeout, max_message_bytes)
        if native and _native is None:
            raise errors.FailedPrecondition(
                "native=True, but tessera._native is not built here (the package's CMake "
                "build makes it beside the stubs; docs/python.md)")
        if native is None:
            native = _native is not None and os.environ.get(ENV_NATIVE, "1") != "0"
        self._native_wanted = native
        self._native_args = (tls, root_certificates, private_key, certificate_chain)
        self._native_lock = threading.Lock()
        self._closed = False  # close() was called: no native channel is made again
        # The address given (the seed, asked where the tenant lives) and where calls go now.
        self._seed = self._conn = _Connection(self.addr, self._channel)
        self._retired: List[_Connection] = []  # connections left by a switch, closed by close()
        self._switch_lock = threading.Lock()
        self._regions: Optional[_regions.Regions] = None
        self._follows = follow_home and self._token.startswith("tsk_")
        if self._follows:
            # In a fleet (docs/fleet.md), connect to the node the tenant lives on when the
            # seed says it lives elsewhere (Compute.Locate, not counted against the tenant's
            # request quotas): one question, so later calls take no extra hop. Any other
            # answer (a single server, an older one, the server down) leaves the client as it
            # is.
            home = self._locate()
            if home and home != self.addr:
                self._switch(self._seed, home)
            # Every call says this client follows redirects: a node that is not the tenant's
            # home answers the redirect rather than forwarding the call (docs/api.md,
            # "Forwarding and redirects").
            self._metadata += (("tessera-follow-home", "1"),)
        self._regions = self._start_regions(regions)
        self._kernel_cache: Dict[str, Kernel] = {}

    @property
    def _stub(self) -> compute_pb2_grpc.ComputeStub:
        return self._conn.stub

    # ---- following the tenant's home (docs/api.md, "After a move") ----------------------
    def _call(self, method: Union[str, Callable], request: Any,
              timeout: Optional[float] = None) -> Any:
        """Calls ``method`` (a method name, or a method of ``self._stub``), following the
        tenant to another node as ``_run`` does."""
        timeout = timeout if timeout is not None else self.timeout
        name = method if isinstance(method, str) else self._conn.name_of(method)
        if name is None:  # not a stub method: no second try elsewhere
            return self._run(lambda conn: method(request, metadata=self._metadata,
                                                 timeout=timeout))
        return self._run(lambda conn: getattr(conn.stub, name)(
            request, metadata=self._metadata, timeout=timeout))

    def _run(self, attempt: Callable[[_Connection], T]) -> T:
        """``attempt(connection)`` on the current connection. Answered with the redirect
        (FAILED_PRECONDITION with a ``tessera-home-address`` trailer: the call did not run),
        the client switches to that node and runs it once more there; answered UNAVAILABLE, it
        asks the seed where the tenant lives and switches there for later calls (this one
        raises: it may have run). One switch per call at most."""
        conn = self._conn
        for tries in range(2):
            try:
                return attempt(conn)
            except grpc.RpcError as e:
                again = self._follow(conn, e) if tries == 0 else None
                if again is None:
                    _raise(e)
                conn = again
        raise AssertionError("not reached")

    def _follow(self, used: _Connection, error: grpc.RpcError) -> Optional[_Connection]:
        """After ``error`` on ``used``: the connection to run the call on again, or None."""
        if not self._follows or not hasattr(error, "code"):
            return None
        code = error.code()
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            home = _trailer(error, "tessera-home-address")
            if not home or home == used.addr:
                return None
            return self._switch(used, home)
        if code == grpc.StatusCode.UNAVAILABLE and self._conn is used:
            home = self._locate()
            if home and home != used.addr:
                self._switch(used, home)
        return None

    def _locate(self) -> Optional[str]:
        """Compute.Locate through the seed: the tenant's home address (the seed's when the
        tenant is there), or None when the seed does not say."""
        try:
            where = self._seed.stub.Locate(pb.LocateRequest(), metadata=self._metadata,
                                           timeout=min(self.timeout or 5.0, 5.0))
        except grpc.RpcError:
            return None
        if where.here:
            return self._seed.addr
        return where.address or None

    def _switch(self, used: _Connection, addr: str) -> _Connection:
        """Makes ``addr`` where calls go, unless another call switched since ``used`` (then
        keeps that); returns the current connection. Regions are node-local: after a switch,
        transfers stream (the old node dropped the moved tenant's regions)."""
        new = self._seed if addr == self._seed.addr else _Connection(
            addr, _channel(addr, *self._channel_args))
        with self._switch_lock:
            if self._conn is not used:
                if new is not self._seed:
                    new.channel.close()
                return self._conn
            self._conn, self.addr, self._channel = new, addr, new.channel
            if used is not self._seed:
                self._retired.append(used)  # calls in flight on it finish there
            regions, self._regions = self._regions, None
        if regions is not None:
            self._close_regions.detach()
        return new

    def _start_regions(self, wanted: Optional[bool]) -> Optional[_regions.Regions]:
        path = _regions.unix_socket_path(self.addr)
        if wanted is None:
            wanted = os.environ.get(_regions.ENV_REGIONS, "1") != "0"
        if path is None or not wanted:
            return None
        metadata, default_timeout = self._metadata, self.timeout

        # Neither this function nor the Regions refer to the client, so the finalizer below
        # can unregister the region of a client that was never closed.
        def call(method: Callable, request: Any, timeout: Optional[float] = None) -> Any:
            return _unary(method, request, metadata,
                          timeout if timeout is not None else default_timeout)

        regions = _regions.Regions(call, self._stub, path)
        self._close_regions = weakref.finalize(self, regions.close, REGION_CLOSE_TIMEOUT_S)
        return regions

    @property
    def uses_regions(self) -> bool:
        """True while transfers go through a shared-memory region: a ``unix:`` address,
        regions not turned off, not refused by the server so far, and the client still on
        the node it reached first."""
        regions = self._regions
        return regions is not None and regions.enabled

    @property
    def uses_native(self) -> bool:
        """True when bulk transfers over the gRPC streams go through the C++ client library
        (tessera._native; those without a ``progress`` callback)."""
        return self._native_wanted

    def _native_of(self, conn: _Connection) -> Any:
        """``conn``'s tessera._native.Channel, made on first use. A channel's deadline is
        fixed and it follows the tenant's home by itself, so a new one replaces it when
        ``timeout`` changed or it went elsewhere than ``conn`` (the tenant moved on)."""
        timeout = -1.0 if self.timeout is None else max(0.0, float(self.timeout))
        with self._native_lock:
            if self._closed:
                raise ValueError("the client is closed")
            old = conn.native
            if old is None or conn.native_timeout != timeout or old.address() != conn.addr:
                tls, root, key, chain = self._native_args
                try:
                    channel = _native.Channel(conn.addr, self._token, bool(tls), root, key,
                                              chain, timeout, self._follows)
                except _native.Error as e:
                    raise _NativeRpcError(*e.args) from None
                conn.native, conn.native_timeout = channel, timeout
                if old is not None:
                    old.close()  # transfers in flight on it finish first
            return conn.native

    def _native_call(self, conn: _Connection, call: Callable[[Any, bool], T]) -> T:
        """``call(channel, interruptible)`` on ``conn``'s native channel, its failures as
        grpc.RpcError (so that ``_run`` follows the tenant as it does for grpcio's)."""
        channel = self._native_of(conn)
        try:
            # On the main thread the library's transfer runs Python's signal handlers every
            # 50 ms while it waits: Ctrl-C cancels it (KeyboardInterrupt), as with grpcio.
            return call(channel, threading.current_thread() is threading.main_thread())
        except _native.Error as e:
            raise _NativeRpcError(*e.args) from None
        finally:
            # The library follows the tenant's home by itself (a redirect, or Locate after
            # UNAVAILABLE): where it went, the client's other calls go too.
            try:
                home = channel.address()
            except ValueError:  # closed meanwhile
                home = conn.addr
            if home != conn.addr:
                self._switch(conn, home)

    def close(self) -> None:
        """Unregisters the client's region (if any), then closes the channels."""
        if self._regions is not None:
            self._close_regions()
        with self._native_lock:
            self._closed = True
        with self._switch_lock:
            conns = [self._conn, self._seed] + self._retired
            self._retired = []
        closed: List[int] = []
        for conn in conns:
            if id(conn) not in closed:
                closed.append(id(conn))
                conn.channel.close()
                with self._native_lock:
                    native, conn.native = conn.native, None
                if native is not None:
                    native.close()

    # ---- tensors ----------------------------------------------------------------------
    def put(self, array: Any, dtype: Optional[str] = None,
            chunk_bytes: int = DEFAULT_CHUNK_BYTES,
            progress: Optional[Progress] = None) -> Tensor:
        """Uploads a numpy array as a new tensor.

        Over a ``unix:`` address with regions (the default there), the array is copied into
        the client's shared-memory region, converted on the way if it is not contiguous or
        not little-endian, and the server copies it from there (WriteTensorFromRegion);
        ``progress(total, total)`` is called once. Otherwise arrays up to ``chunk_bytes`` (at
        most 16 MiB) go in one CreateTensor, and larger ones stream through WriteTensor in
        ``chunk_bytes`` chunks (sent from the array by the C++ client library where
        tessera._native is built and no ``progress`` is given), calling
        ``progress(done, total)`` after each. ``dtype``
        overrides the dtype inferred from the array: ``"bf16"`` takes a uint16 (or ml_dtypes
        bfloat16) array holding the bf16 bit patterns.

        >>> t = client.put(np.ones((1024, 1024), np.float32))
        >>> h = client.put(bits.view(np.uint16), dtype="bf16")
        """
        array = np.asarray(array)
        name = _dtype_name(array, dtype)
        enum, wire = _DTYPES[name]
        if name == "bf16":
            array = array.view(np.uint16)
        if chunk_bytes <= 0:
            raise errors.InvalidArgument("chunk_bytes must be > 0")
        spec = pb.TensorSpec(dtype=enum, shape=array.shape)
        regions = self._regions
        if regions is not None:
            source = array
            done = regions.run(source.size * wire.itemsize,
                                     lambda region: self._put_region(region, spec, source, wire))
            if done is not None:
                if progress:
                    progress(done[0].size_bytes, done[0].size_bytes)
                return Tensor(self, done[0])
        array = np.ascontiguousarray(array, dtype=wire)
        data = memoryview(array.reshape(-1).view(np.uint8))
        total = len(data)
        # CreateTensor carries at most 16 MiB inline (the server's limit); more streams.
        if total <= min(chunk_bytes, CREATE_TENSOR_MAX_BYTES):
            info = self._call("CreateTensor",
                              pb.CreateTensorRequest(spec=spec, data=data.tobytes()))
            if progress:
                progress(total, total)
            return Tensor(self, info)

        if self._native_wanted and progress is None:
            # The C++ client library sends each chunk from the array where it lies.
            spec_raw = spec.SerializeToString()

            def upload(channel: Any, interruptible: bool) -> bytes:
                return channel.upload(spec_raw, data, chunk_bytes, interruptible)

            return Tensor(self, self._run(lambda conn: pb.TensorInfo.FromString(
                self._native_call(conn, upload))))
        header = pb.WriteTensorRequest(header=pb.WriteHeader(create=spec)).SerializeToString()
        # Sent again, whole, after the redirect (the data is still there).
        return Tensor(self, self._run(lambda conn: conn.write_raw(
            _write_requests(header, data, chunk_bytes, progress), metadata=self._metadata,
            timeout=self.timeout)))

    def _put_region(self, region: _regions.Region, spec: pb.TensorSpec, array: np.ndarray,
                    wire: np.dtype) -> pb.TensorInfo:
        nbytes = array.size * wire.itemsize
        # The one copy on this side, which also converts strides, byte order and dtype.
        np.copyto(region.array(nbytes).view(wire).reshape(array.shape), array, casting="unsafe")
        return self._call("WriteTensorFromRegion", pb.WriteTensorFromRegionRequest(
            create=spec, region=region.handle, offset=0, length=nbytes))

    def get(self, tensor: Union[Tensor, str], copy: bool = True,
            progress: Optional[Progress] = None) -> np.ndarray:
        """Downloads a tensor (a Tensor or a handle) as a numpy array; ``tensor.numpy()``.

        ``copy=False``, when the bytes come through the client's region (a ``unix:``
        address), returns a read-only array that views the region itself: no copy, and valid
        only until the next ``put`` or ``get`` through this client (from any thread), which
        may overwrite it; take ``.copy()`` to keep it longer. Its memory stays mapped as long
        as the array lives, even after ``close()``. Over TCP (or with regions off) the array
        is the caller's either way.

        >>> x = client.get(t, copy=False)      # a view; read it before the next transfer
        """
        if isinstance(tensor, Tensor):
            return tensor.numpy(progress, copy)
        return self._read(self._handle(tensor), progress, None, copy)

    def tensor(self, handle: str) -> Tensor:
        """The tensor with this handle (GetTensor; NotFound if it is not this tenant's)."""
        return Tensor(self, self._call("GetTensor", pb.GetTensorRequest(handle=handle)))

    def tensors(self) -> List[Tensor]:
        """All of this tenant's tensors."""
        out: List[Tensor] = []
        token = ""
        while True:
            r = self._call("ListTensors",
                           pb.ListTensorsRequest(page_size=1000, page_token=token))
            out.extend(Tensor(self, info) for info in r.tensors)
            token = r.next_page_token
            if not token:
                return out

    def _read(self, handle: str, progress: Optional[Progress], size: Optional[int] = None,
              copy: bool = True) -> np.ndarray:
        regions = self._regions
        if regions is not None and regions.enabled:
            if size is None:  # the region must hold the tensor: ask its size
                size = self.tensor(handle).size_bytes
            got = regions.run(
                size, lambda region: self._read_region(region, handle, copy))
            if got is not None:
                if progress:
                    progress(size, size)
                return got[0]
        return self._read_stream(handle, progress)

    def _read_region(self, region: _regions.Region, handle: str, copy: bool) -> np.ndarray:
        r = self._call("ReadTensorIntoRegion",
                       pb.ReadTensorIntoRegionRequest(handle=handle, region=region.handle))
        if r.bytes != r.info.size_bytes:
            raise errors.DataLoss(f"ReadTensorIntoRegion copied {r.bytes} of "
                                  f"{r.info.size_bytes} bytes")
        data = region.array(r.bytes)
        if copy:
            out = _buffers.empty(r.bytes)
            np.copyto(out, data)  # the one copy on this side
            data = out
        else:
            data.flags.writeable = False
        return data.view(_BY_ENUM[r.info.dtype][1]).reshape(tuple(r.info.shape))

    def _read_stream(self, handle: str, progress: Optional[Progress]) -> np.ndarray:
        chunk = max(4096, min(READ_CHUNK_BYTES, self.max_message_bytes // 2))
        if self._native_wanted and progress is None:
            return self._run(lambda conn: self._read_native(conn, handle, chunk))
        request = pb.ReadTensorRequest(handle=handle, chunk_bytes=chunk)
        # Read again from the start after the redirect (which comes before any message).
        return self._run(lambda conn: self._read_stream_from(conn, request, progress))

    def _read_native(self, conn: _Connection, handle: str, chunk: int) -> np.ndarray:
        """ReadTensor through the C++ client library, into an array of this package's
        (_buffers) that the library asks for once the server has said the size."""
        raw, buf = self._native_call(
            conn, lambda ch, i: ch.download(handle, chunk, _buffers.empty, i))
        info = pb.TensorInfo.FromString(raw)
        if buf is None or len(buf) != info.size_bytes:
            raise errors.DataLoss("ReadTensor's bytes do not match its TensorInfo")
        return buf.view(_BY_ENUM[info.dtype][1]).reshape(tuple(info.shape))

    def _read_stream_from(self, conn: _Connection, request: pb.ReadTensorRequest,
                          progress: Optional[Progress]) -> np.ndarray:
        buf: Optional[np.ndarray] = None
        info: Optional[pb.TensorInfo] = None
        done = 0
        for raw in conn.read_raw(request, metadata=self._metadata, timeout=self.timeout):
            first, offset, data = _read_tensor_response(raw)
            if info is None:
                if first is None:
                    raise errors.DataLoss("ReadTensor's first message has no TensorInfo")
                info = first
                buf = _buffers.empty(info.size_bytes)
            assert buf is not None
            if offset != done:
                raise errors.DataLoss("ReadTensor returned chunks out of order")
            if done + len(data) > info.size_bytes:
                raise errors.DataLoss("ReadTensor returned more bytes than the tensor has")
            buf[done:done + len(data)] = np.frombuffer(data, np.uint8)
            done += len(data)
            if progress:
                progress(done, info.size_bytes)
        if info is None or buf is None:
            raise errors.DataLoss("ReadTensor returned no messages")
        if done != info.size_bytes:
            raise errors.DataLoss(f"ReadTensor returned {done} of {info.size_bytes} bytes")
        return buf.view(_BY_ENUM[info.dtype][1]).reshape(tuple(info.shape))

    def _handle(self, x: Operand) -> str:
        if isinstance(x, Tensor):
            return x.handle
        if isinstance(x, str):
            return x
        if isinstance(x, np.ndarray):
            raise errors.InvalidArgument("pass a Tensor (client.put(array)), not an array")
        raise errors.InvalidArgument(f"not a tensor: {type(x).__name__}")

    # ---- kernels and jobs ---------------------------------------------------------------
    def kernels(self) -> List[Kernel]:
        """The catalog's kernels and this tenant's own, with signatures."""
        r = self._call("ListKernels", pb.ListKernelsRequest())
        kernels = [Kernel(k) for k in r.kernels]
        self._kernel_cache = {k.name: k for k in kernels}
        return kernels

    def _output_count(self, kernel: str) -> int:
        if kernel not in self._kernel_cache:
            self.kernels()
        k = self._kernel_cache.get(kernel)
        return len(k.outputs) if k else 1

    def launch(self, kernel: str, *inputs: Operand, stream: int = 0, wait: bool = False,
               timeout: Optional[float] = None, queue_timeout: Optional[float] = None,
               **attrs: Any) -> Job:
        """Enqueues a kernel and returns its Job (with ``wait``, once it has finished).
        Outputs are new tensors with inferred dtype and shape."""
        request = pb.LaunchRequest(kernel=kernel, inputs=[self._handle(x) for x in inputs],
                                   stream=stream, wait=wait)
        for k, v in attrs.items():
            request.attrs[k].CopyFrom(_attr(k, v))
        if queue_timeout is not None:
            request.queue_timeout.CopyFrom(_duration(queue_timeout))
        return Job(self, self._call("Launch", request, timeout=timeout))

    def run(self, kernel: str, *inputs: Operand, timeout: Optional[float] = None,
            stream: int = 0, **attrs: Any) -> Union[Tensor, Tuple[Tensor, ...]]:
        """Launches a kernel, waits, and returns its output Tensor (a tuple if it has
        several). A failed job raises JobFailed with the server's message.

        >>> c = client.run("matmul", a, b)
        >>> s = client.run("sum", x, axes=[0], keepdims=True)
        """
        job = self.launch(kernel, *inputs, stream=stream, wait=True, timeout=timeout, **attrs)
        if not job.done:
            job.wait()
        job.check()
        outputs = job.outputs
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def program(self, stream: int = 0, wait: bool = True,
                timeout: Optional[float] = None) -> Program:
        """A program builder; submitted as one job when its ``with`` block ends."""
        return Program(self, stream, wait, timeout)

    def synchronize(self, stream: Optional[int] = None,
                    timeout: Optional[float] = None) -> int:
        """Waits for every job enqueued so far; returns how many finished meanwhile."""
        request = pb.SynchronizeRequest()
        if stream is not None:
            request.stream = stream
        return self._call("Synchronize", request, timeout=timeout).jobs_completed

    def define_kernel(self, source: str) -> Kernel:
        """Defines a tenant kernel from its text (docs/kernels.md).

        >>> client.define_kernel("kernel axpy(x: f32, y: f32) -> (z: f32) "
        ...                      "{ z = 2.0 * x + y }")
        """
        k = Kernel(self._call("DefineKernel", pb.DefineKernelRequest(source=source)))
        self._kernel_cache.pop(k.name, None)
        return k

    def delete_kernel(self, name: str) -> None:
        """Deletes one of this tenant's kernels."""
        self._call("DeleteKernel", pb.DeleteKernelRequest(name=name))
        self._kernel_cache.pop(name, None)

    def usage(self) -> pb.Usage:
        """The tenant's memory and job counters (a tessera.v1.Usage message)."""
        return self._call("GetUsage", pb.GetUsageRequest())


class Admin(_Base):
    """The operator's connection to the TenantAdmin service (token: the admin token).
    Returns the tessera.v1 protobuf messages.

    >>> with tessera.Admin(addr, token=admin_token) as admin:
    ...     tenant, key = admin.register("team-a", memory_bytes=1 << 30)
    """

    def __init__(self, addr: Optional[str] = None, token: Optional[str] = None,
                 tls: bool = False, root_certificates: Optional[bytes] = None,
                 private_key: Optional[bytes] = None,
                 certificate_chain: Optional[bytes] = None,
                 timeout: Optional[float] = None) -> None:
        super().__init__(addr, token, tls, root_certificates, private_key, certificate_chain,
                         timeout, MAX_MESSAGE_BYTES)
        self._stub = tenant_admin_pb2_grpc.TenantAdminStub(self._channel)

    def register(self, tenant_id: str, memory_bytes: int, display_name: str = "",
                 labels: Optional[Mapping[str, str]] = None, compute_share_percent: int = 0,
                 max_streams: int = 0, max_queued_jobs: int = 0,
                 device_index: Optional[int] = None, max_requests_in_flight: int = 0,
                 requests_per_second: int = 0,
                 max_region_bytes: int = 0) -> Tuple[apb.Tenant, str]:
        """Registers a tenant; returns (tenant, api_key). The key is shown only once. Quota
        fields left 0 take the server's defaults."""
        request = apb.RegisterTenantRequest(
            tenant_id=tenant_id, display_name=display_name, labels=dict(labels or {}),
            quota=apb.Quota(device_memory_bytes=memory_bytes,
                            compute_share_percent=compute_share_percent,
                            max_streams=max_streams, max_queued_jobs=max_queued_jobs,
                            max_requests_in_flight=max_requests_in_flight,
                            requests_per_second=requests_per_second,
                            max_region_bytes=max_region_bytes))
        if device_index is not None:
            request.device_index = device_index
        r = self._call("RegisterTenant", request)
        return r.tenant, r.api_key

    def get(self, tenant_id: str) -> apb.Tenant:
        return self._call("GetTenant", apb.GetTenantRequest(tenant_id=tenant_id))

    def list(self) -> List[apb.Tenant]:
        """Every tenant, ordered by id."""
        out: List[apb.Tenant] = []
        token = ""
        while True:
            r = self._call("ListTenants",
                           apb.ListTenantsRequest(page_size=100, page_token=token))
            out.extend(r.tenants)
            token = r.next_page_token
            if not token:
                return out

    def update(self, tenant_id: str, display_name: Optional[str] = None,
               labels: Optional[Mapping[str, str]] = None) -> apb.Tenant:
        """Changes display_name and/or labels (only those given)."""
        tenant = apb.Tenant(tenant_id=tenant_id)
        paths = []
        if display_name is not None:
            tenant.display_name = display_name
            paths.append("display_name")
        if labels is not None:
            tenant.labels.update(labels)
            paths.append("labels")
        request = apb.UpdateTenantRequest(tenant=tenant,
                                          update_mask=field_mask_pb2.FieldMask(paths=paths))
        return self._call("UpdateTenant", request)

    def deregister(self, tenant_id: str) -> int:
        """Removes a tenant; returns the memory bytes released."""
        r = self._call("DeregisterTenant",
                       apb.DeregisterTenantRequest(tenant_id=tenant_id))
        return r.released_memory_bytes

    def rotate_key(self, tenant_id: str) -> str:
        """Issues a new API key (the old one stops working at once); returns it."""
        return self._call("RotateTenantKey",
                          apb.RotateTenantKeyRequest(tenant_id=tenant_id)).api_key

    def server_info(self) -> apb.ServerInfo:
        return self._call("GetServerInfo", apb.GetServerInfoRequest())

    def mps_status(self) -> apb.MpsStatus:
        return self._call("GetMpsStatus", apb.GetMpsStatusRequest())

    def terminate_work(self, tenant_id: str) -> int:
        """Cancels a tenant's queued jobs; returns how many."""
        return self._call("TerminateTenantWork",
                          apb.TerminateTenantWorkRequest(tenant_id=tenant_id)).cancelled_jobs
