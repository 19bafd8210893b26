"""A small OTLP/gRPC trace receiver for Belay's trace test (tests/tests/traces.rs).

Serves opentelemetry.proto.collector.trace.v1.TraceService on 127.0.0.1 (a free
port), prints `listening on http://127.0.0.1:PORT` once ready, and appends
every span it receives to OUT as one JSON line:
{"service", "scope", "trace_id", "span_id", "parent_span_id", "name", "kind",
 "attributes": {key: value}, "status": {"code", "message"}} (ids in lower-case hex).
It exits when its parent process goes away, or on SIGTERM.

    python receiver.py OUT
"""

import json
import os
import signal
import sys
import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


def value_of(any_value):
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value_of(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value_of(kv.value) for kv in any_value.kvlist_value.values}
    if kind == "bytes_value":
        return any_value.bytes_value.hex()
    return getattr(any_value, kind)


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, out):
        self.out = out
        self.lock = threading.Lock()

    def Export(self, request, context):
        lines = []
        for resource_spans in request.resource_spans:
            resource = {kv.key: value_of(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    lines.append(json.dumps({
                        "service": resource.get("service.name"),
                        "scope": scope_spans.scope.name,
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "name": span.name,
                        "kind": span.kind,
                        "attributes": {kv.key: value_of(kv.value) for kv in span.attributes},
                        "status": {"code": span.status.code, "message": span.status.message},
                    }))
        with self.lock:
            with open(self.out, "a", encoding="utf-8") as f:
                for line in lines:
                    f.write(line + "\n")
        return trace_service_pb2.ExportTraceServiceResponse()


def main():
    out = sys.argv[1]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Receiver(out), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"listening on http://127.0.0.1:{port}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    parent = os.getppid()
    while not stop.wait(0.5):
        if os.getppid() != parent:
            break
    server.stop(grace=1).wait()


if __name__ == "__main__":
    main()
