#!/usr/bin/env bash
# Checks the public contract, proto/tessera/v1, with buf (proto/buf.yaml; docs/api.md, "API
# contract"):
#   tests/api/check_proto.sh              buf lint, and buf breaking against the released proto
#   tests/api/check_proto.sh --self-test  buf breaking reports each of a set of deliberate
#                                         breaks made to a scratch copy of proto/
# Exits 1 with buf's findings, or when buf cannot be installed (no npm, registry unreachable):
# never skips. buf comes from npm, pinned, installed once into $TESSERA_BUF_DIR (default
# ~/.cache/tessera/buf-<version>; ctest uses the build tree); later runs reuse it.
set -euo pipefail

buf_version=1.75.0
# The released contract: main at the last landed stop (de69932, issue 17), whose proto the
# C++ client, the CLI and the Python client were released against; proto/ has not changed
# since 7b7c0d9 (issue 16). There are no release tags yet, and a clone may lack tags anyway:
# move this to the release commit at each release.
released=de699327f8e6eb6835995f138cce66ad9fc6d9c3

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
buf_dir=${TESSERA_BUF_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/buf-$buf_version}
buf=$buf_dir/node_modules/.bin/buf
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

fail() {
  echo "check_proto: $*" >&2
  exit 1
}

# Installs @bufbuild/buf $buf_version into $buf_dir unless it is there already.
install_buf() {
  [[ -x $buf && $("$buf" --version 2>/dev/null) == "$buf_version" ]] && return
  command -v npm >/dev/null || fail "npm is not installed (deploy/install-deps.sh installs it)"
  mkdir -p "$buf_dir"
  # One installer at a time: ctest runs both api tests at once.
  exec {lock}>"$buf_dir/.lock"
  flock "$lock"
  if ! [[ -x $buf && $("$buf" --version 2>/dev/null) == "$buf_version" ]]; then
    npm install --prefix "$buf_dir" --no-save --no-package-lock --no-audit --no-fund \
      --loglevel=error --include=optional --fetch-retries=2 --fetch-retry-mintimeout=2000 \
      --fetch-retry-maxtimeout=10000 "@bufbuild/buf@$buf_version" >"$scratch/npm.log" 2>&1 || {
      cat "$scratch/npm.log" >&2
      fail "could not install @bufbuild/buf@$buf_version with npm into $buf_dir" \
        "(is the npm registry reachable? this check needs it once per build tree)"
    }
    [[ $("$buf" --version 2>/dev/null) == "$buf_version" ]] ||
      fail "npm installed @bufbuild/buf, but $buf does not run as version $buf_version"
  fi
  exec {lock}>&-
}

check_contract() {
  "$buf" lint proto || fail "buf lint: the findings above (rules: proto/buf.yaml)"
  echo "buf lint: ok"
  git cat-file -e "$released^{commit}" 2>/dev/null ||
    fail "the released contract, commit $released, is not in this checkout: the breaking" \
      "check needs a git clone with full history (git fetch --unshallow)"
  git archive "$released" proto | tar -x -C "$scratch"
  "$buf" breaking proto --against "$scratch/proto" ||
    fail "buf breaking: the changes above break clients of the contract released at" \
      "${released:0:7} (category FILE, proto/buf.yaml)"
  echo "buf breaking: ok against ${released:0:7}"
}

# Makes break $1 in the copy of proto/ at $2. Each is a change clients would notice.
break_copy() {
  local v1=$2/tessera/v1
  case $1 in
    FIELD_NO_DELETE)  # a field's number changed (the wire encoding)
      sed -i 's/^  uint64 device_memory_bytes = 1;/  uint64 device_memory_bytes = 16;/' \
        "$v1/tenant_admin.proto" ;;
    FIELD_SAME_TYPE)  # a field's type changed
      sed -i 's/^  uint64 released_bytes = 1;/  int64 released_bytes = 1;/' "$v1/compute.proto" ;;
    FIELD_SAME_JSON_NAME)  # a field renamed, same number (JSON and generated code)
      sed -i "s/^  string api_key = 2;/  string key = 2;/" "$v1/tenant_admin.proto" ;;
    ENUM_VALUE_SAME_NAME)  # an enum value renamed (JSON carries the name)
      sed -i 's/^  DTYPE_BOOL = 8;/  DTYPE_BOOLEAN = 8;/' "$v1/compute.proto" ;;
    RPC_NO_DELETE)  # an RPC removed
      sed -i '/^  rpc GetUsage(/d' "$v1/compute.proto" ;;
    MESSAGE_NO_DELETE)  # a message moved to another file (the C++ header that declares it)
      sed -i '/^message GetUsageRequest {}$/d' "$v1/compute.proto"
      echo 'message GetUsageRequest {}' >>"$v1/tenant_admin.proto"
      sed -i 's/^  rpc GetUsage(GetUsageRequest)/  rpc GetUsage(tessera.v1.GetUsageRequest)/' \
        "$v1/compute.proto"
      sed -i '/^package tessera.v1;$/a import "tessera/v1/tenant_admin.proto";' "$v1/compute.proto"
      ;;
  esac
}

self_test() {
  local rule copy out line
  for rule in FIELD_NO_DELETE FIELD_SAME_TYPE FIELD_SAME_JSON_NAME ENUM_VALUE_SAME_NAME \
    RPC_NO_DELETE MESSAGE_NO_DELETE; do
    copy=$scratch/$rule
    cp -r proto "$copy"
    break_copy "$rule" "$copy"
    diff -rq proto "$copy" >/dev/null && fail "self-test $rule: the break changed nothing" \
      "(its sed no longer matches proto/; update break_copy)"
    if out=$("$buf" breaking "$copy" --against proto --error-format=msvs 2>&1); then
      fail "self-test $rule: buf breaking passed a broken copy of proto/"
    fi
    # msvs lines: path(line,column) : error RULE : message
    line=$(grep -m1 " error $rule : " <<<"$out") || {
      echo "$out" >&2
      fail "self-test $rule: buf breaking failed, but without reporting $rule"
    }
    echo "caught: ${line#"$copy/"}"
  done
}

case ${1:-} in
  "") install_buf && check_contract ;;
  --self-test) install_buf && self_test ;;
  *) fail "usage: $0 [--self-test]" ;;
esac
