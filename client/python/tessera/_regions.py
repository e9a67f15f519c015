"""Shared-memory regions: how a Client on the server's node moves tensors without putting
their bytes in messages (docs/api.md, "Clients on the same node: the Unix socket and
shared-memory regions"; docs/python.md, "The Unix socket and regions").

A region is a sealed memfd that both this process and the server map. ``register`` hands one
over (BeginRegion, SCM_RIGHTS on the descriptor socket, FinishRegion); ``Regions`` keeps one
per Client, grows it on demand and unregisters it on close.
"""
from __future__ import annotations

import fcntl
import logging
import mmap
import os
import socket
import threading
import time
from typing import Any, Callable, List, Optional, Tuple, TypeVar

import grpc
import numpy as np

from . import errors
from ._proto import compute_pb2 as pb

_log = logging.getLogger("tessera")

#: The smallest region a Client registers (Quota.max_region_bytes is at least 1 MiB).
MIN_REGION_BYTES = 1 << 20
#: The largest region the server maps (BeginRegionRequest.size_bytes).
MAX_REGION_BYTES = 1 << 40
#: How long the descriptor socket may take to answer: it maps the region and, on the CUDA
#: backend, registers its pages with the driver before it replies.
HANDOVER_TIMEOUT_S = 60.0
#: Environment variable that turns regions off for every Client when set to 0.
ENV_REGIONS = "TESSERA_REGIONS"

# Linux's values, for a Python whose fcntl module lacks them (they are in 3.8 and later).
_F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
_F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 2)

T = TypeVar("T")


def unix_socket_path(addr: str) -> Optional[str]:
    """The socket path of a gRPC ``unix:PATH`` or ``unix:///PATH`` address, else None."""
    if addr.startswith("unix://"):
        return addr[len("unix://"):]
    if addr.startswith("unix:"):
        return addr[len("unix:"):]
    return None


def create_memfd(size: int, name: str = "tessera-region") -> int:
    """A memfd of ``size`` bytes sealed against shrinking (step 1 of the hand-over); the
    caller owns the descriptor."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, _F_ADD_SEALS, _F_SEAL_SHRINK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def parse_reply(reply: bytes) -> Optional[errors.TesseraError]:
    """The descriptor socket's answer: None for ``OK``, else the error its ``ERR CODE
    message`` line names (an unreadable answer is Unavailable)."""
    line = reply.split(b"\n", 1)[0].decode("utf-8", "replace")
    if line == "OK":
        return None
    parts = line.split(" ", 2)
    if len(parts) >= 2 and parts[0] == "ERR":
        code = getattr(grpc.StatusCode, parts[1], None)
        message = parts[2] if len(parts) == 3 else parts[1]
        if isinstance(code, grpc.StatusCode):
            return errors.from_code(code, message)
        return errors.TesseraError(message)
    return errors.Unavailable(f"the descriptor socket answered {line!r}, not OK or ERR")


def send_descriptor(path: str, ticket: str, fd: int,
                    timeout: float = HANDOVER_TIMEOUT_S) -> None:
    """Step 2: sends ``fd`` with the ticket line to the descriptor socket at ``path`` and
    reads its answer. Raises the error an ``ERR`` line names, or OSError when the socket
    cannot be reached."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        socket.send_fds(s, [ticket.encode("ascii") + b"\n"], [fd])
        reply = b""
        while b"\n" not in reply and len(reply) < 4096:
            data = s.recv(4096)
            if not data:
                break
            reply += data
    error = parse_reply(reply)
    if error is not None:
        raise error


class Region:
    """A region this process maps and the server knows by ``handle``."""

    def __init__(self, handle: str, memory: mmap.mmap) -> None:
        self.handle = handle
        self.memory = memory
        self.size = len(memory)

    def array(self, nbytes: int) -> np.ndarray:
        """The region's first ``nbytes`` as a writable uint8 array (no copy)."""
        return np.frombuffer(self.memory, np.uint8, nbytes)

    def release(self) -> None:
        """Unmaps this process's mapping, unless arrays still view it: those keep it mapped
        until they are garbage (never freed under them)."""
        try:
            self.memory.close()
        except BufferError:
            pass  # arrays from get(copy=False) still use it

    def __repr__(self) -> str:
        return f"Region({self.handle!r}, {self.size} bytes)"


