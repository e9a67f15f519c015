// tessera._native: the Python package's bulk transfers through the C++ client library
// (docs/python.md, "Bulk transfers"). WriteTensor and ReadTensor run with the GIL released,
// sending from and receiving into the caller's numpy arrays with the library's one copy (none
// for an upload), where grpcio (1.51) copies every message twice more on each side.
//
// Optional: the package streams through grpcio without it (a package installed without the
// build, or TESSERA_PY_NATIVE=0). Only what the package needs is here: a Channel per address
// and its two transfers; every other call stays on grpcio.

// Python.h first, as Python's documentation requires.
// clang-format off
#define PY_SSIZE_T_CLEAN
#include <Python.h>
// clang-format on

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "tessera/client.h"

namespace {

// tessera._native.Error(code, message, retry_after_ms): a failed call, with its gRPC status
// code (an int), the server's message and its retry hint (-1: none).
PyObject* g_error = nullptr;

PyObject* RaiseStatus(const absl::Status& status) {
  const std::optional<absl::Duration> retry = tessera::RetryAfter(status);
  const long long retry_ms = retry.has_value() ? absl::ToInt64Milliseconds(*retry) : -1;
  // The server cuts long messages at a byte count, which may split a character.
  PyObject* message = PyUnicode_DecodeUTF8(
      status.message().data(), static_cast<Py_ssize_t>(status.message().size()), "replace");
  if (message == nullptr) return nullptr;
  PyObject* args = Py_BuildValue("(iNL)", static_cast<int>(status.code()), message, retry_ms);
  if (args != nullptr) {
    PyErr_SetObject(g_error, args);
    Py_DECREF(args);
  }
  return nullptr;
}

// Runs `work` (a transfer, given its Canceller) with the GIL released. `interruptible` (the
// caller is Python's main thread, where signal handlers run): while the transfer waits for the
// server it takes the GIL back every 50 ms to run them, as grpcio's calls do; a handler's
// exception (KeyboardInterrupt) cancels the transfer and is left raised: then false.
bool RunReleased(bool interruptible, absl::FunctionRef<void(tessera::Canceller*)> work) {
  PyThreadState* state = nullptr;
  bool interrupted = false;
  std::function<void()> watch;
  tessera::Canceller* canceller = nullptr;
  if (interruptible) {
    watch = [&] {
      if (interrupted) return;
      PyEval_RestoreThread(state);
      interrupted = PyErr_CheckSignals() != 0;
      state = PyEval_SaveThread();
      if (interrupted) canceller->Cancel();
    };
  }
  tessera::Canceller cancel(std::move(watch), absl::Milliseconds(50));
  canceller = &cancel;
  state = PyEval_SaveThread();
  work(&cancel);
  PyEval_RestoreThread(state);
  return !interrupted;
}

// PyObject_HEAD is a member declaration with its own semicolon.
// clang-format off
struct ChannelObject {
  PyObject_HEAD
  // Null after close(). Each call takes its own reference (with the GIL held), so close() in
  // one thread never destroys the client under a transfer of another.
  std::shared_ptr<tessera::Client>* client;
};
// clang-format on

std::shared_ptr<tessera::Client> ClientOf(ChannelObject* self) {
  if (self->client == nullptr || *self->client == nullptr) {
    PyErr_SetString(PyExc_ValueError, "the channel is closed");
    return nullptr;
  }
  return *self->client;
}

// Channel(address, token, tls, root_certificates, private_key, certificate_chain, timeout,
// follow_home): the PEM arguments are bytes or None, `timeout` seconds (< 0: no deadline).
int ChannelInit(PyObject* object, PyObject* args, PyObject* kwargs) {
  auto* self = reinterpret_cast<ChannelObject*>(object);
  static const char* keywords[] = {"address",           "token",       "tls",
                                   "root_certificates", "private_key", "certificate_chain",
                                   "timeout",           "follow_home", nullptr};
  const char* address = nullptr;
  const char* token = nullptr;
  int tls = 0;
  const char* ca = nullptr;
  Py_ssize_t ca_size = 0;
  const char* key = nullptr;
  Py_ssize_t key_size = 0;
  const char* chain = nullptr;
  Py_ssize_t chain_size = 0;
  double timeout = -1;
  int follow_home = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ssp|z#z#z#dp", const_cast<char**>(keywords),
                                   &address, &token, &tls, &ca, &ca_size, &key, &key_size, &chain,
                                   &chain_size, &timeout, &follow_home)) {
    return -1;
  }
  tessera::ClientOptions options;
  options.address = address;
  options.token = token;
  options.tls = tls != 0;
  if (ca != nullptr) options.tls_ca_pem.assign(ca, static_cast<size_t>(ca_size));
  if (key != nullptr) options.tls_key_pem.assign(key, static_cast<size_t>(key_size));
  if (chain != nullptr) options.tls_cert_pem.assign(chain, static_cast<size_t>(chain_size));
  options.timeout = timeout < 0 ? absl::InfiniteDuration() : absl::Seconds(timeout);
  options.follow_home = follow_home != 0;
  options.use_regions = false;  // the package keeps its own region (tessera/_regions.py)
  absl::StatusOr<std::unique_ptr<tessera::Client>> client;
  PyThreadState* state = PyEval_SaveThread();
  client = tessera::Client::Connect(std::move(options));  // with follow_home: one Locate
  PyEval_RestoreThread(state);
  if (!client.ok()) {
    RaiseStatus(client.status());
    return -1;
  }
  std::shared_ptr<tessera::Client>* old = self->client;
  self->client = new std::shared_ptr<tessera::Client>(*std::move(client));
  if (old != nullptr) {
    state = PyEval_SaveThread();
    delete old;
    PyEval_RestoreThread(state);
  }
  return 0;
}

