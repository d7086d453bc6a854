// The installed attnserve Node.js package given two live server processes A and B (each naming
// itself by its listening address, 127.0.0.1:<port>) and a third, C, started with
// --session_owner naming an address no client uses: stateless calls reach both A and B (round
// robin); new sessions alternate between A and B; every call naming a session reaches its owner
// (each replica lists and describes only its own, and answers the other's ids NOT_FOUND);
// prefill and steps (extendSession, extendSessions over both replicas in an order that
// interleaves them, the stream tied to a session's replica) equal float64 causal attention of
// the session's own tokens; results come back in the steps' order with a failed step in its
// place; an expired session is recognised as lost; an owner the client does not know is refused
// naming the id and the addresses; and a session created on C (whose ids name another owner) is
// closed again and refused with an error naming --session_owner.
//   node routing_test.js A_ADDRESS B_ADDRESS C_ADDRESS  (beside reference.js, where
//                                                       `require('attnserve')` is installed)
'use strict';
const assert = require('node:assert/strict');
const attnserve = require('attnserve');
const { rng, tensor, maxError, sessionAttention64 } = require('./reference');

const [a, b, c] = process.argv.slice(2);
const { NOT_FOUND, ABORTED } = attnserve.grpc.status;
const [HQ, HKV, D, PREFILL, STEPS] = [4, 2, 8, 3, 3];
const TOLERANCE = 1e-5;
const normal = rng(7);

// Tokens from..to of a session's data as the { q, k, v } of one extend.
function tokens(data, from, to) {
  const rows = (t, h) => ({
    shape: [to - from, h, D], data: t.data.slice(from * h * D, to * h * D),
  });
  return { q: rows(data.q, HQ), k: rows(data.k, HKV), v: rows(data.v, HKV) };
}

// Asserts that `result` answers tokens from..to of `data`, against float64 attention.
function check(what, result, data, from, to, withLse = false) {
  assert.ok(!(result instanceof Error), `${what}: ${result && result.message}`);
  assert.equal(result.length, to, what);
  assert.deepEqual(result.output.shape, [to - from, HQ, D], what);
  const want = sessionAttention64(data.q.data, data.k.data, data.v.data, [HQ, HKV, D], from, to);
  const err = maxError(result.output.data, want.output);
  assert.ok(err < TOLERANCE, `${what}: max |error| ${err}`);
  if (withLse) {
    assert.deepEqual(result.lse.shape, [to - from, HQ], what);
    const lseErr = maxError(result.lse.data, want.lse);
    assert.ok(lseErr < TOLERANCE, `${what}: lse max |error| ${lseErr}`);
  }
  return err;
}

