#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/seed-*).

Text seeds are written as they are; the structured ones are text-format protos of
tests/fuzz/fuzz_inputs.proto encoded by `protoc --encode`. Reproducers of findings
(corpus/<target>/crash-*) are kept; only seed-* files are rewritten. Run from anywhere:

  tests/fuzz/make_seeds.py
"""
import base64
import os
import pathlib
import shutil
import sqlite3
import struct
import subprocess
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CORPUS = HERE / "corpus"


def npy(descr, shape, data, version=1, fortran=False):
    shape_text = "(%s)" % ("".join("%d," % d for d in shape) if len(shape) == 1
                           else ", ".join(str(d) for d in shape))
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (
        descr, "True" if fortran else "False", shape_text)
    prefix = 10 if version == 1 else 12
    header += " " * ((64 - (prefix + len(header) + 1) % 64) % 64) + "\n"
    length = struct.pack("<H" if version == 1 else "<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header.encode() + data


def b64url(text):
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def state_db():
    """A small state file as a server of schema 2 writes it (rollback journal, no WAL)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "tenants.db")
        db = sqlite3.connect(path)
        db.executescript("""
          PRAGMA page_size = 512;
          CREATE TABLE tenants (id TEXT PRIMARY KEY, display_name TEXT NOT NULL,
            device_memory_bytes INTEGER NOT NULL, compute_share_percent INTEGER NOT NULL,
            max_streams INTEGER NOT NULL, max_queued_jobs INTEGER NOT NULL,
            priority INTEGER NOT NULL, device_index INTEGER NOT NULL,
            create_time_us INTEGER NOT NULL, update_time_us INTEGER NOT NULL,
            key_create_time_us INTEGER NOT NULL,
            key_hash BLOB NOT NULL CHECK (length(key_hash) = 32)) STRICT;
          CREATE TABLE tenant_labels (tenant_id TEXT NOT NULL REFERENCES tenants(id)
            ON DELETE CASCADE, key TEXT NOT NULL, value TEXT NOT NULL,
            PRIMARY KEY (tenant_id, key)) STRICT;
          CREATE TABLE tenant_kernels (tenant_id TEXT NOT NULL REFERENCES tenants(id)
            ON DELETE CASCADE, name TEXT NOT NULL, source TEXT NOT NULL,
            create_time_us INTEGER NOT NULL, PRIMARY KEY (tenant_id, name)) STRICT;
          PRAGMA user_version = 2;
        """)
        db.execute("INSERT INTO tenants VALUES ('alpha', 'Alpha', 1048576, 50, 4, 1024, 1, 0, "
                   "1700000000000000, 1700000000000000, 1700000000000000, ?)", (b"k" * 32,))
        db.execute("INSERT INTO tenant_labels VALUES ('alpha', 'team', 'ml')")
        db.execute("INSERT INTO tenant_kernels VALUES ('alpha', 'swish', ?, 1700000000000000)",
                   (SWISH,))
        db.commit()
        db.close()
        return pathlib.Path(path).read_bytes()


SWISH = "kernel swish(x: f32) -> (y: f32)\n{\n  y = x * sigmoid(x)\n}\n"
AXPY = ("kernel axpy(x: f32, y: f32) -> (out: f32)\n  params(alpha: float = 2.5, n: int = -3)\n"
        "{\n  out = alpha * x + y + f32(n)\n}\n")
RMS = ("kernel rms(x: f32[2]) -> (r: f32)\n  params(eps: float = 1e-6)\n{\n"
       "  let sq = x * x  # squares\n  r = rsqrt(sum(sq) / count + eps)\n}\n")

