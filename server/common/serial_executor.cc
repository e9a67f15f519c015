#include "server/common/serial_executor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera {

SerialExecutor::SerialExecutor(std::string name, size_t max_pending, int threads)
    : name_(std::move(name)), max_pending_(max_pending) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Loop(); });
}

SerialExecutor::~SerialExecutor() { Stop(); }

absl::Status SerialExecutor::Schedule(absl::AnyInvocable<void() &&> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError(absl::StrCat(name_, " is shutting down"));
  if (tasks_.size() >= max_pending_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name_, " queue is full (", max_pending_, " pending); retry later"));
  }
  tasks_.push_back(std::move(task));
  return absl::OkStatus();
}

void SerialExecutor::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

bool SerialExecutor::HasWorkOrStopping() const { return stopping_ || !tasks_.empty(); }

void SerialExecutor::Loop() {
  for (;;) {
    absl::AnyInvocable<void() &&> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &SerialExecutor::HasWorkOrStopping));
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    std::move(task)();
  }
}

}  // namespace tessera
