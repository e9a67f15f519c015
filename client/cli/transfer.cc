#include "client/cli/transfer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include <unistd.h>

#include "absl/strings/str_cat.h"

#include "common/fd_io.h"
#include "tessera/client.h"

// Client::Upload and Client::Download take and return the whole tensor as one string: for a
// file or a pipe that is one more copy of all of it (and its page faults). These use the
// client's channel and context (Client::channel, Client::NewContext) with the same protocol.
namespace tessera::cli {
namespace {

// Reads until `size` bytes or the end of the stream; how many, or -1 with errno set.
ssize_t ReadUpTo(int fd, char* data, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = read(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(done);
}

std::string WrongSize(const std::string& name, const NpyHeader& header, const std::string& got) {
  return absl::StrCat(name, ": .npy data is ", got, " bytes; shape ", header.shape_text, " of ",
                      header.descr, " needs ", header.data_bytes);
}

// Writes all `size` bytes at `data`; false on a write error (errno set).
bool WriteBytes(int fd, const char* data, uint64_t size) {
  uint64_t done = 0;
  while (done < size) {
    const ssize_t n = write(fd, data + done, static_cast<size_t>(size - done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    done += static_cast<uint64_t>(n);
  }
  return true;
}

}  // namespace

Transfer UploadFrom(Session& s, const NpyHeader& header, int fd, const std::string& name,
                    size_t chunk_bytes) {
  Transfer transfer;
  std::unique_ptr<v1::Compute::Stub> stub = v1::Compute::NewStub(s.client().channel());
  std::unique_ptr<grpc::ClientContext> context = s.client().NewContext();
  std::unique_ptr<grpc::ClientWriter<v1::WriteTensorRequest>> writer =
      stub->WriteTensor(context.get(), &transfer.info);
  v1::WriteTensorRequest message;
  v1::TensorSpec* spec = message.mutable_header()->mutable_create();
  spec->set_dtype(header.dtype);
  spec->mutable_shape()->Add(header.shape.begin(), header.shape.end());
  bool open = writer->Write(message);
  const Client::Progress progress = s.ProgressBar("put", header.data_bytes);
  // The chunk's bytes are read into the message itself; its buffer is reused.
  std::string* data = message.mutable_chunk()->mutable_data();
  uint64_t done = 0;
  while (open && done < header.data_bytes) {
    data->resize(static_cast<size_t>(std::min<uint64_t>(chunk_bytes, header.data_bytes - done)));
    const ssize_t got = ReadUpTo(fd, data->data(), data->size());
    if (got < 0) {
      transfer.local_error = absl::StrCat(name, ": read failed: ", std::strerror(errno));
      break;
    }
    if (static_cast<size_t>(got) < data->size()) {
      transfer.local_error = WrongSize(name, header, absl::StrCat(done + got));
      break;
    }
    message.mutable_chunk()->set_offset(done);
    open = writer->Write(message, grpc::WriteOptions().set_buffer_hint());
    done += static_cast<uint64_t>(got);
    if (progress) progress(done, header.data_bytes);
  }
  char extra;
  if (transfer.local_error.empty() && open && ReadUpTo(fd, &extra, 1) > 0) {
    transfer.local_error = WrongSize(name, header, absl::StrCat("more than ", header.data_bytes));
  }
  if (!transfer.local_error.empty()) context->TryCancel();
  writer->WritesDone();
  transfer.status = FromGrpcStatus(writer->Finish(), *context);
  return transfer;
}

Transfer DownloadTo(Session& s, const std::string& handle, size_t chunk_bytes, int fd,
                    const std::string& name) {
  Transfer transfer;
  std::unique_ptr<v1::Compute::Stub> stub = v1::Compute::NewStub(s.client().channel());
  std::unique_ptr<grpc::ClientContext> context = s.client().NewContext();
  v1::ReadTensorRequest request;
  request.set_handle(handle);
  request.set_chunk_bytes(static_cast<uint32_t>(chunk_bytes));
  std::unique_ptr<grpc::ClientReader<v1::ReadTensorResponse>> reader =
      stub->ReadTensor(context.get(), request);
  v1::ReadTensorResponse message;
  Client::Progress progress;
  uint64_t done = 0;
  bool started = false;
  while (transfer.local_error.empty() && reader->Read(&message)) {
    if (message.has_info()) {  // the first message: write the .npy header
      transfer.info = message.info();
      const std::vector<int64_t> shape(transfer.info.shape().begin(), transfer.info.shape().end());
      absl::StatusOr<std::string> header = FormatNpyHeader(transfer.info.dtype(), shape);
      if (!header.ok()) {
        transfer.local_error = std::string(header.status().message());
      } else if (!WriteAll(fd, *header)) {
        transfer.local_error = absl::StrCat(name, ": write failed: ", std::strerror(errno));
      }
      progress = s.ProgressBar("get", transfer.info.size_bytes());
      started = true;
    }
    const std::string& data = message.chunk().data();
    if (!transfer.local_error.empty() || data.empty()) continue;
    if (!started || message.chunk().offset() != done) {
      transfer.local_error = "the server sent the tensor's chunks out of order";
    } else if (!WriteAll(fd, data)) {
      transfer.local_error = absl::StrCat(name, ": write failed: ", std::strerror(errno));
    } else {
      done += data.size();
      if (progress) progress(done, transfer.info.size_bytes());
    }
  }
  if (!transfer.local_error.empty()) context->TryCancel();
  transfer.status = FromGrpcStatus(reader->Finish(), *context);
  if (transfer.local_error.empty() && transfer.status.ok() &&
      (!started || done != transfer.info.size_bytes())) {
    transfer.status = absl::DataLossError(absl::StrCat("ReadTensor ended after ", done, " of ",
                                                       transfer.info.size_bytes(), " bytes"));
  }
  return transfer;
}

std::optional<Transfer> UploadThroughRegion(Session& s, const NpyHeader& header, int fd,
                                            const std::string& name, size_t chunk_bytes) {
  if (header.data_bytes == 0) return std::nullopt;  // nothing to share
  Transfer transfer;
  absl::StatusOr<std::optional<Client::RegionLease>> lease =
      s.client().LeaseTransferRegion(header.data_bytes);
  if (!lease.ok()) {
    transfer.status = lease.status();
    return transfer;
  }
  if (!lease->has_value()) return std::nullopt;
  const Client::RegionLease& region = **lease;
  const Client::Progress progress = s.ProgressBar("put", header.data_bytes);
  uint64_t done = 0;
  while (done < header.data_bytes) {
    const size_t want =
        static_cast<size_t>(std::min<uint64_t>(chunk_bytes, header.data_bytes - done));
    const ssize_t got = ReadUpTo(fd, region.data() + done, want);
    if (got < 0) {
      transfer.local_error = absl::StrCat(name, ": read failed: ", std::strerror(errno));
      return transfer;
    }
    done += static_cast<uint64_t>(got);
    if (static_cast<size_t>(got) < want) {
      transfer.local_error = WrongSize(name, header, absl::StrCat(done));
      return transfer;
    }
    if (progress && done < header.data_bytes) progress(done, header.data_bytes);
  }
  char extra;
  if (ReadUpTo(fd, &extra, 1) > 0) {
    transfer.local_error = WrongSize(name, header, absl::StrCat("more than ", header.data_bytes));
    return transfer;
  }
  v1::WriteTensorFromRegionRequest request;
  v1::TensorSpec* spec = request.mutable_create();
  spec->set_dtype(header.dtype);
  spec->mutable_shape()->Add(header.shape.begin(), header.shape.end());
  request.set_region(region.region().handle());
  request.set_length(header.data_bytes);
  absl::StatusOr<v1::TensorInfo> written = s.client().WriteTensorFromRegion(request);
  if (!written.ok()) {
    transfer.status = written.status();
    return transfer;
  }
  transfer.info = *std::move(written);
  if (progress) progress(header.data_bytes, header.data_bytes);
  return transfer;
}

std::optional<Transfer> DownloadThroughRegion(Session& s, const std::string& handle, int fd,
                                              const std::string& name) {
  Transfer transfer;
  // The size first, for the region; the .npy header comes from what the read returns.
  absl::StatusOr<v1::TensorInfo> info = s.client().GetTensor(handle);
  if (!info.ok()) {
    transfer.status = info.status();
    return transfer;
  }
  if (info->size_bytes() == 0) return std::nullopt;  // nothing to share
  absl::StatusOr<std::optional<Client::RegionLease>> lease =
      s.client().LeaseTransferRegion(info->size_bytes());
  if (!lease.ok()) {
    transfer.status = lease.status();
    return transfer;
  }
  if (!lease->has_value()) return std::nullopt;
  const Client::RegionLease& region = **lease;
  const Client::Progress progress = s.ProgressBar("get", info->size_bytes());
  absl::StatusOr<v1::ReadTensorIntoRegionResponse> read =
      s.client().DownloadIntoRegion(handle, region.region());
  if (!read.ok()) {
    transfer.status = read.status();
    return transfer;
  }
  transfer.info = read->info();
  const std::vector<int64_t> shape(transfer.info.shape().begin(), transfer.info.shape().end());
  absl::StatusOr<std::string> header = FormatNpyHeader(transfer.info.dtype(), shape);
  if (!header.ok()) {
    transfer.local_error = std::string(header.status().message());
  } else if (!WriteAll(fd, *header) || !WriteBytes(fd, region.data(), read->bytes())) {
    transfer.local_error = absl::StrCat(name, ": write failed: ", std::strerror(errno));
  } else if (progress) {
    progress(read->bytes(), read->bytes());
  }
  return transfer;
}

}  // namespace tessera::cli
