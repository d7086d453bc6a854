"""Sync (grpc) and asyncio (grpc.aio) clients for attnserve.v1.AttentionService.

Errors are grpc.RpcError (sync) / grpc.aio.AioRpcError (async) with the server's canonical code
and message (see the proto): e.g. INVALID_ARGUMENT "key.shape[3] must equal query.shape[3]".
Retries (UNAVAILABLE, with backoff) and load balancing (round_robin over the addresses a
target resolves to, e.g. "ipv4:127.0.0.1:5001,127.0.0.1:5002") are gRPC's, through the
channel's service config.
"""
import collections
import json
import os

import grpc

from attnserve.v1 import attention_pb2 as pb
from attnserve.v1 import attention_pb2_grpc as pb_grpc
from attnserve.tensors import to_tensor, from_tensor

# A result: output and weights (None unless asked for) as numpy arrays (or torch tensors),
# and the server's pb.Timing.
Result = collections.namedtuple("Result", ["output", "weights", "timing"])

RetryPolicy = collections.namedtuple(
    "RetryPolicy", ["max_attempts", "initial_backoff_s", "max_backoff_s", "multiplier", "codes"],
    defaults=[4, 0.1, 2.0, 2.0, ("UNAVAILABLE",)])


def _service_config(retry, load_balancing):
    config = {}
    if retry is not None and retry.max_attempts > 1:
        config["methodConfig"] = [{
            "name": [{"service": "attnserve.v1.AttentionService"}],
            "retryPolicy": {
                "maxAttempts": retry.max_attempts,
                "initialBackoff": f"{retry.initial_backoff_s:.6f}s",
                "maxBackoff": f"{retry.max_backoff_s:.6f}s",
                "backoffMultiplier": retry.multiplier,
                "retryableStatusCodes": list(retry.codes),
            }}]
    if load_balancing:
        config["loadBalancingConfig"] = [{load_balancing: {}}]
    return json.dumps(config)


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _channel_args(target, *, tls, root_certs, client_cert, client_key, server_name, token,
                  retry, load_balancing):
    """(target, credentials or None, options) for grpc.*_channel."""
    options = [("grpc.max_receive_message_length", -1),
               ("grpc.max_send_message_length", -1),
               ("grpc.enable_retries", 1),
               ("grpc.per_rpc_retry_buffer_size", 64 << 20),
               ("grpc.service_config", _service_config(retry, load_balancing))]
    creds = None
    if tls or root_certs or client_cert:
        def pem(x):
            return _read(x) if isinstance(x, str) and os.path.exists(x) else x
        creds = grpc.ssl_channel_credentials(root_certificates=pem(root_certs),
                                             private_key=pem(client_key),
                                             certificate_chain=pem(client_cert))
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        if token:
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(token))
    return creds, options


def _metadata(token, secure):
    # Over TLS the token rides in call credentials; over plaintext (tests, loopback) gRPC
    # refuses call credentials, so it is sent as metadata.
    return (("authorization", f"Bearer {token}"),) if token and not secure else None


def _options(causal, mask, key_lengths, scale, return_weights):
    o = pb.AttentionOptions(causal=causal, return_weights=return_weights)
    if mask is not None:
        o.mask.CopyFrom(to_tensor(mask, "bool"))
    if key_lengths is not None:
        o.key_lengths.extend(int(x) for x in key_lengths)
    if scale is not None:
        o.scale = float(scale)
    return o


def attend_request(q, k, v, *, causal=False, mask=None, key_lengths=None, scale=None,
                   return_weights=False, dtype=None):
    """A pb.AttendRequest: q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv]."""
    query = to_tensor(q, dtype)
    return pb.AttendRequest(query=query, key=to_tensor(k, query.dtype),
                            value=to_tensor(v, query.dtype),
                            options=_options(causal, mask, key_lengths, scale, return_weights))


def multi_head_request(module, query, key=None, value=None, *, causal=False, mask=None,
                       key_lengths=None, scale=None, return_weights=False, dtype=None):
    """A pb.MultiHeadAttentionRequest: query [B, Lq, d_model], key/value [B, Lk, d_model]."""
    if (key is None) != (value is None):
        raise ValueError("give both key and value, or neither (self-attention)")
    q = to_tensor(query, dtype)
    r = pb.MultiHeadAttentionRequest(module=module, query=q,
                                     options=_options(causal, mask, key_lengths, scale,
                                                      return_weights))
    if key is not None:
        r.key.CopyFrom(to_tensor(key, q.dtype))
        r.value.CopyFrom(to_tensor(value, q.dtype))
    return r


def _result(response, torch_out):
    weights = from_tensor(response.weights, torch_out) if response.HasField("weights") else None
    return Result(from_tensor(response.output, torch_out), weights, response.timing)


def _module_bytes(weights, num_heads):
    """LoadModule's safetensors bytes from bytes, a path, a state_dict or a module."""
    from attnserve.safetensors import export_state_dict
    if isinstance(weights, (bytes, bytearray)):
        return bytes(weights)
    if isinstance(weights, (str, os.PathLike)):
        return _read(weights)
    return export_state_dict(weights, num_heads=num_heads)


