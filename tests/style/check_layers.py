#!/usr/bin/env python3
"""Fails on an uphill include: a file including a folder its layer may not (tests/style/layers.txt).

Each source under common/, wire/, kernels/, server/ and client/ belongs to the most specific
folder the table names; each of its quoted includes of our code is mapped the same way and
must be its own folder (or below it) or one the table lists for it.
"""
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHECKED = ("common", "wire", "kernels", "server", "client")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def load_table():
    table = {}
    with open(os.path.join(ROOT, "tests", "style", "layers.txt")) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            folder, _, allowed = line.partition(":")
            table[folder.strip()] = set(allowed.split())
    return table


def folder_of(path, table):
    """The most specific folder of the table that holds `path` (a path from the root)."""
    parts = path.split("/")
    for n in range(len(parts) - 1, 0, -1):
        candidate = "/".join(parts[:n])
        if candidate in table:
            return candidate
    return None


def included_folder(include, table):
    """The table's folder an include names, or None for what is not ours (third party)."""
    if include.startswith("tessera/v1/"):
        return "proto"
    if include.startswith("tessera/"):  # the client's public headers
        return "client"
    if include.split("/", 1)[0] not in CHECKED:
        return None
    return folder_of(include, table) or include.split("/", 1)[0]


def main():
    table = load_table()
    bad = []
    files = 0
    for top in CHECKED:
        for directory, dirs, names in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d != "python"]
            for name in names:
                if not name.endswith((".h", ".cc", ".cu", ".cuh")):
                    continue
                path = os.path.relpath(os.path.join(directory, name), ROOT)
                own = folder_of(path, table)
                if own is None:
                    bad.append(f"{path}: its folder is not in tests/style/layers.txt")
                    continue
                files += 1
                with open(os.path.join(ROOT, path), errors="replace") as f:
                    text = f.read()
                for include in INCLUDE.findall(text):
                    target = included_folder(include, table)
                    if target is None or target == own or target.startswith(own + "/"):
                        continue
                    if target not in table[own]:
                        bad.append(f"{path}: includes {include} ({target}), which {own} may not")
    if bad:
        print("uphill or unlisted includes (tests/style/layers.txt):")
        for line in bad:
            print("  " + line)
        return 1
    print(f"{files} files: every include goes down the layer table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
