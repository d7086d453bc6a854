"""A generic gRPC client through server reflection: lists services, describes them, and calls
any unary method with a JSON request, knowing nothing of the proto in advance (like grpcurl,
which Debian does not package). Needs only python3-grpcio and python3-protobuf.

    python3 -m attnserve.reflection localhost:50051 list
    python3 -m attnserve.reflection localhost:50051 describe attnserve.v1.AttentionService
    python3 -m attnserve.reflection localhost:50051 call \
        attnserve.v1.AttentionService/GetServerInfo '{}'

The reflection protocol's own messages are built here from a descriptor at run time (no
generated code), and the server's files are fetched with file_containing_symbol.
"""
import sys

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format
try:
    from google.protobuf import message_factory
    _get_class = getattr(message_factory, "GetMessageClass", None)
except ImportError:  # pragma: no cover
    _get_class = None

_REFLECTION_METHOD = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


def _reflection_messages():
    """(request class, response class) of grpc.reflection.v1alpha, from a hand-built file."""
    f = descriptor_pb2.FileDescriptorProto(name="attnserve_reflection_client.proto",
                                           package="grpc.reflection.v1alpha", syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto

    def msg(name, fields, oneof=None):
        m = f.message_type.add(name=name)
        if oneof:
            m.oneof_decl.add(name=oneof)
        for fname, number, ftype, label, type_name, in_oneof in fields:
            fd = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                fd.type_name = ".grpc.reflection.v1alpha." + type_name
            if in_oneof:
                fd.oneof_index = 0
    OPT, REP = T.LABEL_OPTIONAL, T.LABEL_REPEATED
    msg("ServerReflectionRequest", [
        ("host", 1, T.TYPE_STRING, OPT, None, False),
        ("file_by_filename", 3, T.TYPE_STRING, OPT, None, True),
        ("file_containing_symbol", 4, T.TYPE_STRING, OPT, None, True),
        ("list_services", 7, T.TYPE_STRING, OPT, None, True)], oneof="message_request")
    msg("FileDescriptorResponse", [("file_descriptor_proto", 1, T.TYPE_BYTES, REP, None, False)])
    msg("ServiceResponse", [("name", 1, T.TYPE_STRING, OPT, None, False)])
    msg("ListServiceResponse", [("service", 1, T.TYPE_MESSAGE, REP, "ServiceResponse", False)])
    msg("ErrorResponse", [("error_code", 1, T.TYPE_INT32, OPT, None, False),
                          ("error_message", 2, T.TYPE_STRING, OPT, None, False)])
    msg("ServerReflectionResponse", [
        ("valid_host", 1, T.TYPE_STRING, OPT, None, False),
        ("file_descriptor_response", 4, T.TYPE_MESSAGE, OPT, "FileDescriptorResponse", True),
        ("list_services_response", 6, T.TYPE_MESSAGE, OPT, "ListServiceResponse", True),
        ("error_response", 7, T.TYPE_MESSAGE, OPT, "ErrorResponse", True)],
        oneof="message_response")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return (_message_class(pool, "grpc.reflection.v1alpha.ServerReflectionRequest"),
            _message_class(pool, "grpc.reflection.v1alpha.ServerReflectionResponse"))


def _message_class(pool, full_name):
    d = pool.FindMessageTypeByName(full_name)
    if _get_class:
        return _get_class(d)
    return message_factory.MessageFactory(pool).GetPrototype(d)


class ReflectionClient:
    """Fetches descriptors from a server's reflection service into a private pool."""

    def __init__(self, channel):
        self._call = channel.stream_stream(_REFLECTION_METHOD)
        self._req, self._resp = _reflection_messages()
        self.pool = descriptor_pool.DescriptorPool()
        self._loaded = set()

    def _ask(self, **kw):
        (raw,) = list(self._call(iter([self._req(**kw).SerializeToString()]), timeout=30))
        r = self._resp.FromString(raw)
        if r.HasField("error_response"):
            raise LookupError(r.error_response.error_message)
        return r

    def services(self):
        return [s.name for s in self._ask(list_services="").list_services_response.service]

    def _load(self, **kw):
        files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                 for b in self._ask(**kw).file_descriptor_response.file_descriptor_proto]
        by_name = {f.name: f for f in files}

        def add(f):  # dependencies first
            if f.name in self._loaded:
                return
            for dep in f.dependency:
                if dep not in self._loaded:
                    add(by_name[dep] if dep in by_name else self._fetch_file(dep))
            self.pool.Add(f)
            self._loaded.add(f.name)
        for f in files:
            add(f)

    def _fetch_file(self, name):
        (raw,) = self._ask(file_by_filename=name).file_descriptor_response.file_descriptor_proto
        return descriptor_pb2.FileDescriptorProto.FromString(raw)

    def service(self, name):
        self._load(file_containing_symbol=name)
        return self.pool.FindServiceByName(name)

    def message_class(self, descriptor):
        return _message_class(self.pool, descriptor.full_name)


def describe(service):
    lines = [f"service {service.full_name} {{"]
    for m in service.methods:
        cs = "stream " if m.client_streaming else ""
        ss = "stream " if m.server_streaming else ""
        lines.append(f"  rpc {m.name}({cs}{m.input_type.full_name}) returns "
                     f"({ss}{m.output_type.full_name});")
    return "\n".join(lines + ["}"])


def call(channel, reflection, method, request_json, timeout=60, metadata=None):
    """Calls unary `method` ("pkg.Service/Method") with a JSON request; returns JSON text."""
    service_name, method_name = method.split("/")
    m = reflection.service(service_name).methods_by_name[method_name]
    req_cls, resp_cls = reflection.message_class(m.input_type), reflection.message_class(
        m.output_type)
    request = json_format.Parse(request_json, req_cls())
    fn = channel.unary_unary(f"/{service_name}/{method_name}",
                             request_serializer=lambda x: x.SerializeToString(),
                             response_deserializer=resp_cls.FromString)
    return json_format.MessageToJson(fn(request, timeout=timeout, metadata=metadata))


def main(argv):
    if len(argv) < 3 or argv[2] not in ("list", "describe", "call"):
        print(__doc__, file=sys.stderr)
        return 2
    target, command = argv[1], argv[2]
    with grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", -1)]) as ch:
        r = ReflectionClient(ch)
        try:
            if command == "list":
                print("\n".join(r.services()))
            elif command == "describe":
                for name in argv[3:] or r.services():
                    print(describe(r.service(name)))
            else:
                request = argv[4] if len(argv) > 4 else "{}"
                if request == "-":
                    request = sys.stdin.read()
                print(call(ch, r, argv[3], request))
        except grpc.RpcError as e:
            print(f"error: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
