#ifndef TESSERA_TESTS_TESTING_FAKE_MPS_H_
#define TESSERA_TESTS_TESTING_FAKE_MPS_H_

// The fake nvidia-cuda-mps-control (tests/testing/fake_mps/) with a temporary pipe directory.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <grp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gtest/gtest.h"

#include "server/mps/control_client.h"

namespace tessera::testing {

/// A file's whole text ("" when it cannot be read).
inline std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// The fake's directory; tests put it first on PATH (FakeMps does in its constructor).
inline std::string FakeMpsBinDir() { return TESSERA_FAKE_MPS_DIR; }

inline void PutFakeMpsOnPath() {
  const char* path = std::getenv("PATH");
  std::string current = path == nullptr ? "" : path;
  if (current.rfind(FakeMpsBinDir(), 0) != 0) {
    setenv("PATH", (FakeMpsBinDir() + ":" + current).c_str(), 1);
  }
}

/// A process that looks like a control daemon to the probe (argv[0] is
/// nvidia-cuda-mps-control), optionally of another user; killed and reaped on destruction.
class StandInDaemon {
 public:
  explicit StandInDaemon(uid_t uid = 0, gid_t gid = 0) {
    const bool other_user = uid != 0;
    pid_ = fork();
    if (pid_ == 0) {
      if (other_user && (setgroups(0, nullptr) != 0 || setresgid(gid, gid, gid) != 0 ||
                         setresuid(uid, uid, uid) != 0)) {
        _exit(126);
      }
      execlp("sleep", "nvidia-cuda-mps-control", "60", static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~StandInDaemon() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  StandInDaemon(const StandInDaemon&) = delete;
  StandInDaemon& operator=(const StandInDaemon&) = delete;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

class FakeMps {
 public:
  FakeMps() {
    PutFakeMpsOnPath();
    char pattern[] = "/tmp/tessera-fake-mps-XXXXXX";
    dir_ = mkdtemp(pattern);
  }
  ~FakeMps() {
    if (started_) {
      std::filesystem::remove(dir_ + "/fake_mode");  // so a hung or crashing fake can quit
      (void)Client().Quit();
    }
    std::filesystem::remove_all(dir_);
  }
  /// Starts the fake daemon in the pipe directory.
  void Start() {
    std::string command = "CUDA_MPS_PIPE_DIRECTORY=" + dir_ + " nvidia-cuda-mps-control -d";
    ASSERT_EQ(std::system(command.c_str()), 0);
    started_ = true;
  }
  void Write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ + "/" + name) << text;
  }
  std::string Read(const std::string& name) const { return ReadText(dir_ + "/" + name); }
  MpsControlClient Client() const { return MpsControlClient({.pipe_directory = dir_}); }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  bool started_ = false;
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_FAKE_MPS_H_