void ChannelDealloc(PyObject* object) {
  auto* self = reinterpret_cast<ChannelObject*>(object);
  std::shared_ptr<tessera::Client>* client = self->client;
  self->client = nullptr;
  if (client != nullptr) {
    PyThreadState* state = PyEval_SaveThread();
    delete client;  // shuts the channel down
    PyEval_RestoreThread(state);
  }
  PyTypeObject* type = Py_TYPE(object);
  type->tp_free(object);
  Py_DECREF(type);
}

// close(): lets go of the client; transfers in flight on other threads finish first.
PyObject* ChannelClose(PyObject* object, PyObject*) {
  auto* self = reinterpret_cast<ChannelObject*>(object);
  if (self->client != nullptr) {
    std::shared_ptr<tessera::Client> client = std::move(*self->client);
    PyThreadState* state = PyEval_SaveThread();
    client.reset();
    PyEval_RestoreThread(state);
  }
  Py_RETURN_NONE;
}

// upload(spec, data, chunk_bytes, interruptible) -> bytes: a new tensor of TensorSpec `spec`
// (serialized) from `data` (any C-contiguous buffer), streamed in `chunk_bytes` chunks sent
// from the buffer where it lies; returns the TensorInfo, serialized. `interruptible`: see
// RunReleased (the package passes True on the main thread).
PyObject* ChannelUpload(PyObject* object, PyObject* args) {
  const char* spec_bytes = nullptr;
  Py_ssize_t spec_size = 0;
  Py_buffer data;
  Py_ssize_t chunk_bytes = 0;
  int interruptible = 0;
  if (!PyArg_ParseTuple(args, "y#y*n|p", &spec_bytes, &spec_size, &data, &chunk_bytes,
                        &interruptible)) {
    return nullptr;
  }
  std::shared_ptr<tessera::Client> client = ClientOf(reinterpret_cast<ChannelObject*>(object));
  tessera::v1::TensorSpec spec;
  if (client == nullptr || chunk_bytes <= 0 ||
      !spec.ParseFromArray(spec_bytes, static_cast<int>(spec_size))) {
    PyBuffer_Release(&data);
    if (client == nullptr) return nullptr;
    return RaiseStatus(absl::InvalidArgumentError(chunk_bytes <= 0 ? "chunk_bytes must be > 0"
                                                                   : "spec is not a TensorSpec"));
  }
  absl::StatusOr<tessera::v1::TensorInfo> info;
  const absl::string_view bytes(static_cast<const char*>(data.buf), static_cast<size_t>(data.len));
  const bool ran = RunReleased(interruptible != 0, [&](tessera::Canceller* cancel) {
    info = client->Upload(spec, bytes, static_cast<size_t>(chunk_bytes), nullptr, cancel);
  });
  PyBuffer_Release(&data);
  if (!ran) return nullptr;
  if (!info.ok()) return RaiseStatus(info.status());
  const std::string out = info->SerializeAsString();
  return PyBytes_FromStringAndSize(out.data(), static_cast<Py_ssize_t>(out.size()));
}

