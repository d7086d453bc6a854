// The installed package's client-side adaptive throttling (throttle.js), with no attnserve
// process: the shared cases of tests/testing/throttle_cases.json (the Python client runs the
// same) on a fake clock and fake random draws; the options' checks; a Client with a fake stub:
// answers UNAVAILABLE make it reject compute calls locally (nothing sent), INVALID_ARGUMENT
// answers never do, control calls are never throttled nor counted, { throttle: false } turns it
// off, extendSessions is judged once whatever the replicas it reaches; and an in-process grpc-js
// server, so that the pushback trailer comes through real gRPC.
//   node throttle_test.js CASES_JSON   (where `require('attnserve')` is installed)
'use strict';
const assert = require('node:assert/strict');
const fs = require('node:fs');
const attnserve = require('attnserve');
const { parsePushback, pushbackValue, isAccept } = require('attnserve/throttle');

const { grpc, Throttle, ThrottledError } = attnserve;
const { status } = grpc;
const ADVICE = '; retry later or disable with {throttle: false}';

/** A clock in milliseconds set in seconds, as the cases give times. */
function fakeClock(t = 0) {
  const clock = () => clock.t * 1000;
  clock.t = t;
  return clock;
}

/** Hands out the draws queued; drawing with none queued fails the test. */
function fakeRand() {
  const rand = () => {
    assert.ok(rand.queue.length > 0, 'the throttle drew a random number where none was expected');
    return rand.queue.shift();
  };
  rand.queue = [];
  return rand;
}

function sharedCases(file) {
  const { cases } = JSON.parse(fs.readFileSync(file, 'utf8'));
  assert.ok(cases.length > 10);
  for (const c of cases) {
    const clock = fakeClock();
    const rand = fakeRand();
    const throttle = new Throttle({
      enabled: c.enabled ?? true, k: c.k ?? 2, windowSeconds: c.window_seconds ?? 30,
      maxProbability: c.max_probability ?? 0.95,
    }, { clock, rand });
    c.events.forEach((e, i) => {
      const where = `${c.name}: event ${i} ${JSON.stringify(e)}`;
      clock.t = e.t;
      if ('p' in e) {
        const p = throttle.probability();
        assert.ok(Math.abs(p - e.p) <= 1e-9, `${where}: p ${p}`);
      }
      if ('requests' in e || 'accepts' in e) {
        assert.deepEqual(throttle.counts(), { requests: e.requests, accepts: e.accepts }, where);
      }
      if ('record' in e) {
        assert.ok(e.record in status, where);
        for (let n = 0; n < (e.times ?? 1); n++) throttle.record(status[e.record], e.pushback);
      }
      if ('check' in e) {
        if ('rand' in e) rand.queue.push(e.rand);
        const reason = throttle.check();
        assert.deepEqual(rand.queue, [], `${where}: the draw was not made`);
        if (e.check === 'send') {
          assert.equal(reason, null, where);
          return;
        }
        assert.equal(typeof reason, 'string', where);
        if ('message' in e) assert.equal(reason, e.message + ADVICE, where);
        assert.ok(reason.includes(e.check === 'pushback' ? 'grpc-retry-pushback-ms' : 'k='),
          where);
      }
    });
  }
  return cases.length;
}

