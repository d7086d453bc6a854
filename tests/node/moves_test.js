// The installed attnserve Node.js package follows sessions moved between live server processes:
// B, C and A, A started with --session_peers=<B>,<C> (each names itself in session ids by the
// address it listens on). Three sessions are created on A through a client of [A, B, C]; one is
// moved by that client's moveSession and extended under its old id (the client remembers the
// move: a stream for the old id opens on the new replica); one is moved to C by an operator's
// other client and extended under its old id by a fresh client (which follows A's "session
// moved to" answer); one is moved to B by the operator and extended, beside the others, in an
// extendSessions whose items name the old ids (they follow ExtendSessionResult.movedTo and are
// merged in place). Every output equals float64 causal attention over the session's whole
// sequence, and each result names the id in use. Then A drains (SIGTERM to A_PID) and exits,
// having moved its last session: fresh clients, whose throttle rejects every call it may,
// reach it by its id on A in an extendSessions (the call to A fails; the step is found on B or
// C and sent again, not judged again by the throttle) and in an extendSession.
//   node moves_test.js A_ADDRESS B_ADDRESS C_ADDRESS A_PID  (beside reference.js, where
//                                                           `require('attnserve')` is installed)
'use strict';
const assert = require('node:assert/strict');
const attnserve = require('attnserve');
const { rng, tensor, maxError, sessionAttention64 } = require('./reference');

const fs = require('node:fs');

const [a, b, c, aPid] = process.argv.slice(2);
const { FAILED_PRECONDITION } = attnserve.grpc.status;
const [HQ, HKV, D, LENGTH] = [4, 2, 8, 8];
const TOLERANCE = 1e-5;
const normal = rng(33);

// Tokens from..to of a session's data as the { q, k, v } of one extend.
function tokens(data, from, to) {
  const rows = (t, h) => ({
    shape: [to - from, h, D], data: t.data.slice(from * h * D, to * h * D),
  });
  return { q: rows(data.q, HQ), k: rows(data.k, HKV), v: rows(data.v, HKV) };
}

// Asserts that `result` answers tokens from..to of `data`, against float64 attention.
function check(what, result, data, from, to) {
  assert.ok(!(result instanceof Error), `${what}: ${result && result.message}`);
  assert.equal(result.length, to, what);
  const want = sessionAttention64(data.q.data, data.k.data, data.v.data, [HQ, HKV, D], from, to);
  const err = maxError(result.output.data, want.output);
  assert.ok(err < TOLERANCE, `${what}: max |error| ${err}`);
}