Call = Callable[[Callable, Any], Any]
"""The Client's unary call: ``call(stub_method, request)``; raises TesseraError."""


def register(call: Call, stub: Any, size: int, socket_path: str) -> Region:
    """Registers a new region of ``size`` bytes (the whole hand-over of docs/api.md)."""
    fd = create_memfd(size)
    try:
        memory = mmap.mmap(fd, size)
        try:
            ticket = call(stub.BeginRegion, pb.BeginRegionRequest(size_bytes=size))
            try:
                send_descriptor(_descriptor_socket(socket_path, ticket.socket_path),
                                ticket.ticket, fd)
            except errors.TesseraError:
                # Refused: FinishRegion forgets the ticket, so that it stops counting against
                # the tenant's open tickets (it answers with the same refusal).
                try:
                    call(stub.FinishRegion, pb.FinishRegionRequest(ticket=ticket.ticket))
                except errors.TesseraError:
                    pass
                raise
            region = call(stub.FinishRegion, pb.FinishRegionRequest(ticket=ticket.ticket))
        except BaseException:
            memory.close()
            raise
    finally:
        os.close(fd)  # both mappings keep the memory
    return Region(region.handle, memory)


def _descriptor_socket(grpc_socket: str, from_ticket: str) -> str:
    # The path we connected to is the one that is valid in this mount namespace (a container
    # may mount the socket's directory elsewhere than the server sees it).
    ours = grpc_socket + ".regions"
    return ours if os.path.exists(ours) or not from_ticket else from_ticket


def _round_up(size: int) -> int:
    """Regions grow in powers of two from MIN_REGION_BYTES, so that a series of growing
    tensors registers few regions."""
    want = MIN_REGION_BYTES
    while want < size:
        want <<= 1
    return want


