#!/usr/bin/env bash
# Builds the installed Debian Abseil and gRPC again, each from its own Debian source package
# (same version, same Debian patches and options, same sonames), with -fsanitize=thread, into
# BUILD_DIR/tsan-deps/lib for the tsan preset (tests/tsan/tsan.cmake).
#
# Why: ThreadSanitizer sees only the synchronization of instrumented code. Debian's Abseil
# hides every absl::Mutex (ours, and gRPC's: gpr_mu and grpc_core::Mutex are absl::Mutex), and
# Debian's gRPC hides how it hands a call's memory and reactors from thread to thread (arenas,
# atomics, lock-free queues); both show up as races in our code and in gRPC's inline headers.
# With the same sonames, the dynamic loader uses these copies in place of Debian's: one Abseil
# and one gRPC in each process. Protobuf, re2, c-ares, OpenSSL and gRPC's reflection service
# stay Debian's (see tests/tsan/suppressions.txt).
#
# Usage: tests/tsan/build_deps.sh [BUILD_DIR]   (default: build-tsan in the source tree)
# Needs libabsl-dev and libgrpc++-dev (with their build dependencies, all installed beside
# them), dpkg-dev, and a Debian mirror ($DEBIAN_MIRROR, default http://deb.debian.org) for
# `apt-get source`. No root; the system's apt configuration is left alone. A package already
# built from its installed version is skipped. $JOBS: parallel compile jobs (default 2).
set -euo pipefail

source_root=$(cd "$(dirname "$0")/../.." && pwd)
build_dir=$(realpath -m "${1:-$source_root/build-tsan}")
prefix=$build_dir/tsan-deps
work=$build_dir/tsan-deps-build
mirror=${DEBIAN_MIRROR:-http://deb.debian.org}
jobs=${JOBS:-2}
flags="-fsanitize=thread -fno-omit-frame-pointer"
# Every library finds its siblings beside itself, wherever the build directory is.
rpath=(-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON "-DCMAKE_INSTALL_RPATH=\$ORIGIN")

installed_version() {  # the source version of an installed binary package
  dpkg-query -W -f='${source:Version}' "$1" 2>/dev/null ||
    { echo "build_deps.sh: $1 is not installed (deploy/install-deps.sh)" >&2; exit 1; }
}

up_to_date() {  # package version
  [[ -f $prefix/$1.version && $(<"$prefix/$1.version") == "$2" ]] &&
    echo "build_deps.sh: $1 $2 with -fsanitize=thread is in $prefix already"
}

fetch_source() {  # package version -> prints the unpacked source directory
  local apt=$work/apt
  if [[ ! -d $apt/lists ]]; then
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
    . /etc/os-release
    printf 'deb-src %s %s main\n' "$mirror/debian" "$VERSION_CODENAME" \
      "$mirror/debian" "$VERSION_CODENAME-updates" \
      "$mirror/debian-security" "$VERSION_CODENAME-security" > "$apt/sources.list"
  fi
  local options=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o "APT::Sandbox::User=$(id -un)")
  [[ -f $apt/updated ]] || { apt-get "${options[@]}" -qq update >&2 && touch "$apt/updated"; }
  rm -rf "${work:?}/$1" && mkdir -p "$work/$1"
  (cd "$work/$1" && apt-get "${options[@]}" -qq source --only-source "$1=$2" >&2)
  find "$work/$1" -mindepth 1 -maxdepth 1 -type d
}

mkdir -p "$prefix"

# 1. Abseil: Debian's shared-library configuration (debian/rules: C++17, shared, build type
#    None), installed whole (headers, CMake package) for our build to find.
absl_version=$(installed_version libabsl-dev)
if ! up_to_date abseil "$absl_version"; then
  src=$(fetch_source abseil "$absl_version")
  cmake -S "$src" -B "$work/abseil/build" -G Ninja -Wno-dev \
    -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON -DBUILD_TESTING=OFF \
    -DCMAKE_CXX_FLAGS="-g -O2 $flags" -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib "${rpath[@]}"
  cmake --build "$work/abseil/build" -j "$jobs"
  cmake --install "$work/abseil/build" > /dev/null
  echo "$absl_version" > "$prefix/abseil.version"
  rm -f "$prefix/grpc.version"  # gRPC is built against this Abseil
fi

# 2. gRPC: Debian's provider options (debian/rules), against the Abseil above; only the
#    runtime libraries (gpr, grpc, grpc++ and the upb and address_sorting they need). Headers,
#    protoc plugin and CMake package stay Debian's: same version, same code.
grpc_version=$(installed_version libgrpc++-dev)
if ! up_to_date grpc "$grpc_version"; then
  src=$(fetch_source grpc "$grpc_version")
  cmake -S "$src" -B "$work/grpc/build" -G Ninja -Wno-dev \
    -DCMAKE_BUILD_TYPE=None -DBUILD_SHARED_LIBS=ON -DgRPC_BUILD_TESTS=OFF \
    -DgRPC_BUILD_CODEGEN=OFF -DgRPC_BUILD_CSHARP_EXT=OFF \
    -DgRPC_ABSL_PROVIDER=package -DgRPC_CARES_PROVIDER=package -DgRPC_PROTOBUF_PROVIDER=package \
    -DgRPC_RE2_PROVIDER=package -DgRPC_SSL_PROVIDER=package -DgRPC_ZLIB_PROVIDER=package \
    -DgRPC_BACKWARDS_COMPATIBILITY_MODE=OFF -Dabsl_DIR="$prefix/lib/cmake/absl" \
    -DProtobuf_PROTOC_LIBRARY=unused-the-plugins-are-not-built \
    -DCMAKE_C_FLAGS="-g1 -O1 $flags" -DCMAKE_CXX_FLAGS="-g1 -O1 $flags" \
    -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread "${rpath[@]}"
  cmake --build "$work/grpc/build" -j "$jobs" --target grpc++
  find "$work/grpc/build" -maxdepth 1 \( -name 'libgpr.so*' -o -name 'libgrpc.so*' \
    -o -name 'libgrpc++.so*' -o -name 'libupb.so*' -o -name 'libaddress_sorting.so*' \) \
    -exec cp -P {} "$prefix/lib/" \;
  echo "$grpc_version" > "$prefix/grpc.version"
fi

rm -rf "$work"
echo "build_deps.sh: Abseil $absl_version and gRPC $grpc_version with -fsanitize=thread in $prefix"
