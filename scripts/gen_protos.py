#!/usr/bin/env python3
"""Generate Python modules from every .proto file under proto/, or check that they are current.

    python scripts/gen_protos.py          # regenerate in place
    python scripts/gen_protos.py --check  # exit 1 and list the files that are stale or missing

Protos are compiled with the repository root as the include path, so `proto/x/y.proto` becomes
the importable module `proto.x.y_pb2` and protos import each other as "proto/x/y.proto".
The generated files are committed: installing Sluice needs no protoc. grpcio-tools is pinned
in pyproject.toml because its version is part of the generated text.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def sources() -> list[Path]:
    return sorted(PROTO_DIR.rglob("*.proto"))


def generate(out_dir: Path) -> None:
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    files = [str(p.relative_to(ROOT)) for p in sources()]
    if not files:
        return
    args = [
        "protoc",
        f"-I{ROOT}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *files,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def generated_in(base: Path) -> set[Path]:
    found: set[Path] = set()
    for suffix in SUFFIXES:
        found |= {p.relative_to(base) for p in (base / "proto").rglob(f"*{suffix}")}
    return found


def ensure_packages() -> None:
    """Every directory holding generated modules is a package."""
    for proto in sources():
        d = proto.parent
        while d != ROOT:
            init = d / "__init__.py"
            if not init.exists():
                init.write_text('"""Generated protobuf modules; see scripts/gen_protos.py."""\n')
            d = d.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if generated code is stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        generate(out)
        fresh = generated_in(out)
        committed = generated_in(ROOT)
        if args.check:
            stale = sorted(
                str(p)
                for p in fresh | committed
                if p not in fresh or p not in committed or not filecmp.cmp(out / p, ROOT / p, shallow=False)
            )
            if stale:
                print("generated protobuf code is stale; run `make protos` and commit:", file=sys.stderr)
                for name in stale:
                    print(f"  {name}", file=sys.stderr)
                return 1
            print(f"protos ok: {len(fresh)} generated files current")
            return 0
        for p in committed - fresh:
            (ROOT / p).unlink()
        for p in fresh:
            (ROOT / p).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out / p, ROOT / p)
        ensure_packages()
        print(f"generated {len(fresh)} files from {len(sources())} protos")
    return 0


if __name__ == "__main__":
    sys.exit(main())
