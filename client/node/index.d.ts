// Types of the attnserve Node.js client (index.js). Field names are the proto's
// (proto/attnserve/v1/attention.proto) in lowerCamelCase; int64 fields are numbers.
import * as grpc from '@grpc/grpc-js';

/** Tensor data as floats: float32 by default; float16/bfloat16 are rounded to nearest even. */
export type Dtype = 'float32' | 'float16' | 'bfloat16';

/** A tensor going in: row-major values and their shape. */
export interface TensorInput {
  shape: number[];
  data: ArrayLike<number>;
  dtype?: Dtype;
}

/** The proto's own Tensor message, passed through unchanged. */
export interface TensorMessage {
  dtype: 'DTYPE_FLOAT32' | 'DTYPE_FLOAT16' | 'DTYPE_BFLOAT16' | 'DTYPE_BOOL';
  shape: number[];
  data: Buffer;
}

/** A tensor coming out: float16 and bfloat16 widened exactly to float32. */
export interface TensorOutput {
  shape: number[];
  dtype: 'float32' | 'float16' | 'bfloat16' | 'bool';
  data: Float32Array;
}

/** A mask: booleans broadcastable to [B, H, Lq, Lk]; true means the key may be attended. */
export interface MaskInput {
  shape: number[];
  data: ArrayLike<boolean | number>;
}

/** The score modifications and the kind of attention, for calls and sessions alike. */
export interface AttentionKindOptions {
  /** Logit soft-cap: scores become softcap·tanh(score / softcap). 0: none. */
  softcap?: number;
  /** ALiBi: 'standard' (the paper's slopes) or one slope per query head. */
  alibi?: 'standard' | ArrayLike<number>;
  /** 'softmax' (default) or 'linear' attention (Katharopoulos et al. 2020). A linear-attention
   * session keeps its running state only (no window, softcap, alibi or scale). */
  kind?: 'softmax' | 'linear';
  /** Linear attention's feature map (default 'elu_plus_one'). */
  featureMap?: 'elu_plus_one' | 'relu' | 'identity';
}

export interface AttentionOptions extends AttentionKindOptions {
  /** Bottom-right aligned causal mask. */
  causal?: boolean;
  mask?: MaskInput | TensorMessage;
  /** Per batch row, how many keys are valid. */
  keyLengths?: ArrayLike<number>;
  /** Instead of 1/sqrt(D). */
  scale?: number;
  /** Return the softmax weights [B, H, Lq, Lk] too. */
  returnWeights?: boolean;
  /** A sliding window [left, right] around the query's aligned position; -1 leaves a side open. */
  window?: [number, number];
  /** The dtype sent (default: the query's, else float32); key and value follow the query. */
  dtype?: Dtype;
  /** Per call deadline (default: the client's timeoutMs). */
  timeoutMs?: number;
}

export interface MultiHeadOptions extends AttentionOptions {
  /** [B, Lk, d_model]; with value, or neither for self-attention. */
  key?: TensorInput | TensorMessage;
  value?: TensorInput | TensorMessage;
}

/** The server's Timing message (microseconds). */
export interface Timing {
  queuedUs: number;
  computeUs: number;
  serverUs: number;
  batchSize: number;
  backend: string;
}

export interface Result {
  output: TensorOutput;
  /** Set when returnWeights was asked for. */
  weights: TensorOutput | null;
  timing: Timing;
}

export interface ModuleInfo {
  name: string;
  dModel: number;
  numHeads: number;
  headDim: number;
  parameterBytes: number;
  source: string;
}

/** GetServerInfo's response; see the proto for every field. */
export interface ServerInfo {
  version: string;
  backends: Array<{
    name: string; active: boolean; devices: Array<{ name: string; memoryBytes: number }>;
  }>;
  limits: Record<string, number>;
  batching: Record<string, number | boolean>;
  float32Precision: string;
  [field: string]: unknown;
}

/** Built by attendRequest or multiHeadRequest; sent by AttentionStream.write. */
export interface AttendRequest {
  query: TensorMessage; key: TensorMessage; value: TensorMessage; options: object;
}
export interface MultiHeadAttentionRequest {
  module: string; query: TensorMessage; key?: TensorMessage; value?: TensorMessage;
  options: object;
}

/**
 * One answer of the stream: code 0 with the result of the request's kind, or a gRPC status code
 * and message (every result null).
 */
