// Compiled (never run) by node_test.sh with the package's pinned TypeScript against the installed
// package's index.d.ts: the calls README.md and client/node/README.md show must type-check.
import * as attnserve from 'attnserve';

async function main(): Promise<void> {
  const client = new attnserve.Client('localhost:50051', { timeoutMs: 1000 });
  const x: attnserve.TensorInput = { shape: [1, 10, 64], data: new Float32Array(640) };
  const r: attnserve.Result = await client.multiHeadAttention('demo', x, { returnWeights: true, causal: true });
  const shape: number[] = r.output.shape;
  const us: number = r.timing.computeUs;
  const a = await client.attend(x, x, x, { dtype: 'bfloat16', keyLengths: [3], window: [4, 0],
                                          softcap: 30, alibi: 'standard' });
  await client.attend(x, x, x, { kind: 'linear', featureMap: 'relu' });
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

// Several replicas: sessions routed by owner, a batch of steps, a replica's listing.
async function replicas(): Promise<void> {
  const client = new attnserve.Client(['10.0.0.1:50051', '10.0.0.2:50051'],
    { loadBalancing: 'round_robin' });
  const replicas: string[] = client.replicas;
  const x: attnserve.TensorInput = { shape: [1, 2, 8], data: new Float32Array(16) };
  const s = await client.createSession({ layout: { numHeads: 2, numKvHeads: 2, headDim: 8 },
                                          replica: replicas[1] });
  const owner: string = attnserve.sessionOwner(s.sessionId);
  const steps: attnserve.SessionStep[] = [
    { sessionId: s.sessionId, tokens: { q: x, k: x, v: x }, expectedLength: 0, returnLse: true },
  ];
  const items: Array<attnserve.SessionResult | attnserve.StepError> =
    await client.extendSessions(steps, { timeoutMs: 1000 });
  for (const item of items) {
    if (item instanceof attnserve.StepError) {
      const code: number = item.code;
      const details: string = item.details;
      console.log(code, details, attnserve.sessionLostReason(item));
    } else {
      const lse: attnserve.TensorOutput | null = item.lse;
      console.log(item.length, lse);
    }
  }
  const page: attnserve.ListSessionsResult = await client.listSessions({
    replica: owner, pageSize: 10, pageToken: '',
  });
  const used: number = page.usage.pagesUsed;
  const stream = client.streamForSession(s.sessionId, { timeoutMs: 1000 });
  stream.write(1, attnserve.extendRequest(s.sessionId, { q: x, k: x, v: x },
                                          { expectedLength: 1 }));
  stream.write(2, attnserve.extendSessionsRequest(steps));
  stream.end();
  for await (const answer of stream) {
    const one: attnserve.SessionResult | null = answer.sessionResult;
    const many: Array<attnserve.SessionResult | attnserve.StepError> | null =
      answer.sessionResults;
    console.log(one, many);
  }
  console.log(page.sessions.length, page.nextPageToken, used);
  // Moved sessions: an operator's move, the id in use, a move read from an error.
  const moved: attnserve.MoveSessionResult = await client.moveSession(s.sessionId, replicas[0]);
  const pause: number = moved.pauseUs + moved.bytes;
  const step = await client.extendSession(s.sessionId, { q: x, k: x, v: x },
                                          { expectedLength: 2 });
  const now: string = step.sessionId;
  try {
    await client.getSession(s.sessionId);
  } catch (err) {
    const to: string = attnserve.sessionMovedTo(err);
    console.log(to);
  }
  console.log(moved.sessionId, pause, now);
  client.close();
}
// Client-side throttling: tuned, off, a Throttle of one's own with a fake clock and draws.
function throttling(): void {
  const tuned = new attnserve.Client('localhost:50051',
    { throttle: { k: 1.5, windowSeconds: 10 } });
  const off = new attnserve.Client('localhost:50051', { throttle: false });
  const t = new attnserve.Throttle({ enabled: true }, { clock: () => 0, rand: () => 0.5 });
  const shared = new attnserve.Client('localhost:50051', { throttle: t });
  const p: number = tuned.throttle ? tuned.throttle.probability() : 0;
  const { requests, accepts } = t.counts();
  const reason: string | null = t.check();
  t.record(attnserve.grpc.status.UNAVAILABLE, '250');
  const k: number = t.options.k;
  const err = new attnserve.ThrottledError('why');
  const code: number = err.code;
  console.log(p, requests, accepts, reason, k, code, err.details, off.throttle, shared.throttle);
}
main();
replicas();
throttling();