async function main() {
  const replicas = [a, b, c];
  const client = new attnserve.Client(replicas, { timeoutMs: 60000 });
  const operator = new attnserve.Client(a, { timeoutMs: 60000 });  // `client` sees not its moves
  const layout = { numHeads: HQ, numKvHeads: HKV, headDim: D };
  const sessions = [];
  for (let i = 0; i < 4; i++) {
    const info = await client.createSession({ layout, replica: a });
    assert.equal(attnserve.sessionOwner(info.sessionId), a);
    const s = {
      old: info.sessionId, q: tensor([LENGTH, HQ, D], normal),
      k: tensor([LENGTH, HKV, D], normal), v: tensor([LENGTH, HKV, D], normal),
    };
    check(`prefill ${i}`, await client.extendSession(s.old, tokens(s, 0, 5),
      { expectedLength: 0 }), s, 0, 5);
    sessions.push(s);
  }
  const [s0, s1, s2, s3] = sessions;

  // 0: moved by this client to B, then extended under its old id.
  const moved = await client.moveSession(s0.old, b);
  assert.equal(attnserve.sessionOwner(moved.sessionId), b);
  assert.ok(moved.bytes > 0, JSON.stringify(moved));
  const r0 = await client.extendSession(s0.old, tokens(s0, 5, 6), { expectedLength: 5 });
  check('extend after moveSession', r0, s0, 5, 6);
  assert.equal(r0.sessionId, moved.sessionId);
  // The client remembers the move: a stream for the old id (streams route by it, and do not
  // follow) opens on B, which answers an extend under the new id.
  const stream = client.streamForSession(s0.old, { timeoutMs: 60000 });
  stream.write(1, attnserve.extendRequest(moved.sessionId, tokens(s0, 6, 7),
    { expectedLength: 6 }));
  stream.end();
  let answered = 0;
  for await (const answer of stream) {
    assert.equal(answer.code, 0, answer.message);
    check('stream on the remembered replica', answer.sessionResult, s0, 6, 7);
    answered++;
  }
  assert.equal(answered, 1);
  // A answers the old id "moved", naming the new one (asked through the raw stub: a client,
  // even of A alone, would follow).
  const raw = new Promise((resolve, reject) => {
    operator.stub.GetSession({ sessionId: s0.old }, (err, r) => (err ? reject(err) : resolve(r)));
  });
  await assert.rejects(raw, (err) => {
    assert.equal(err.code, FAILED_PRECONDITION, String(err));
    assert.equal(attnserve.sessionMovedTo(err), moved.sessionId);
    assert.equal(err.metadata.get('attnserve-session-moved')[0], moved.sessionId);
    return true;
  });
  assert.equal(attnserve.sessionMovedTo(new Error('session moved to')), '');

  // 1: moved to C by the operator; a fresh client extends it under its old id.
  const toC = (await operator.moveSession(s1.old, c)).sessionId;
  assert.equal(attnserve.sessionOwner(toC), c);
  const fresh = new attnserve.Client(replicas, { timeoutMs: 60000 });
  const r1 = await fresh.extendSession(s1.old, tokens(s1, 5, 6), { expectedLength: 5 });
  check('fresh client, old id', r1, s1, 5, 6);
  assert.equal(r1.sessionId, toC);
  fresh.close();

  // 2: moved to B by the operator. One batch of all three under their old ids: 0's goes to B
  // (remembered), 1's and 2's to A, which answers them movedTo; they follow, merged in place.
  const toB = (await operator.moveSession(s2.old, b)).sessionId;
  const batch = await client.extendSessions([
    { sessionId: s2.old, tokens: tokens(s2, 5, 6), expectedLength: 5 },
    { sessionId: s0.old, tokens: tokens(s0, 7, 8), expectedLength: 7 },
    { sessionId: s1.old, tokens: tokens(s1, 6, 7), expectedLength: 6 },
  ]);
  check('batch item 0 (moved to B)', batch[0], s2, 5, 6);
  check('batch item 1 (on B, remembered)', batch[1], s0, 7, 8);
  check('batch item 2 (moved to C)', batch[2], s1, 6, 7);
  assert.deepEqual(batch.map((r) => r.sessionId), [toB, moved.sessionId, toC]);

  // Every call naming an old id now reaches its session; all close there.
  for (const [s, id, length] of [[s0, moved.sessionId, 8], [s1, toC, 7], [s2, toB, 6]]) {
    const info = await client.getSession(s.old);
    assert.deepEqual([info.sessionId, info.length], [id, length]);
    await client.closeSession(s.old);
  }
  for (const replica of [b, c]) {
    assert.equal((await client.listSessions({ replica })).usage.sessions, 0, replica);
  }
  assert.equal((await client.listSessions({ replica: a })).usage.sessions, 1);  // 3's

  // A drains: it moves 3 to B or C, then exits (its process gone, or a zombie).
  process.kill(Number(aPid), 'SIGTERM');
  for (let i = 0; !exited(aPid); i++) {
    assert.ok(i < 12000, `attnserve A (pid ${aPid}) did not exit after SIGTERM`);
    await sleep(20);
  }
  const eager = () => new attnserve.Client(replicas,
    { timeoutMs: 60000, throttle: new attnserve.Throttle({}, { rand: () => 0 }) });
  const batchClient = eager();
  const [r3] = await batchClient.extendSessions([
    { sessionId: s3.old, tokens: tokens(s3, 5, 6), expectedLength: 5 }]);
  check('batch after A\'s drain', r3, s3, 5, 6);
  assert.ok([b, c].includes(attnserve.sessionOwner(r3.sessionId)), r3.sessionId);
  // The call to A refused, the one sent again answered.
  assert.deepEqual(batchClient.throttle.counts(), { requests: 2, accepts: 1 });
  batchClient.close();
  const oneClient = eager();
  const r3b = await oneClient.extendSession(s3.old, tokens(s3, 6, 7), { expectedLength: 6 });
  check('extend after A\'s drain', r3b, s3, 6, 7);
  assert.equal(r3b.sessionId, r3.sessionId);
  assert.deepEqual(oneClient.throttle.counts(), { requests: 2, accepts: 1 });
  await oneClient.closeSession(s3.old);
  oneClient.close();
  console.log(`moves over ${a} -> ${b}, ${c}: followed; all checks passed`);
  client.close();
  operator.close();
}

/** Whether process `pid` has exited: gone, or a zombie not yet waited for. */
function exited(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z');
  } catch (e) {
    return true;
  }
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