class _Base:
    def __init__(self, target, *, timeout=60.0, tls=False, root_certs=None, client_cert=None,
                 client_key=None, server_name=None, token=None, retry=None,
                 load_balancing=None, torch_out=False):
        """target: "host:port", "dns:///name:port" or "ipv4:a:p1,b:p2".

        timeout: seconds per call. tls / root_certs / client_cert / client_key (PEM bytes or
        file paths): TLS and mutual TLS; server_name overrides the name checked. token: a
        bearer token. retry: a RetryPolicy (RetryPolicy(): 4 attempts on UNAVAILABLE, 0.1 s
        doubling to 2 s), or None (the default, as in the C++ client) for no retries.
        load_balancing:
        "round_robin" or "pick_first" (default: round_robin when the target lists addresses).
        torch_out: results as torch tensors instead of numpy arrays.
        """
        if load_balancing is None and target.startswith(("ipv4:", "ipv6:", "dns:")):
            load_balancing = "round_robin"
        self.timeout = timeout
        self.torch_out = torch_out
        self._creds, self._options = _channel_args(
            target, tls=tls, root_certs=root_certs, client_cert=client_cert,
            client_key=client_key, server_name=server_name, token=token, retry=retry,
            load_balancing=load_balancing)
        self._metadata = _metadata(token, self._creds is not None)
        self.target = target

    def _kw(self, timeout):
        return {"timeout": self.timeout if timeout is None else timeout,
                "metadata": self._metadata}


class Client(_Base):
    """Blocking client. Thread-safe; use as a context manager or call close()."""

    def __init__(self, target, **kwargs):
        super().__init__(target, **kwargs)
        if self._creds is None:
            self.channel = grpc.insecure_channel(target, options=self._options)
        else:
            self.channel = grpc.secure_channel(target, self._creds, options=self._options)
        self.stub = pb_grpc.AttentionServiceStub(self.channel)

    def close(self):
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def attend(self, q, k, v, *, timeout=None, **options):
        """Attention on projected tensors; options: causal, mask, key_lengths, scale,
        return_weights, dtype. Returns a Result."""
        response = self.stub.Attend(attend_request(q, k, v, **options), **self._kw(timeout))
        return _result(response, self.torch_out)

    def multi_head_attention(self, module, query, key=None, value=None, *, timeout=None,
                             **options):
        """The module `module` on query (and key/value, or self-attention). Returns a Result."""
        response = self.stub.MultiHeadAttention(
            multi_head_request(module, query, key, value, **options), **self._kw(timeout))
        return _result(response, self.torch_out)

    def load_module(self, name, weights, *, num_heads=0, replace=False, timeout=None):
        """Registers weights (safetensors bytes or path, a state_dict or a torch module) under
        `name`. Returns the pb.ModuleInfo."""
        request = pb.LoadModuleRequest(name=name, safetensors=_module_bytes(weights, num_heads),
                                       num_heads=num_heads, replace=replace)
        return self.stub.LoadModule(request, **self._kw(timeout)).module

    def unload_module(self, name, *, timeout=None):
        self.stub.UnloadModule(pb.UnloadModuleRequest(name=name), **self._kw(timeout))

    def list_modules(self, *, timeout=None):
        return list(self.stub.ListModules(pb.ListModulesRequest(), **self._kw(timeout)).modules)

    def server_info(self, *, timeout=None):
        return self.stub.GetServerInfo(pb.GetServerInfoRequest(), **self._kw(timeout))

    def stream(self, requests, *, timeout=None):
        """AttentionStream: `requests` yields (request_id, pb.AttendRequest or
        pb.MultiHeadAttentionRequest); yields pb.AttentionStreamResponse in completion order.
        A failed request's response has a nonzero `code` and a `message`; the stream goes on.
        """
        def wrap():
            for request_id, r in requests:
                if isinstance(r, pb.AttendRequest):
                    yield pb.AttentionStreamRequest(request_id=request_id, attend=r)
                else:
                    yield pb.AttentionStreamRequest(request_id=request_id,
                                                    multi_head_attention=r)
        return self.stub.AttentionStream(wrap(), timeout=timeout, metadata=self._metadata)


class AsyncClient(_Base):
    """asyncio client over grpc.aio; the same methods as Client, as coroutines. Create it
    inside the event loop that uses it."""

    def __init__(self, target, **kwargs):
        super().__init__(target, **kwargs)
        if self._creds is None:
            self.channel = grpc.aio.insecure_channel(target, options=self._options)
        else:
            self.channel = grpc.aio.secure_channel(target, self._creds, options=self._options)
        self.stub = pb_grpc.AttentionServiceStub(self.channel)

    async def close(self):
        await self.channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def attend(self, q, k, v, *, timeout=None, **options):
        response = await self.stub.Attend(attend_request(q, k, v, **options),
                                          **self._kw(timeout))
        return _result(response, self.torch_out)

    async def multi_head_attention(self, module, query, key=None, value=None, *, timeout=None,
                                   **options):
        response = await self.stub.MultiHeadAttention(
            multi_head_request(module, query, key, value, **options), **self._kw(timeout))
        return _result(response, self.torch_out)

    async def load_module(self, name, weights, *, num_heads=0, replace=False, timeout=None):
        request = pb.LoadModuleRequest(name=name, safetensors=_module_bytes(weights, num_heads),
                                       num_heads=num_heads, replace=replace)
        return (await self.stub.LoadModule(request, **self._kw(timeout))).module

    async def unload_module(self, name, *, timeout=None):
        await self.stub.UnloadModule(pb.UnloadModuleRequest(name=name), **self._kw(timeout))

    async def list_modules(self, *, timeout=None):
        return list((await self.stub.ListModules(pb.ListModulesRequest(),
                                                 **self._kw(timeout))).modules)

    async def server_info(self, *, timeout=None):
        return await self.stub.GetServerInfo(pb.GetServerInfoRequest(), **self._kw(timeout))

    def stream(self, *, timeout=None):
        """An AttentionStream call: `await call.write(pb.AttentionStreamRequest(...))`,
        `await call.done_writing()`, and `async for response in call`."""
        return self.stub.AttentionStream(timeout=timeout, metadata=self._metadata)