// download(handle, chunk_bytes, allocate, interruptible) -> (bytes, buffer): the whole
// tensor, read in `chunk_bytes` chunks (0: the server's default) into `allocate(n)`, a
// writable C-contiguous buffer of at least n bytes that `allocate` returns once the server has
// said n (called with the GIL, before any byte is written). Returns the TensorInfo
// (serialized) and that buffer. An exception of `allocate` cancels the call and is raised.
PyObject* ChannelDownload(PyObject* object, PyObject* args) {
  const char* handle = nullptr;
  Py_ssize_t handle_size = 0;
  Py_ssize_t chunk_bytes = 0;
  PyObject* allocate = nullptr;
  int interruptible = 0;
  if (!PyArg_ParseTuple(args, "s#nO|p", &handle, &handle_size, &chunk_bytes, &allocate,
                        &interruptible)) {
    return nullptr;
  }
  std::shared_ptr<tessera::Client> client = ClientOf(reinterpret_cast<ChannelObject*>(object));
  if (client == nullptr) return nullptr;
  if (!PyCallable_Check(allocate)) {
    PyErr_SetString(PyExc_TypeError, "allocate must be callable");
    return nullptr;
  }
  if (chunk_bytes < 0 ||
      static_cast<uint64_t>(chunk_bytes) > std::numeric_limits<uint32_t>::max()) {
    return RaiseStatus(absl::InvalidArgumentError("chunk_bytes must be in [0, 2^32)"));
  }
  PyObject* buffer = nullptr;  // what `allocate` returned, with `view` of it held
  Py_buffer view;
  bool viewing = false;
  PyObject* raised[3] = {nullptr, nullptr, nullptr};  // `allocate`'s exception, raised after
  auto let_go = [&] {
    if (viewing) PyBuffer_Release(&view);
    viewing = false;
    Py_CLEAR(buffer);
  };
  // Called on this thread, whose GIL RunReleased let go of.
  auto destination = [&](const tessera::v1::TensorInfo&, uint64_t bytes) -> absl::StatusOr<char*> {
    const PyGILState_STATE gil = PyGILState_Ensure();
    if (PyErr_Occurred() != nullptr) {  // a signal handler's: the call is being cancelled
      PyGILState_Release(gil);
      return absl::CancelledError("interrupted");
    }
    let_go();  // an earlier attempt's (the call ran again after a redirect)
    absl::StatusOr<char*> out = absl::CancelledError("allocate raised an exception");
    buffer = PyObject_CallFunction(allocate, "K", static_cast<unsigned long long>(bytes));
    if (buffer != nullptr && PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE) == 0) {
      viewing = true;
      if (static_cast<uint64_t>(view.len) < bytes) {
        out = absl::InvalidArgumentError("allocate returned a buffer smaller than asked");
      } else {
        out = static_cast<char*>(view.buf);
      }
    }
    if (PyErr_Occurred() != nullptr) {
      for (PyObject*& part : raised) Py_CLEAR(part);
      PyErr_Fetch(&raised[0], &raised[1], &raised[2]);
    }
    PyGILState_Release(gil);
    return out;
  };
  absl::StatusOr<tessera::v1::TensorInfo> info;
  const bool ran = RunReleased(interruptible != 0, [&](tessera::Canceller* cancel) {
    info =
        client->DownloadTo(absl::string_view(handle, static_cast<size_t>(handle_size)), destination,
                           0, 0, static_cast<uint32_t>(chunk_bytes), nullptr, cancel);
  });
  if (!ran || raised[0] != nullptr) {
    let_go();
    if (ran) {
      PyErr_Restore(raised[0], raised[1], raised[2]);
    } else {
      for (PyObject*& part : raised) Py_CLEAR(part);  // the signal's exception wins
    }
    return nullptr;
  }
  if (!info.ok()) {
    let_go();
    return RaiseStatus(info.status());
  }
  const std::string out = info->SerializeAsString();
  PyObject* result = Py_BuildValue("(y#O)", out.data(), static_cast<Py_ssize_t>(out.size()),
                                   buffer != nullptr ? buffer : Py_None);
  let_go();
  return result;
}

