"""The quick alternative a user might write instead of attnserve: a minimal Python gRPC server
(Debian's python3-grpcio) on attnserve's proto, wrapping torch.nn.MultiheadAttention. For
tests/bench/serving_comparison.sh only.

    serving_torch_server.py --stubs=BUILD/python/attnserve_pb --port_file=F --threads=2 \
        --module=NAME=PATH.safetensors[:NUM_HEADS] ...

Implements MultiHeadAttention (float32, no mask options), GetServerInfo and ListModules.
"""
import argparse
import concurrent.futures
import json
import os
import struct
import sys
import time

import grpc
import numpy as np
import torch


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        assert info["dtype"] == "F32", info
        out[name] = np.frombuffer(raw[8 + n + b:8 + n + e], "<f4").reshape(info["shape"])
    return out, header.get("__metadata__", {})


def make_module(path, num_heads):
    t, meta = read_safetensors(path)
    num_heads = num_heads or int(meta["num_heads"])
    d = t["W_q.weight"].shape[0]
    m = torch.nn.MultiheadAttention(d, num_heads, batch_first=True)
    with torch.no_grad():
        m.in_proj_weight.copy_(torch.from_numpy(np.concatenate(
            [t["W_q.weight"], t["W_k.weight"], t["W_v.weight"]])))
        m.in_proj_bias.copy_(torch.from_numpy(np.concatenate(
            [t["W_q.bias"], t["W_k.bias"], t["W_v.bias"]])))
        m.out_proj.weight.copy_(torch.from_numpy(t["W_o.weight"].copy()))
        m.out_proj.bias.copy_(torch.from_numpy(t["W_o.bias"].copy()))
    return m.eval(), d, num_heads


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--stubs", required=True)
    p.add_argument("--port_file", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--module", action="append", default=[])
    args = p.parse_args()
    sys.path.insert(0, args.stubs)
    from attnserve.v1 import attention_pb2 as pb
    from attnserve.v1 import attention_pb2_grpc as pb_grpc

    torch.set_num_threads(args.threads)
    modules = {}
    for spec in args.module:
        name, rest = spec.split("=", 1)
        path, _, heads = rest.partition(":")
        modules[name] = make_module(path, int(heads) if heads else 0)

    def array(t):
        return torch.from_numpy(np.frombuffer(t.data, "<f4").reshape(tuple(t.shape)).copy())

    class Service(pb_grpc.AttentionServiceServicer):
        def MultiHeadAttention(self, request, context):
            start = time.perf_counter()
            if request.module not in modules:
                context.abort(grpc.StatusCode.NOT_FOUND, f"no module '{request.module}'")
            m = modules[request.module][0]
            q = array(request.query)
            k = array(request.key) if request.HasField("key") else q
            v = array(request.value) if request.HasField("value") else q
            with torch.inference_mode():
                out, _ = m(q, k, v, need_weights=False)
            us = int((time.perf_counter() - start) * 1e6)
            return pb.MultiHeadAttentionResponse(
                output=pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=list(out.shape),
                                 data=out.numpy().astype("<f4").tobytes()),
                timing=pb.Timing(compute_us=us, server_us=us, batch_size=1, backend="torch"))

        def GetServerInfo(self, request, context):
            return pb.GetServerInfoResponse(
                version=f"torch-{torch.__version__}",
                backends=[pb.BackendInfo(name="torch", active=True)])

        def ListModules(self, request, context):
            return pb.ListModulesResponse(modules=[
                pb.ModuleInfo(name=n, d_model=d, num_heads=h, head_dim=d // h)
                for n, (_, d, h) in sorted(modules.items())])

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=max(4, args.threads)),
                         options=[("grpc.max_receive_message_length", 256 << 20)])
    pb_grpc.add_AttentionServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(port))
    os.rename(args.port_file + ".tmp", args.port_file)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