TEXT = {
    "npy": {
        "f32": npy("<f4", [2, 3], bytes(range(24))),
        "i64-scalar": npy("<i8", [], struct.pack("<q", -5)),
        "u1": npy("|u1", [4], b"\x00\x01\xfe\xff"),
        "b1-empty": npy("|b1", [0], b""),
        "f2-v2": npy("<f2", [1], b"\x00\x3c", version=2),
        "f8-v3-native": npy("=f8", [1, 1], struct.pack("<d", 1.5), version=3),
        "fortran": npy("<f8", [2, 1], bytes(16), fortran=True),
        "big-endian": npy(">f4", [1], bytes(4)),
    },
    "kernel_source": {
        "swish": SWISH,
        "axpy": AXPY,
        "rms": RMS,
        "argmax": "kernel am(x: f64, b: bool) -> (i: i64)\n{\n  i = argmax(where(b, x, -inf))\n}\n",
        "multi": ("kernel two(a: i32, b: u8[1]) -> (s: i64, m: bool, h: f16)\n{\n"
                  "  let q = a / i64(b); let r = a % 7\n  s = q * r - abs(a)\n"
                  "  m = q > r || !(a == 0)\n  h = f32(maximum(a, b)) * 0.5\n}\n"),
        "syntax-error": "kernel bad(x: f32) -> (y: f32) { y = x +* 2 }\n",
        "body-leaky": "\x00let z = x + y; out = where(z > 0, z, alpha * z) + f32(n)",
        "body-int": "\x01out = x % y + n / 3 - abs(x) * minimum(y, 2)",
        "body-two": "\x02out = f32(x) * 2.0\nflag = m && !(x != x)",
        "body-mean": "\x03out = sum(x * f64(b)) / f64(count) + eps",
        "body-u8": "\x04out = int(maximum(x, 0.0) + y)",
        "body-argmin": "\x05out = argmin(x * t)",
        "body-numbers": "\x00out = 1e308 * x + .5e-3 - 0.0 + pow(y, 2) + exp(-x) / sqrt(x)",
        "body-trig": ("\x00out = sin(x) * cos(y) + tan(alpha) - arcsin(x) + arccos(y) * arctan(x)"
                      " + arctan2(x, y) + sinh(x) - cosh(y) + arcsinh(x) + arccosh(y) + arctanh(x)"),
        "body-logs": ("\x03out = log10(x) + log2(x) + log1p(x) - exp2(x) + expm1(x) + cbrt(x)"
                      " + hypot(x, eps) + copysign(x, -1.0)"),
        "body-rounding": ("\x02out = ceil(x) + floor(x) - trunc(x) * round(x)\n"
                          "flag = isnan(x) || isinf(x) && !isfinite(x) || m"),
        "body-bits": ("\x01let s = x << 3 >> y & ~n | x ^ 255\n"
                      "out = s + (x >> 64) + (x << -1) + (i64(y) & 1) * 2"),
        "body-bits-error": "\x00out = x & y",
    },
    "cli_attr": {
        "attrs": "axes=[0, -1];keepdims=true;alpha=2.5;name=foo;k=-7",
        "floats": "[1,2.5,3e-3]",
        "empty-list": "[]",
        "define": SWISH,
        "define-comment": "# fused\n\nkernel   k(x: f32) -> (y: f32) { y = x }\n",
    },
    "token": {
        "tenant-bearer": "Bearer tsk_alpha.abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG",
        "tenant-key": "tsk_team-7.c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3I",
        "admin-bearer": "bearer    admin-token-0123456789abcdef  \n",
        "two-lines": "0123456789abcdef0123456789abcdef\nsecond line\n",
        "short": "  short \r\n",
        "dots": "tsk_a.b.c",
    },
}