// address() -> str: where the channel's calls go now: its address, or the tenant's home after
// the library followed the tenant there (follow_home).
PyObject* ChannelAddress(PyObject* object, PyObject*) {
  std::shared_ptr<tessera::Client> client = ClientOf(reinterpret_cast<ChannelObject*>(object));
  if (client == nullptr) return nullptr;
  const std::string address = client->address();
  return PyUnicode_FromStringAndSize(address.data(), static_cast<Py_ssize_t>(address.size()));
}

PyMethodDef kChannelMethods[] = {
    {"upload", ChannelUpload, METH_VARARGS,
     "upload(spec, data, chunk_bytes, interruptible=False) -> bytes: WriteTensor from a buffer."},
    {"download", ChannelDownload, METH_VARARGS,
     "download(handle, chunk_bytes, allocate, interruptible=False) -> (bytes, buffer): "
     "ReadTensor into a buffer."},
    {"address", ChannelAddress, METH_NOARGS,
     "address() -> str: where calls go now (the tenant's home, once followed)."},
    {"close", ChannelClose, METH_NOARGS, "close(): lets go of the connection."},
    {nullptr, nullptr, 0, nullptr},
};

PyType_Slot kChannelSlots[] = {
    {Py_tp_new, reinterpret_cast<void*>(&PyType_GenericNew)},
    {Py_tp_init, reinterpret_cast<void*>(&ChannelInit)},
    {Py_tp_dealloc, reinterpret_cast<void*>(&ChannelDealloc)},
    {Py_tp_methods, kChannelMethods},
    {Py_tp_doc, const_cast<char*>("A connection of the C++ client library to one address.")},
    {0, nullptr},
};

PyType_Spec kChannelSpec = {
    "tessera._native.Channel", sizeof(ChannelObject), 0, Py_TPFLAGS_DEFAULT, kChannelSlots,
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT,
    "tessera._native",
    "Bulk transfers of the tessera package through the C++ client library.",
    -1,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__native() {
  PyObject* module = PyModule_Create(&kModule);
  if (module == nullptr) return nullptr;
  g_error = PyErr_NewException("tessera._native.Error", nullptr, nullptr);
  PyObject* channel = PyType_FromSpec(&kChannelSpec);
  // PyModule_AddObject steals a reference when it succeeds (PyModule_AddObjectRef is 3.10+).
  Py_XINCREF(g_error);
  if (g_error == nullptr || channel == nullptr ||
      PyModule_AddObject(module, "Error", g_error) < 0) {
    Py_XDECREF(g_error);
    Py_XDECREF(channel);
    Py_DECREF(module);
    return nullptr;
  }
  if (PyModule_AddObject(module, "Channel", channel) < 0) {
    Py_DECREF(channel);
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
