// Compiled (never run) by node_test.sh with the package's pinned TypeScript against the installed
// package's index.d.ts: the calls README.md and client/node/README.md show must type-check.
import * as attnserve from 'attnserve';

async function main(): Promise<void> {
  const client = new attnserve.Client('localhost:50051', { timeoutMs: 1000 });
  const x: attnserve.TensorInput = { shape: [1, 10, 64], data: new Float32Array(640) };
  const r: attnserve.Result = await client.multiHeadAttention('demo', x, { returnWeights: true, causal: true });
  const shape: number[] = r.output.shape;
  const us: number = r.timing.computeUs;
  const a = await client.attend(x, x, x, { dtype: 'bfloat16', keyLengths: [3] });
  const s = client.stream();
  s.write(1, attnserve.attendRequest(x, x, x));
  s.write(2, attnserve.multiHeadRequest('demo', x, { key: x, value: x }));
  s.end();
  for await (const answer of s) {
    const id: number = answer.requestId;
    if (answer.result) console.log(id, answer.result.output.data.length);
  }
  const info = await client.serverInfo();
  const v: string = info.version;
  const mods: attnserve.ModuleInfo[] = await client.listModules();
  const sess: attnserve.SessionInfo = await client.createSession({
    layout: { numHeads: 8, numKvHeads: 2, headDim: 64 }, cacheDtype: 'float16',
  });
  const step: attnserve.SessionResult = await client.extendSession(
    sess.sessionId, { q: x, k: x, v: x }, { expectedLength: sess.length, returnLse: true });
  const n: number = step.length;
  await client.closeSession(sess.sessionId);
  console.log(shape, us, a.output.dtype, v, mods.length, attnserve.grpc.status.NOT_FOUND, n);
  client.close();
}
main();
