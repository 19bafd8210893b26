"""Build hook: generate the `belay.v1` protobuf modules into the wheel.

Runs grpcio-tools' bundled protoc on ``belay/v1/belay.proto`` (from the
repository's ``proto/proto``, or from ``proto/`` inside an sdist) with
``--python_out`` and mypy-protobuf's ``--mypy_out`` (typed message stubs
that pass ``mypy --strict``), and
adds the output as ``belay_client/_gen/belay/v1/``. No gRPC stubs are
generated: the client names its methods itself (``belay_client._rpc``),
which keeps every call typed.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PROTO = Path("belay") / "v1" / "belay.proto"


def _proto_root(root: Path) -> Path:
    """The directory holding ``belay/v1/belay.proto``: the repository's or the sdist's."""
    for candidate in (root.parent.parent / "proto" / "proto", root / "proto"):
        if (candidate / PROTO).is_file():
            return candidate
    raise RuntimeError(f"{PROTO} not found under {root.parent.parent / 'proto' / 'proto'} or {root / 'proto'}")


def _mypy_plugin() -> str:
    """The ``protoc-gen-mypy`` executable of mypy-protobuf (a build requirement)."""
    found = shutil.which("protoc-gen-mypy") or shutil.which("protoc-gen-mypy", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError("protoc-gen-mypy (PyPI mypy-protobuf) is not installed in the build environment")
    return found


class ProtoBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    """Generates the protobuf modules before the wheel is assembled."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Run protoc into a temporary directory and force-include its output."""
        from grpc_tools import protoc  # a build requirement (pyproject.toml)
        import importlib.resources

        source = _proto_root(Path(self.root))
        out = Path(tempfile.mkdtemp(prefix="belay-client-gen-"))
        includes = importlib.resources.files("grpc_tools") / "_proto"
        code = protoc.main([
            "grpc_tools.protoc",
            f"-I{source}",
            f"-I{includes}",
            f"--plugin=protoc-gen-mypy={_mypy_plugin()}",
            f"--python_out={out}",
            f"--mypy_out={out}",
            str(source / PROTO),
        ])
        if code != 0:
            raise RuntimeError(f"protoc failed ({code}) on {source / PROTO}")
        for package in (out / "belay", out / "belay" / "v1"):
            (package / "__init__.py").write_text("")
        build_data["force_include"][str(out / "belay")] = "belay_client/_gen/belay"