function options() {
  const client = new attnserve.Client('127.0.0.1:1');
  assert.ok(client.throttle instanceof Throttle);
  assert.deepEqual(client.throttle.options,
    { enabled: true, k: 2, windowSeconds: 30, maxProbability: 0.95 });
  client.close();
  for (const off of [false, null, { enabled: false }]) {
    const c = new attnserve.Client('127.0.0.1:1', { throttle: off });
    assert.equal(c.throttle, null, JSON.stringify(off));
    c.close();
  }
  const shared = new Throttle({ k: 3 });
  const c = new attnserve.Client('127.0.0.1:1', { throttle: shared });
  assert.equal(c.throttle, shared);
  c.close();
  for (const [throttle, Type, message] of [
    [{ k: 0.5 }, RangeError, 'throttle.k must be >= 1; was 0.5'],
    [{ k: NaN }, RangeError, 'throttle.k must be >= 1; was NaN'],
    [{ k: Infinity }, RangeError, 'throttle.k must be finite; was Infinity'],
    [{ k: '2' }, TypeError, 'throttle.k must be a number; was "2"'],
    [{ enabled: false, k: 0 }, RangeError, 'throttle.k must be >= 1; was 0'],
    [{ windowSeconds: 0 }, RangeError, 'throttle.windowSeconds must be an integer >= 1; was 0'],
    [{ windowSeconds: 1.5 }, RangeError,
      'throttle.windowSeconds must be an integer >= 1; was 1.5'],
    [{ maxProbability: 0 }, RangeError,
      'throttle.maxProbability must be above 0 and at most 1; was 0'],
    [{ maxProbability: 1.5 }, RangeError,
      'throttle.maxProbability must be above 0 and at most 1; was 1.5'],
    [{ maxProbability: NaN }, RangeError,
      'throttle.maxProbability must be above 0 and at most 1; was NaN'],
    [{ maxProbability: '1' }, TypeError, 'throttle.maxProbability must be a number; was "1"'],
    [{ K: 3 }, RangeError,
      'throttle.K is not an option (enabled, k, windowSeconds, maxProbability)'],
    ['on', TypeError, 'throttle must be an options object, a Throttle, true or false; was "on"'],
  ]) {
    assert.throws(() => new attnserve.Client('127.0.0.1:1', { throttle }), (err) => {
      assert.ok(err instanceof Type, `${JSON.stringify(throttle)}: ${err}`);
      assert.equal(err.message, message);
      return true;
    });
  }

  assert.equal(parsePushback('250'), 250);
  assert.equal(parsePushback(Buffer.from('0')), 0);
  for (const bad of [null, undefined, '', '-1', '1.5', ' 1', '\u0663', 250]) {
    assert.equal(parsePushback(bad), null, String(bad));
  }
  const md = new grpc.Metadata();
  md.add('x', '1');
  md.add('grpc-retry-pushback-ms', '5');
  md.add('grpc-retry-pushback-ms', '9');
  assert.equal(pushbackValue(md), '5');
  assert.equal(pushbackValue(new grpc.Metadata()), null);
  assert.equal(pushbackValue(undefined), null);
  for (const [name, code] of Object.entries(status)) {
    if (typeof code !== 'number') continue;
    assert.equal(isAccept(code), name !== 'UNAVAILABLE' && name !== 'DEADLINE_EXCEEDED', name);
  }

  const e = new ThrottledError('throttled by the client: why');
  assert.ok(e instanceof Error);
  assert.equal(e.code, status.UNAVAILABLE);
  assert.equal(e.details, 'throttled by the client: why');
  assert.equal(e.message, '14 UNAVAILABLE: throttled by the client: why');
  assert.equal(attnserve.sessionLostReason(e), '');
}

function tensorMessage(shape) {
  return attnserve.toTensor({ shape, data: new Float32Array(shape.reduce((a, b) => a * b, 1)) });
}

/** A grpc-js error as a failed call's callback gets it. */
function grpcError(code, details, trailers = {}) {
  const metadata = new grpc.Metadata();
  for (const [k, v] of Object.entries(trailers)) metadata.add(k, v);
  return Object.assign(new Error(`${code} ${details}`), { code, details, metadata });
}

/**
 * A stub answering each rpc with answers[rpc] (a response, or an error for the callback) on the
 * next turn of the event loop, counting the calls that reached it.
 */
function fakeStub() {
  const session = (length) => ({ output: tensorMessage([1, 1, 2]), length, timing: {} });
  const stub = {
    calls: {},
    answers: {
      Attend: { output: tensorMessage([1, 1, 1, 2]), timing: {} },
      MultiHeadAttention: { output: tensorMessage([1, 1, 2]), timing: {} },
      GetServerInfo: { version: 'fake' },
      ListModules: { modules: [] },
      CreateSession: { session: { sessionId: 'o/i/1', length: 0 } },
      ExtendSession: session(1),
      ExtendSessions: { results: [{ code: 0, response: session(1) }] },
      GetSession: { session: { sessionId: 'o/i/1', length: 0 } },
      CloseSession: {},
    },
  };
  for (const rpc of Object.keys(stub.answers)) {
    stub[rpc] = (request, callOptions, callback) => {
      stub.calls[rpc] = (stub.calls[rpc] || 0) + 1;
      const a = stub.answers[rpc];
      setImmediate(() => (a instanceof Error ? callback(a, undefined) : callback(null, a)));
    };
  }
  stub.close = () => {};
  return stub;
}

function fakeClient(throttle = {}) {
  const clock = fakeClock(100);
  const rand = fakeRand();
  const client = new attnserve.Client('127.0.0.1:1', {
    throttle: new Throttle(throttle, { clock, rand }),
  });
  client.stub.close();
  client.stub = fakeStub();
  return { client, stub: client.stub, clock, rand };
}

const Q = { shape: [1, 1, 1, 2], data: [0, 0] };
const X = { shape: [1, 1, 2], data: [0, 0] };
const TOKENS = { q: X, k: X, v: X };