PROTO = {
    "admin_request": {
        "register": """register_tenant { tenant_id: "alpha" display_name: "Team Alpha"
            labels { key: "team" value: "ml" } labels { key: "env.tier" value: "prod" }
            quota { device_memory_bytes: 1073741824 compute_share_percent: 25 max_streams: 8
                    max_queued_jobs: 100 priority: PRIORITY_LOW } device_index: 0 }""",
        "register-defaults": """register_tenant { tenant_id: "b-2"
            quota { device_memory_bytes: 1048576 } }""",
        "register-bad-id": """register_tenant { tenant_id: "Bad_ID" quota { device_memory_bytes: 1 } }""",
        "update": """update_tenant { tenant { tenant_id: "alpha" display_name: "New name"
            labels { key: "a" value: "b" } } update_mask { paths: "display_name" paths: "labels" } }""",
        "list": 'list_tenants { page_size: 10 page_token: "%s" }' % b64url("tenants-after:alpha"),
        "get": 'get_tenant { tenant_id: "alpha" }',
        "rotate": 'rotate_tenant_key { tenant_id: "zz-9" }',
    },
    "compute_request": {
        "create": "create { spec { dtype: DTYPE_F32 shape: [2, 3] } data: '\\000\\000\\200?' }",
        "add-broadcast": """launch { kernel: "add" inputs: ["a", "b"] outputs { infer: true } }
            tensors { dtype: DTYPE_F32 shape: [2, 3] } tensors { dtype: DTYPE_F32 shape: [3] }""",
        "matmul": """launch { kernel: "matmul" inputs: ["a", "b"]
            attrs { key: "transpose_b" value { b: true } } attrs { key: "alpha" value { f: 0.5 } } }
            tensors { dtype: DTYPE_F32 shape: [2, 4] } tensors { dtype: DTYPE_F32 shape: [3, 4] }""",
        "sum-axes": """launch { kernel: "sum" inputs: ["a"]
            attrs { key: "axes" value { ints { values: [-1] } } }
            attrs { key: "keepdims" value { b: true } } }
            tensors { dtype: DTYPE_F16 shape: [2, 3, 2] }""",
        "cast": """launch { kernel: "cast" inputs: ["a"] attrs { key: "dtype" value { s: "i32" } }
            outputs { create { dtype: DTYPE_I32 shape: [5] } } }
            tensors { dtype: DTYPE_F64 shape: [5] }""",
        "fill": """launch { kernel: "fill" attrs { key: "value" value { f: 3 } }
            attrs { key: "shape" value { ints { values: [2, 2] } } }
            attrs { key: "dtype" value { s: "bf16" } } }""",
        "transpose": """launch { kernel: "transpose" inputs: ["a"]
            attrs { key: "perm" value { ints { values: [1, 2, 0] } } } }
            tensors { dtype: DTYPE_U8 shape: [2, 3, 4] }""",
        "softmax": """launch { kernel: "softmax" inputs: ["a"] attrs { key: "axis" value { i: 0 } } }
            tensors { dtype: DTYPE_F32 shape: [4, 2] }""",
        "layer-norm": """launch { kernel: "layer_norm" inputs: ["x", "g", "b"] }
            tensors { dtype: DTYPE_F32 shape: [2, 8] } tensors { dtype: DTYPE_F32 shape: [8] }""",
        "submit": """submit { steps { kernel: "mul" inputs { handle: "a" } inputs { handle: "b" } }
            steps { kernel: "argmax" inputs { step_output { step: 0 output: 0 } }
                    attrs { key: "axis" value { i: -1 } } } }
            tensors { dtype: DTYPE_I64 shape: [3, 2] } tensors { dtype: DTYPE_I64 shape: [1] }""",
        "list": 'list { page_size: 5 page_token: "%s" }' % b64url("tensors-after:tn_abc"),
        "write": "write { header { create { dtype: DTYPE_BOOL shape: [8, 0] } } }",
    },
    "define_kernel": {
        "source": 'request { source: "%s" } input_shapes { dims: [2, 3] }' % SWISH.replace("\n", "\\n"),
        "source-reduction": ('request { source: "%s" } input_shapes { dims: [3, 4] } '
                             'attrs { key: "axes" value { ints { values: [1] } } } '
                             'attrs { key: "keepdims" value { b: true } }') % RMS.replace("\n", "\\n"),
        "structured": """request { definition { name: "fma"
            inputs { name: "a" dtype: DTYPE_F32 } inputs { name: "b" dtype: DTYPE_F16 rank: 2 }
            outputs { name: "c" dtype: DTYPE_F32 }
            params { name: "k" type: "int" default_value: 3 } params { name: "s" type: "float" }
            body: "let t = a * b\\nc = t + f32(k) * s" } }
            input_shapes { dims: [3] } input_shapes { dims: [2, 3] }
            attrs { key: "s" value { f: 0.5 } } attrs { key: "k" value { i: 5 } }""",
        "structured-reduction": """request { definition { name: "span"
            inputs { name: "x" dtype: DTYPE_I32 } outputs { name: "y" dtype: DTYPE_I64 }
            body: "y = max(x) - 1" } }
            input_shapes { dims: [4, 0] } attrs { key: "axes" value { ints { values: [0] } } }""",
        "both": 'request { source: "kernel k() -> (y: f32) { y = 1 }" definition { name: "k" } }',
        "structured-math": """request { definition { name: "mathy"
            inputs { name: "x" dtype: DTYPE_F32 } inputs { name: "n" dtype: DTYPE_I64 }
            outputs { name: "y" dtype: DTYPE_F32 } outputs { name: "b" dtype: DTYPE_I64 }
            outputs { name: "flag" dtype: DTYPE_BOOL }
            body: "y = round(sin(x) * 10) + hypot(x, 1) + arctan2(x, -1)\\nb = (n << 3 | n >> 1) ^ ~n\\nflag = isnan(x)" } }
            input_shapes { dims: [3] } input_shapes { dims: [3] }""",
    },
    "state_store": {
        "tenant": """tenants { id { text: "alpha" } display_name { text: "Alpha" }
            device_memory_bytes { i: 1048576 } compute_share_percent { i: 50 } max_streams { i: 4 }
            max_queued_jobs { i: 1024 } priority { i: 1 } device_index { i: 0 }
            create_time_us { i: 1700000000000000 } update_time_us { i: 1700000000000000 }
            key_create_time_us { i: 1700000000000000 } key_hash { blob: "0123456789abcdef0123456789abcdef" } }
            labels { tenant_id { text: "alpha" } key { text: "team" } value { text: "ml" } }
            kernels { tenant_id { text: "alpha" } name { text: "swish" }
                      source { text: "%s" } create_time_us { i: 1 } }""" % SWISH.replace("\n", "\\n"),
        "moved-device": """tenants { id { text: "b" } display_name { text: "" }
            device_memory_bytes { i: 2097152 } compute_share_percent { i: 100 } max_streams { i: 1 }
            max_queued_jobs { i: 1 } priority { i: 2 } device_index { i: 3 }
            create_time_us { i: 0 } update_time_us { i: 0 } key_create_time_us { i: 0 }
            key_hash { blob: "................................" } }""",
        "orphans": """labels { tenant_id { text: "ghost" } key { text: "k" } value { text: "v" } }
            kernels { tenant_id { text: "ghost" } name { text: "k" } source { text: "kernel k" } }""",
        "loose": """loose_schema: true
            tenants { id { i: 10 } display_name { is_null: true } device_memory_bytes { text: "1048576" }
            compute_share_percent { f: 50.5 } max_streams { text: "x" } max_queued_jobs { i: -1 }
            priority { i: 7 } device_index { blob: "" } create_time_us { f: 1e300 }
            update_time_us { i: -9223372036854775808 } key_create_time_us { i: 0 }
            key_hash { text: "short" } }
            tenants { id { text: "9" } key_hash { blob: "0123456789abcdef0123456789abcdef" } }
            labels { tenant_id { i: 10 } key { i: 1 } value { is_null: true } }""",
        "newer": "user_version: 3",
        "older": "user_version: 1",
    },
}


