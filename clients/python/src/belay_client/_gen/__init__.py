"""Generated protobuf modules of ``belay.v1`` (``belay/v1/belay_pb2.py``),
written here by the build hook (``hatch_build.py``); not in the repository."""