async function fakeStubClient() {
  {
    const { client, stub, clock, rand } = fakeClient();
    stub.answers.Attend = grpcError(status.UNAVAILABLE, 'overloaded');
    rand.queue.push(0.99, 0.99);  // p = 0 (no draw), then 1/2 and 2/3: each goes through
    for (let i = 0; i < 3; i++) {
      await assert.rejects(client.attend(Q, Q, Q), (err) => err.details === 'overloaded');
    }
    assert.deepEqual(rand.queue, []);
    assert.equal(stub.calls.Attend, 3);
    assert.deepEqual(client.throttle.counts(), { requests: 3, accepts: 0 });
    assert.ok(Math.abs(client.throttle.probability() - 0.75) < 1e-12);
    rand.queue.push(0.74);
    await assert.rejects(client.attend(Q, Q, Q), (err) => {
      assert.ok(err instanceof ThrottledError);
      assert.equal(err.code, status.UNAVAILABLE);
      assert.equal(err.details, 'throttled by the client: the server accepted 0 of the last 3 ' +
        'calls in 30 s (adaptive throttling, k=2)' + ADVICE);
      return true;
    });
    assert.equal(stub.calls.Attend, 3, 'a rejected call reached the stub');
    assert.deepEqual(client.throttle.counts(), { requests: 4, accepts: 0 });
    // multiHeadAttention and extendSession share the throttle.
    rand.queue.push(0);
    await assert.rejects(client.multiHeadAttention('demo', X), ThrottledError);
    assert.equal(stub.calls.MultiHeadAttention, undefined);
    const info = await client.createSession({ layout: { numHeads: 1, numKvHeads: 1, headDim: 2 } });
    rand.queue.push(0);
    await assert.rejects(client.extendSession(info.sessionId, TOKENS), ThrottledError);
    assert.equal(stub.calls.ExtendSession, undefined);
    // A request that cannot be built fails before the throttle: not counted, nothing drawn.
    await assert.rejects(client.extendSession(info.sessionId, { q: X }), TypeError);
    // The control calls go through all along, uncounted.
    assert.equal((await client.serverInfo()).version, 'fake');
    await client.listModules();
    await client.getSession(info.sessionId);
    await client.closeSession(info.sessionId);
    assert.deepEqual(client.throttle.counts(), { requests: 6, accepts: 0 });
    // A window later the refusals are forgotten.
    clock.t += 30;
    assert.equal(client.throttle.probability(), 0);
    stub.answers.Attend = fakeStub().answers.Attend;
    await client.attend(Q, Q, Q);
    assert.deepEqual(client.throttle.counts(), { requests: 1, accepts: 1 });
  }
  {
    // INVALID_ARGUMENT and NOT_FOUND answers: accepts, however many (a draw would fail).
    const { client, stub } = fakeClient();
    stub.answers.Attend = grpcError(status.INVALID_ARGUMENT, 'query.shape');
    stub.answers.ExtendSession = grpcError(status.NOT_FOUND, 'no session');
    for (let i = 0; i < 200; i++) {
      await assert.rejects(client.attend(Q, Q, Q), (err) => err.code === status.INVALID_ARGUMENT);
      await assert.rejects(client.extendSession('o/i/1', TOKENS),
        (err) => err.code === status.NOT_FOUND);
    }
    assert.equal(stub.calls.Attend, 200);
    assert.deepEqual(client.throttle.counts(), { requests: 400, accepts: 400 });
  }
  {
    const { client, stub } = fakeClient();
    stub.answers.Attend = grpcError(status.DEADLINE_EXCEEDED, 'late');
    await assert.rejects(client.attend(Q, Q, Q));
    assert.deepEqual(client.throttle.counts(), { requests: 1, accepts: 0 });
  }
  {
    // Off: every call is sent.
    const client = new attnserve.Client('127.0.0.1:1', { throttle: false });
    client.stub.close();
    client.stub = fakeStub();
    client.stub.answers.Attend = grpcError(status.UNAVAILABLE, 'overloaded');
    for (let i = 0; i < 50; i++) {
      await assert.rejects(client.attend(Q, Q, Q), (err) => !(err instanceof ThrottledError));
    }
    assert.equal(client.stub.calls.Attend, 50);
  }
  {
    // The pushback trailer of a failed answer.
    const { client, stub, clock, rand } = fakeClient();
    stub.answers.Attend = grpcError(status.UNAVAILABLE, 'overloaded',
      { 'grpc-retry-pushback-ms': '1500' });
    await assert.rejects(client.attend(Q, Q, Q));
    stub.answers.Attend = fakeStub().answers.Attend;
    clock.t += 1.25;
    await assert.rejects(client.attend(Q, Q, Q), (err) => {
      assert.equal(err.details, 'throttled by the client: the server asked for no calls for ' +
        '1500 ms (grpc-retry-pushback-ms)' + ADVICE);
      return true;
    });
    assert.equal(stub.calls.Attend, 1);
    clock.t += 0.25;
    rand.queue.push(0.99);  // p is 2/3 now
    await client.attend(Q, Q, Q);
    assert.equal(stub.calls.Attend, 2);
  }
  {
    // Two replicas, one throttle, judging an extendSessions once: rejected, no replica's call
    // is sent and the call rejects; admitted, each replica's call is sent and counted.
    const clock = fakeClock();
    const rand = fakeRand();
    const client = new attnserve.Client(['10.0.0.1:1', '10.0.0.2:1'],
      { throttle: new Throttle({}, { clock, rand }) });
    client.close();
    client.replicaStubs = [fakeStub(), fakeStub()];
    const a = '10.0.0.1:1/i/1';
    const b = '10.0.0.2:1/i/1';
    client.throttle.record(status.UNAVAILABLE);  // p = 1/2
    rand.queue.push(0.1);  // rejected
    const both = [{ sessionId: a, tokens: TOKENS }, { sessionId: b, tokens: TOKENS }];
    await assert.rejects(client.extendSessions(both), (err) => {
      assert.ok(err instanceof ThrottledError);
      assert.ok(err.details.startsWith('throttled by the client'), err.details);
      return true;
    });
    assert.equal(client.replicaStubs[0].calls.ExtendSessions, undefined);
    assert.equal(client.replicaStubs[1].calls.ExtendSessions, undefined);
    assert.deepEqual(client.throttle.counts(), { requests: 2, accepts: 0 });  // p = 2/3
    rand.queue.push(0.9);  // admitted: both replicas' calls
    const out = await client.extendSessions(both);
    assert.equal(out[0].length, 1);
    assert.equal(out[1].length, 1);
    assert.equal(client.replicaStubs[0].calls.ExtendSessions, 1);
    assert.equal(client.replicaStubs[1].calls.ExtendSessions, 1);
    assert.deepEqual(client.throttle.counts(), { requests: 4, accepts: 2 });
    assert.deepEqual(rand.queue, []);
  }
}