def write(target, name, data):
    directory = CORPUS / target
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ("seed-" + name)).write_bytes(data if isinstance(data, bytes) else data.encode())


def encode(message, text):
    protoc = shutil.which("protoc") or "protoc"
    result = subprocess.run(
        [protoc, "-I", str(ROOT), "-I", str(ROOT / "proto"), "-I", "/usr/include",
         "--encode=tessera.fuzz." + message, "tests/fuzz/fuzz_inputs.proto"],
        input=text.encode(), capture_output=True, cwd=ROOT, check=False)
    if result.returncode != 0:
        raise SystemExit("protoc --encode failed for %r:\n%s" % (text, result.stderr.decode()))
    return result.stdout


def main():
    messages = {"admin_request": "AdminCase", "compute_request": "ComputeCase",
                "define_kernel": "DefineKernelCase", "state_store": "StateCase"}
    for target in list(TEXT) + list(PROTO):
        for old in (CORPUS / target).glob("seed-*"):
            old.unlink()
    for target, seeds in TEXT.items():
        for name, data in seeds.items():
            write(target, name, data)
    for target, seeds in PROTO.items():
        for name, text in seeds.items():
            write(target, name, encode(messages[target], text))
    raw = state_db()
    write("state_store", "raw-file", encode("StateCase", "raw_file: '%s'" % "".join(
        "\\%03o" % b for b in raw)))


if __name__ == "__main__":
    main()