export interface StreamAnswer {
  requestId: number;
  code: number;
  message: string;
  /** For an AttendRequest or MultiHeadAttentionRequest. */
  result: Result | null;
  /** For an ExtendSessionRequest (extendRequest). */
  sessionResult: SessionResult | null;
  /** For an ExtendSessionsRequest: one item per step, in the steps' order. */
  sessionResults: Array<SessionResult | StepError> | null;
}

export class AttentionStream implements AsyncIterable<StreamAnswer> {
  /** Sends `request` under `requestId` (echoed by its answer). */
  write(requestId: number, request: AttendRequest | MultiHeadAttentionRequest |
        ExtendSessionRequest | ExtendSessionsRequest): boolean;
  /** No more requests; the answers still arrive. */
  end(): void;
  cancel(): void;
  /** The answers, in completion order. */
  [Symbol.asyncIterator](): AsyncIterator<StreamAnswer>;
}

/** A raw session's heads (the proto's HeadLayout). */
export interface HeadLayout {
  numHeads: number; numKvHeads: number; headDim: number; vHeadDim?: number;
}

/** The proto's SessionInfo; int64 fields are numbers. */
export interface SessionInfo {
  sessionId: string;
  module?: string;
  layout?: HeadLayout;
  cacheDtype: string;
  length: number;
  pages: number;
  sharedPages: number;
  bytes: number;
  pinned: boolean;
  idleTtlUs: number;
  idleUs: number;
  parentId: string;
  scale: number;
  /** Its score modifications: the window's left side (absent: none), soft-cap, ALiBi slopes. */
  windowLeft?: number;
  softcap: number;
  alibiSlopes: number[];
  /** 'ATTENTION_KIND_SOFTMAX' or 'ATTENTION_KIND_LINEAR', and a linear session's feature map. */
  kind: string;
  featureMap: string;
}

export interface CreateSessionOptions extends AttentionKindOptions {
  /** A loaded module (extends send input [L, d_model]); or give layout. */
  module?: string;
  /** A raw layout (extends send q [L, Hq, D], k and v [L, Hkv, D]). */
  layout?: HeadLayout;
  /** The cache's element type; default float32. */
  cacheDtype?: Dtype;
  scale?: number;
  pinned?: boolean;
  /** 0: the server's idle TTL. */
  idleTtlUs?: number;
  /** A sliding window: the keys before each token's position it attends. */
  window?: number;
  /** With several replicas: the one to create it on (default: the next in turn). */
  replica?: string;
  timeoutMs?: number;
}

/** New tokens: q, k, v for raw sessions (token-major), input for module sessions. */
export interface SessionTokens {
  q?: TensorInput | TensorMessage;
  k?: TensorInput | TensorMessage;
  v?: TensorInput | TensorMessage;
  input?: TensorInput | TensorMessage;
}

export interface ExtendSessionOptions {
  /** Applies only if the session holds exactly this many tokens, else ABORTED (safe retry). */
  expectedLength?: number;
  /** Also return the log-sum-exp [L, Hq] of each new query. */
  returnLse?: boolean;
  dtype?: Dtype;
  timeoutMs?: number;
}

export interface SessionResult {
  /** Raw sessions [L, Hq, Dv]; module sessions [L, d_model]. */
  output: TensorOutput;
  lse: TensorOutput | null;
  /** Tokens in the session after the extend. */
  length: number;
  timing: Timing;
  /** The id the session was extended under: a new one when it had moved to another replica. */
  sessionId: string;
}

/** What moveSession resolves to (the proto's MoveSessionResponse). */
export interface MoveSessionResult {
  /** The session's new id, on the peer (the old id now answers "session moved to" it). */
  sessionId: string;
  /** Bytes sent (pages and settings). */
  bytes: number;
  /** How long the session could not be extended: the copy and the switch. */
  pauseUs: number;
}

/** One step of extendSessions: a session, its new tokens and extendSession's options. */
export interface SessionStep {
  sessionId: string;
  tokens: SessionTokens;
  expectedLength?: number;
  returnLse?: boolean;
  dtype?: Dtype;
}

/** A failed step of extendSessions: grpc-js's error fields, as ExtendSession would reject. */
export class StepError extends Error {
  constructor(code: number, details: string);
  /** A grpc.status value. */
  code: number;
  /** The server's message. */
  details: string;
}