/** An in-process grpc-js server answering Attend as `server.behaviour` says; its address. */
async function refusingServer() {
  const server = new grpc.Server();
  server.behaviour = { code: status.UNAVAILABLE, pushback: null, calls: 0 };
  server.addService(attnserve.v1().AttentionService.service, {
    Attend(call, callback) {
      const b = server.behaviour;
      b.calls++;
      const metadata = new grpc.Metadata();
      if (b.pushback !== null) metadata.add('grpc-retry-pushback-ms', b.pushback);
      if (b.code === status.OK) {
        callback(null, { output: tensorMessage([1, 1, 1, 2]), timing: {} }, metadata);
      } else {
        callback({ code: b.code, details: 'refused', metadata });
      }
    },
  });
  const port = await new Promise((resolve, reject) => {
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(),
      (err, p) => (err ? reject(err) : resolve(p)));
  });
  return [server, `127.0.0.1:${port}`];
}

async function inProcessServer() {
  const [server, address] = await refusingServer();
  try {
    const clock = fakeClock();
    const rand = fakeRand();
    server.behaviour.pushback = '20000';
    const client = new attnserve.Client(address,
      { throttle: new Throttle({}, { clock, rand }), timeoutMs: 10000 });
    await assert.rejects(client.attend(Q, Q, Q), (err) => {
      assert.equal(err.code, status.UNAVAILABLE);
      assert.ok(!(err instanceof ThrottledError));
      return true;
    });
    for (let i = 0; i < 3; i++) {
      await assert.rejects(client.attend(Q, Q, Q),
        (err) => err instanceof ThrottledError &&
          err.details.includes('20000 ms (grpc-retry-pushback-ms)'));
    }
    assert.equal(server.behaviour.calls, 1);
    clock.t = 20;
    server.behaviour.code = status.OK;
    rand.queue.push(0.99);  // p = 1/2: the calls held back were not counted
    await client.attend(Q, Q, Q);
    assert.deepEqual(rand.queue, []);
    assert.equal(server.behaviour.calls, 2);
    assert.deepEqual(client.throttle.counts(), { requests: 2, accepts: 1 });
    // INVALID_ARGUMENT with a value that is not a non-negative integer: never throttled.
    clock.t = 100;
    server.behaviour.code = status.INVALID_ARGUMENT;
    server.behaviour.pushback = 'soon';
    for (let i = 0; i < 20; i++) {
      await assert.rejects(client.attend(Q, Q, Q), (err) => err.code === status.INVALID_ARGUMENT);
    }
    assert.equal(server.behaviour.calls, 22);
    assert.deepEqual(client.throttle.counts(), { requests: 20, accepts: 20 });
    client.close();
  } finally {
    server.forceShutdown();
  }
}

async function main() {
  const n = sharedCases(process.argv[2]);
  options();
  await fakeStubClient();
  await inProcessServer();
  console.log(`throttle: ${n} shared cases, options, fake stubs and an in-process server pass`);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
