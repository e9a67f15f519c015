"""Generates the gRPC stubs (tessera._proto) from ../../proto while building the package.

Needs `protoc` and `grpc_python_plugin` (Debian: protobuf-compiler, protobuf-compiler-grpc)
on PATH, or TESSERA_PROTOC / TESSERA_GRPC_PYTHON_PLUGIN naming them.

Also takes in tessera._native (the transfers through the C++ client library) where the CMake
build made it for this Python: $TESSERA_NATIVE_MODULE, else the repository's build/ (or
build-ci/) tree. Without it the package streams through grpcio (docs/python.md).
"""
import glob
import importlib.machinery
import os
import shutil
import subprocess
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.join(HERE, "..", "..", "proto")
PROTOS = ["tessera/v1/compute.proto", "tessera/v1/tenant_admin.proto"]


def _tool(env: str, name: str) -> str:
    path = os.environ.get(env) or shutil.which(name)
    if not path:
        raise RuntimeError(f"{name} not found (install protobuf-compiler and "
                           f"protobuf-compiler-grpc, or set {env})")
    return path


class BuildWithStubs(build_py):
    def run(self) -> None:
        super().run()
        out = os.path.join(self.build_lib, "tessera", "_proto")
        os.makedirs(out, exist_ok=True)
        with tempfile.TemporaryDirectory() as raw:
            subprocess.check_call([
                _tool("TESSERA_PROTOC", "protoc"), f"-I{PROTO_DIR}", f"--python_out={raw}",
                f"--pyi_out={raw}", f"--grpc_python_out={raw}",
                "--plugin=protoc-gen-grpc_python="
                + _tool("TESSERA_GRPC_PYTHON_PLUGIN", "grpc_python_plugin"),
                *[os.path.join(PROTO_DIR, p) for p in PROTOS]])
            src = os.path.join(raw, "tessera", "v1")
            for name in os.listdir(src):
                with open(os.path.join(src, name)) as f:
                    text = f.read().replace("from tessera.v1 import",
                                            "from tessera._proto import")
                with open(os.path.join(out, name), "w") as f:
                    f.write(text)
        with open(os.path.join(out, "__init__.py"), "w") as f:
            f.write("# Generated gRPC stubs for tessera.v1 (do not edit).\n")
        native = _native_module()
        if native:
            shutil.copy(native, os.path.join(self.build_lib, "tessera", os.path.basename(native)))


def _native_module() -> str:
    """The built tessera._native for this Python, or "" when there is none."""
    given = os.environ.get("TESSERA_NATIVE_MODULE")
    if given:
        return given
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        for tree in ("build", "build-ci"):
            found = glob.glob(os.path.join(HERE, "..", "..", tree, "client", "python", "gen",
                                           "tessera", "_native" + suffix))
            if found:
                return found[0]
    return ""


setup(cmdclass={"build_py": BuildWithStubs})