/** Built by extendRequest / extendSessionsRequest; sent by AttentionStream.write. */
export interface ExtendSessionRequest {
  sessionId: string; input?: TensorMessage; query?: TensorMessage; key?: TensorMessage;
  value?: TensorMessage; expectedLength?: number; returnLse: boolean;
}
export interface ExtendSessionsRequest {
  steps: ExtendSessionRequest[];
}

/** The proto's SessionPoolUsage: one replica's pool at the time of asking. */
export interface SessionPoolUsage {
  pagesTotal: number;
  pagesUsed: number;
  tokens: number;
  sessions: number;
  pinnedSessions: number;
  pinnedPages: number;
}

export interface ListSessionsResult {
  /** Sorted by id. */
  sessions: SessionInfo[];
  /** Pass as pageToken for the next page; empty on the last page. */
  nextPageToken: string;
  usage: SessionPoolUsage;
}

/**
 * Client-side adaptive throttling (Google's SRE book): a compute call is rejected locally with
 * probability min(maxProbability, max(0, (requests - k * accepts) / (requests + 1))) over the
 * last windowSeconds.
 */
export interface ThrottleOptions {
  /** Default true. */
  enabled?: boolean;
  /** At least 1; default 2 (lower sheds sooner). */
  k?: number;
  /** The window the counts cover, whole seconds; default 30. */
  windowSeconds?: number;
  /**
   * The most the probability can be, above 0 and at most 1 (1: uncapped); default 0.95, so that
   * at least 5% of calls go out and a closed throttle notices the server's recovery.
   */
  maxProbability?: number;
}

/** For tests: a fake clock and fake random draws. */
export interface ThrottleHooks {
  /** Milliseconds, monotonic; default performance.now(). */
  clock?: () => number;
  /** Uniform in [0, 1); default Math.random. */
  rand?: () => number;
}

/** One client's counts and decisions (or several clients', when shared). */
export class Throttle {
  constructor(options?: ThrottleOptions, hooks?: ThrottleHooks);
  /** The options, defaults filled in. */
  readonly options: Readonly<Required<ThrottleOptions>>;
  /** Before a compute call: null to send it, or why it is rejected (counted as a request). */
  check(): string | null;
  /** A sent call's answer: its grpc.status code and its grpc-retry-pushback-ms value, if any. */
  record(code: number, pushback?: string | Buffer | null): void;
  /** The probability that a call made now is rejected by the ratio. */
  probability(): number;
  /** The window's counts now. */
  counts(): { requests: number; accepts: number };
}

/** A call rejected by the client's throttle, nothing sent: grpc-js's error fields. */
export class ThrottledError extends Error {
  constructor(details: string);
  /** grpc.status.UNAVAILABLE. */
  code: number;
  /** Why, e.g. "throttled by the client: the server accepted 0 of the last 3 calls ...". */
  details: string;
  metadata: grpc.Metadata;
}

export interface ClientOptions {
  /** Default: insecure. */
  credentials?: grpc.ChannelCredentials;
  /** Per call deadline; default 60000. */
  timeoutMs?: number;
  channelOptions?: grpc.ChannelOptions;
  /** Default: round_robin when the target lists addresses (a list, "ipv4:", "ipv6:", "dns:"). */
  loadBalancing?: 'round_robin' | 'pick_first';
  /**
   * Client-side adaptive throttling of the compute calls: default on (k 2, 30 s); options, a
   * Throttle of your own, or false (or null) for none.
   */
  throttle?: ThrottleOptions | Throttle | boolean | null;
}