class Regions:
    """A Client's region: created on first need, grown on demand (a bigger one registered,
    then the old one unregistered), reused by every transfer, unregistered by close().

    Transfers through it are serialized by a lock: ``run`` holds it while the region's bytes
    are copied and the RPC runs. When regions cannot be used (the server has no descriptor
    socket, or a server without regions), they are turned off for this Client with a warning
    and ``run`` returns None, so that the caller uses the gRPC streams; a region that does not
    fit the tenant's quota.max_region_bytes sends only that transfer to the streams.
    Thread-safe."""

    def __init__(self, call: Call, stub: Any, socket_path: str) -> None:
        self._call = call
        self._stub = stub
        self._socket_path = socket_path
        self._lock = threading.Lock()
        self._region: Optional[Region] = None
        self._retired: List[Region] = []  # unregistered when no transfer pins them any more
        self._off_reason: Optional[str] = None
        self._warned_fallback = False
        self._refused_bytes = MAX_REGION_BYTES + 1  # transfers this large skip regions
        self._closed = False
        if not hasattr(os, "memfd_create") or not hasattr(socket, "send_fds"):
            self._turn_off_locked(OSError("this Python has no os.memfd_create or "
                                          "socket.send_fds (they need Linux, Python 3.9+)"))

    @property
    def enabled(self) -> bool:
        return self._off_reason is None and not self._closed

    @property
    def region(self) -> Optional[Region]:
        """The current region (None before the first transfer or after close)."""
        return self._region

    def run(self, nbytes: int, transfer: Callable[[Region], T]) -> Optional[Tuple[T]]:
        """``(transfer(region),)`` with a region of at least ``nbytes``, under the lock; None
        when this transfer must use the gRPC streams instead. A region the server no longer
        knows (it restarted) is replaced once."""
        with self._lock:
            for attempt in range(2):
                region = self._ensure_locked(nbytes)
                if region is None:
                    return None
                try:
                    return (transfer(region),)
                except errors.NotFound as e:
                    if attempt or region.handle not in e.message:
                        raise
                    _log.warning("tessera: the server forgot region %s (%s); registering a "
                                 "new one", region.handle, e.message)
                    self._region = None
                    region.release()
        return None  # not reached

    def close(self, timeout: Optional[float] = None) -> None:
        """Unregisters this Client's regions; later transfers use the gRPC streams. A region
        a transfer still uses (one whose call was cancelled) is tried again for up to a
        second."""
        with self._lock:
            self._closed = True
            if self._region is not None:
                self._retired.append(self._region)
                self._region = None
            deadline = time.monotonic() + 1.0
            while self._unregister_retired_locked(timeout) and time.monotonic() < deadline:
                time.sleep(0.05)
            for region in self._retired:
                _log.warning("tessera: could not unregister region %s; the server keeps it "
                             "until the tenant unregisters it or is deregistered", region.handle)
                region.release()
            self._retired = []

    def _ensure_locked(self, nbytes: int) -> Optional[Region]:
        if not self.enabled or nbytes >= self._refused_bytes:
            return None
        if self._region is not None and self._region.size >= nbytes:
            return self._region
        try:
            self._region = self._register_locked(nbytes)
            return self._region
        except (errors.FailedPrecondition, errors.InvalidArgument, OSError) as e:
            # No descriptor socket, a refused memfd, a socket we cannot reach: later transfers
            # could do nothing differently.
            self._turn_off_locked(e)
            return None
        except errors.TesseraError as e:
            if e.code == grpc.StatusCode.UNIMPLEMENTED:  # a server without regions
                self._turn_off_locked(e)
                return None
            # Past quota.max_region_bytes (quotas are fixed: no region this large will fit),
            # or something passing (an expired ticket, Unavailable): this transfer uses the
            # streams, which raise the error again if it is not passing.
            if isinstance(e, errors.QuotaExceeded) and e.retry_after is None:
                self._refused_bytes = min(self._refused_bytes, nbytes)
            (_log.debug if self._warned_fallback else _log.warning)(
                "tessera: no region of %d bytes could be registered (%s); the transfer uses "
                "the gRPC streams", nbytes, e.message)
            self._warned_fallback = True
            return None

    def _register_locked(self, nbytes: int) -> Region:
        """A new region of at least ``nbytes``, the current one unregistered: after the new
        one is registered, or first when the quota cannot hold both. Powers of two, or the
        exact size when the rounded one does not fit."""
        sizes = [_round_up(nbytes)]
        exact = max(MIN_REGION_BYTES, -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE)
        if exact != sizes[0]:
            sizes.append(exact)
        i = 0
        while True:
            try:
                new = register(self._call, self._stub, sizes[i], self._socket_path)
            except errors.QuotaExceeded as e:
                if e.retry_after is not None:
                    raise  # a rate limit, not the region quota
                if self._region is not None:
                    self._retire_locked()
                    continue
                i += 1
                if i == len(sizes):
                    raise
                continue
            self._retire_locked()
            return new

    def _retire_locked(self) -> None:
        if self._region is not None:
            self._retired.append(self._region)
            self._region = None
        self._unregister_retired_locked(None)

    def _unregister_retired_locked(self, timeout: Optional[float]) -> bool:
        """Unregisters the retired regions; True when some are still in use (kept)."""
        kept: List[Region] = []
        in_use = False
        for region in self._retired:
            try:
                self._call(self._stub.UnregisterRegion,
                           pb.UnregisterRegionRequest(handle=region.handle), timeout)
            except errors.NotFound:
                pass  # already gone (the tenant was re-registered, the server restarted)
            except errors.FailedPrecondition:
                kept.append(region)  # a cancelled transfer still uses it: later
                in_use = True
                continue
            except errors.TesseraError as e:
                _log.warning("tessera: UnregisterRegion %s: %s", region.handle, e.message)
                kept.append(region)
                continue
            region.release()
        self._retired = kept
        return in_use

    def _turn_off_locked(self, why: BaseException) -> None:
        self._off_reason = getattr(why, "message", None) or str(why)
        _log.warning("tessera: shared-memory regions are off for this client (%s: %s); "
                     "tensors move through the gRPC streams", type(why).__name__,
                     self._off_reason)
        self._retire_locked()