async function main() {
  const client = new attnserve.Client([a, b], { timeoutMs: 60000 });
  assert.deepEqual(client.replicas, [a, b]);
  assert.equal(client.target, `ipv4:${a},${b}`);
  const direct = { [a]: new attnserve.Client(a), [b]: new attnserve.Client(b) };

  // Stateless calls go round_robin over both: with the built-in module "demo" unloaded from B,
  // calls through the balanced channel are answered by A (an output) and by B (NOT_FOUND). Both
  // answers come as soon as both connections are up; 500 calls are a generous bound for that.
  await direct[b].unloadModule('demo');
  const x = { shape: [1, 10, 64], data: new Float32Array(640).fill(1) };
  const seen = { answered: 0, notFound: 0 };
  for (let i = 0; i < 500 && !(seen.answered && seen.notFound); i++) {
    try {
      assert.deepEqual((await client.multiHeadAttention('demo', x)).output.shape, [1, 10, 64]);
      seen.answered++;
    } catch (err) {
      assert.equal(err.code, NOT_FOUND, String(err));
      seen.notFound++;
    }
  }
  assert.ok(seen.answered && seen.notFound,
    `stateless calls not balanced: ${JSON.stringify(seen)}`);

  // Four sessions, created on A and B in turn; a fifth on the replica asked for.
  const layout = { numHeads: HQ, numKvHeads: HKV, headDim: D };
  const sessions = [];
  for (let i = 0; i < 4; i++) {
    const info = await client.createSession({ layout });
    sessions.push({
      id: info.sessionId, length: 0, q: tensor([PREFILL + STEPS, HQ, D], normal),
      k: tensor([PREFILL + STEPS, HKV, D], normal), v: tensor([PREFILL + STEPS, HKV, D], normal),
    });
  }
  assert.deepEqual(sessions.map((s) => attnserve.sessionOwner(s.id)), [a, b, a, b]);
  const extra = await client.createSession({ layout, replica: b });
  assert.equal(attnserve.sessionOwner(extra.sessionId), b);
  await client.closeSession(extra.sessionId);

  // Each replica holds its own two and knows nothing of the other's.
  for (const [replica, other] of [[a, b], [b, a]]) {
    const listed = await client.listSessions({ replica });
    const mine = sessions.filter((s) => attnserve.sessionOwner(s.id) === replica).map((s) => s.id);
    assert.deepEqual(listed.sessions.map((s) => s.sessionId), mine);  // in creation order
    assert.equal(listed.usage.sessions, 2);
    assert.equal(listed.nextPageToken, '');
    const first = await client.listSessions({ replica, pageSize: 1 });
    assert.deepEqual(first.sessions.map((s) => s.sessionId), [mine[0]]);
    const second = await client.listSessions({
      replica, pageSize: 1, pageToken: first.nextPageToken,
    });
    assert.deepEqual(second.sessions.map((s) => s.sessionId), [mine[1]]);
    const foreign = sessions.find((s) => attnserve.sessionOwner(s.id) === other);
    await assert.rejects(direct[replica].getSession(foreign.id), (err) => {
      assert.equal(err.code, NOT_FOUND);
      assert.ok(err.details.includes(other), err.details);
      return true;
    });
  }

  // The prefill, one session at a time, each through its owner.
  let worst = 0;
  for (const s of sessions) {
    const r = await client.extendSession(s.id, tokens(s, 0, PREFILL), { expectedLength: 0 });
    worst = Math.max(worst, check(`prefill of ${s.id}`, r, s, 0, PREFILL));
    s.length = PREFILL;
    assert.equal((await client.getSession(s.id)).length, PREFILL);
  }

  // One step of every session in one extendSessions, the steps interleaving the replicas in
  // an order other than the sessions' (B, A, B, A): each result is its own session's.
  const order = [3, 0, 1, 2];
  const results = await client.extendSessions(order.map((i) => ({
    sessionId: sessions[i].id, tokens: tokens(sessions[i], PREFILL, PREFILL + 1),
    expectedLength: PREFILL, returnLse: true,
  })));
  assert.equal(results.length, order.length);
  order.forEach((i, j) => {
    worst = Math.max(worst, check(`extendSessions step ${j} (session ${i})`, results[j],
      sessions[i], PREFILL, PREFILL + 1, true));
    sessions[i].length = PREFILL + 1;
  });

  // A failed step is answered in its place; the others are applied.
  const stale = await client.extendSessions([
    { sessionId: sessions[1].id, tokens: tokens(sessions[1], 4, 5), expectedLength: 4 },
    { sessionId: sessions[0].id, tokens: tokens(sessions[0], 4, 5), expectedLength: 3 },
    { sessionId: sessions[2].id, tokens: tokens(sessions[2], 4, 5), expectedLength: 4 },
  ]);
  check('the step before the failed one', stale[0], sessions[1], 4, 5);
  assert.ok(stale[1] instanceof attnserve.StepError, String(stale[1]));
  assert.equal(stale[1].code, ABORTED);
  assert.match(stale[1].details, /4/);
  check('the step after the failed one', stale[2], sessions[2], 4, 5);
  sessions[1].length = sessions[2].length = 5;
  assert.equal((await client.getSession(sessions[0].id)).length, 4);

  // The stream on a session's replica: one extend and an extendSessions of that replica's.
  const onB = sessions.filter((s) => attnserve.sessionOwner(s.id) === b);  // 1 (length 5), 3 (4)
  const stream = client.streamForSession(onB[1].id, { timeoutMs: 60000 });
  stream.write(1, attnserve.extendRequest(onB[1].id, tokens(onB[1], 4, 5), { expectedLength: 4 }));
  stream.end();
  const answers = [];
  for await (const answer of stream) answers.push(answer);
  assert.equal(answers.length, 1);
  assert.equal(answers[0].code, 0, answers[0].message);
  worst = Math.max(worst, check('stream extend', answers[0].sessionResult, onB[1], 4, 5));
  onB[1].length = 5;
  const batch = client.streamForSession(onB[0].id, { timeoutMs: 60000 });
  batch.write(2, attnserve.extendSessionsRequest(onB.map((s) => ({
    sessionId: s.id, tokens: tokens(s, 5, 6), expectedLength: 5,
  }))));
  batch.end();
  for await (const answer of batch) {
    assert.equal(answer.code, 0, answer.message);
    assert.equal(answer.result, null);
    answer.sessionResults.forEach((r, j) => {
      worst = Math.max(worst, check(`stream extendSessions ${j}`, r, onB[j], 5, 6));
    });
  }

  // A session idle past its TTL is lost, and sessionLostReason says why (an ABORTED is not).
  const brief = await client.createSession({ layout, idleTtlUs: 1000 });
  await new Promise((resolve) => setTimeout(resolve, 50));  // far beyond the TTL, whatever the load
  await assert.rejects(client.getSession(brief.sessionId), (err) => {
    assert.equal(attnserve.sessionLostReason(err), 'expired', String(err));
    return true;
  });
  assert.equal(attnserve.sessionLostReason(stale[1]), '');

  // A fork stays with its parent's replica.
  const child = await client.forkSession(sessions[0].id);
  assert.equal(attnserve.sessionOwner(child.sessionId), a);
  assert.equal((await client.getSession(child.sessionId)).length, 4);
  await client.closeSession(child.sessionId);

  // An owner that is none of the client's addresses: refused before anything is sent.
  const unknown = '10.254.0.1:1/0123abcd/1';
  const namesIt = (err) => {
    assert.ok(err instanceof RangeError, String(err));
    assert.ok(err.message.includes(unknown), err.message);
    assert.ok(err.message.includes(a) && err.message.includes(b), err.message);
    return true;
  };
  await assert.rejects(client.getSession(unknown), namesIt);
  await assert.rejects(client.extendSession(unknown, tokens(sessions[0], 0, 1)), namesIt);
  await assert.rejects(client.closeSession(unknown), namesIt);
  await assert.rejects(client.forkSession(unknown), namesIt);
  await assert.rejects(client.extendSessions([
    { sessionId: sessions[0].id, tokens: tokens(sessions[0], 4, 5), expectedLength: 4 },
    { sessionId: unknown, tokens: tokens(sessions[0], 4, 5) },
  ]), namesIt);
  assert.equal((await client.getSession(sessions[0].id)).length, 4, 'nothing was sent');
  assert.throws(() => client.streamForSession(unknown), namesIt);
  await assert.rejects(client.getSession('no-owner'), /<owner>\/<instance>\/<key>/);
  await assert.rejects(client.listSessions({ replica: '10.254.0.1:1' }), /none of this client/);

  // C's ids name another owner: its session is closed again and the call refused.
  const withC = new attnserve.Client([a, c]);
  await assert.rejects(withC.createSession({ layout, replica: c }), (err) => {
    assert.match(err.message, new RegExp(`replica at ${c} issued sessionId`));
    assert.match(err.message, /--session_owner/);
    return true;
  });
  assert.equal((await withC.listSessions({ replica: c })).usage.sessions, 0);
  withC.close();

  for (const s of sessions) await client.closeSession(s.id);
  for (const replica of [a, b]) {
    const usage = (await client.listSessions({ replica })).usage;
    assert.equal(usage.sessions, 0);
    assert.equal(usage.pagesUsed, 0);
  }
  console.log(`routing over ${a} and ${b}: sessions on their owners, max |error| vs float64 ` +
              `${worst.toExponential(2)}; all checks passed`);
  client.close();
  direct[a].close();
  direct[b].close();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