export class Client {
  /**
   * target: "host:port", "dns:///name:port" or "ipv4:a:p1,b:p2"; or a list of replicas
   * "host:port" (IPv4 or [IPv6] literals): stateless calls are balanced over them, and every
   * call naming a session goes to the replica its owner names. Sessions moved to another
   * replica are followed (index.js, Client, says how).
   */
  constructor(target: string | string[], options?: ClientOptions);
  /** The replicas' addresses; [] for a client of one target. */
  readonly replicas: string[];
  /** The channel's target ("ipv4:a,b" for a list of replicas). */
  readonly target: string;
  /** The client's throttle; null when off. */
  readonly throttle: Throttle | null;
  /** q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] -> output [B, Hq, Lq, Dv]. */
  attend(q: TensorInput | TensorMessage, k: TensorInput | TensorMessage,
         v: TensorInput | TensorMessage, options?: AttentionOptions): Promise<Result>;
  /** The module `module` on query [B, Lq, d_model] -> output [B, Lq, d_model]. */
  multiHeadAttention(module: string, query: TensorInput | TensorMessage,
                     options?: MultiHeadOptions): Promise<Result>;
  /** Registers safetensors bytes under `name`. */
  loadModule(name: string, safetensors: Buffer,
             options?: { numHeads?: number; replace?: boolean; timeoutMs?: number }
  ): Promise<ModuleInfo>;
  unloadModule(name: string, options?: { timeoutMs?: number }): Promise<void>;
  listModules(options?: { timeoutMs?: number }): Promise<ModuleInfo[]>;
  serverInfo(options?: { timeoutMs?: number }): Promise<ServerInfo>;
  /**
   * Creates a decode session (with several replicas on options.replica or the next in turn);
   * resolves to its SessionInfo.
   */
  createSession(options: CreateSessionOptions): Promise<SessionInfo>;
  /** Appends tokens (a prefill or one decode step); their attention over the whole cache. */
  extendSession(sessionId: string, tokens: SessionTokens,
                options?: ExtendSessionOptions): Promise<SessionResult>;
  /** One step per session, one call per replica; one item per step, in the steps' order. */
  extendSessions(steps: SessionStep[],
                 options?: { timeoutMs?: number }): Promise<Array<SessionResult | StepError>>;
  /** One replica's sessions (default: the next in turn) and its pool's usage. */
  listSessions(options?: { replica?: string; pageSize?: number; pageToken?: string;
                           timeoutMs?: number }): Promise<ListSessionsResult>;
  forkSession(sessionId: string,
              options?: { pinned?: boolean; idleTtlUs?: number; timeoutMs?: number }
  ): Promise<SessionInfo>;
  getSession(sessionId: string, options?: { timeoutMs?: number }): Promise<SessionInfo>;
  closeSession(sessionId: string, options?: { timeoutMs?: number }): Promise<void>;
  /**
   * Moves a session to `peer`, one of its replica's --session_peers (the admin role); the client
   * remembers the move and sends later calls naming the old id to the new one.
   */
  moveSession(sessionId: string, peer: string,
              options?: { timeoutMs?: number }): Promise<MoveSessionResult>;
  /** Opens an AttentionStream; timeoutMs bounds the whole stream (default: none). */
  stream(options?: { timeoutMs?: number }): AttentionStream;
  /** stream() on the replica holding `sessionId` (its extends must name that replica's). */
  streamForSession(sessionId: string, options?: { timeoutMs?: number }): AttentionStream;
  close(): void;
}

export function attendRequest(q: TensorInput | TensorMessage, k: TensorInput | TensorMessage,
                              v: TensorInput | TensorMessage,
                              options?: AttentionOptions): AttendRequest;
export function multiHeadRequest(module: string, query: TensorInput | TensorMessage,
                                 options?: MultiHeadOptions): MultiHeadAttentionRequest;
/** An ExtendSessionRequest for the stream (extendSession's arguments). */
export function extendRequest(sessionId: string, tokens: SessionTokens,
                              options?: ExtendSessionOptions): ExtendSessionRequest;
/** An ExtendSessionsRequest for the stream. */
export function extendSessionsRequest(steps: SessionStep[]): ExtendSessionsRequest;
/** The owner (replica address) of "<owner>/<instance>/<key>"; RangeError otherwise. */
export function sessionOwner(sessionId: string): string;
/** "evicted", "expired" or "restarted" for a lost session's error; "" otherwise. */
export function sessionLostReason(error: unknown): string;
/** The new id for a "session moved to '<new id>'" error (or StepError); "" otherwise. */
export function sessionMovedTo(error: unknown): string;
export function toTensor(t: TensorInput | TensorMessage, dtype?: Dtype): TensorMessage;
export function fromTensor(t: TensorMessage): TensorOutput;
/** The loaded attnserve.v1 package (service constructor, for anything not wrapped here). */
export function v1(): grpc.GrpcObject;
/** The path of the proto file shipped in the package. */
export const PROTO_FILE: string;
export { grpc };
