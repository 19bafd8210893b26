/**
 * Typed values the client returns (runs, events, definitions, pages); the
 * wire's JSON fields (`*_json`) are decoded here, once, and 64-bit counters
 * become numbers.
 * @module
 */
import type * as pb from "./gen/belay/v1/belay_pb.js";

/** Event kinds after which a run does not change any more. */
export const FINAL_EVENT_KINDS: ReadonlySet<string> = new Set(["run_completed", "run_failed", "run_cancelled"]);
/** Run statuses that are final. */
export const FINAL_STATUSES: ReadonlySet<string> = new Set(["completed", "failed", "cancelled"]);

/** A JSON value. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/**
 * A request for a person that a run holds open (`GetRun`'s
 * `open_requests`): `requestId` is what `approve`/`decline` or
 * `provideToolInput` name as `requestId` (`<node>.approval`,
 * `<node>~<n>.approval` on the n-th visit of a node in a loop, a
 * confirmation's call id, `<callId>.input<n>`); `kind` is `approval`,
 * `confirmation` or `tool_input`; `callId` is empty for an approval node;
 * `approverGrant` is the permission a decider needs (empty for a tool's
 * question).
 */
export interface OpenRequest {
  requestId: string;
  kind: string;
  node: string;
  callId: string;
  approverGrant: string;
}

/**
 * A ready task of the run that no live worker can take (`GetRun`'s
 * `unclaimable`): `kind` is `model_call` or `tool_call`; `requires` every
 * requirement of the task (`mcp:<server>`, `pool:<name>`), `missing` those
 * no live worker has; `reason` is for people (`no live worker has pool:gpu`).
 */
export interface UnclaimableTask {
  taskId: string;
  kind: string;
  requires: string[];
  missing: string[];
  reason: string;
}

/**
 * One run. `status` is `pending`, `running`, `paused`, `waiting`,
 * `completed`, `failed` or `cancelled`; `statusReason` says why a run is
 * paused, waiting, failed or cancelled; `output` is null until it
 * completes. Times are RFC 3339 strings in UTC. `openRequests` (the
 * approvals, confirmations and tools' questions the run waits for) and
 * `unclaimable` (its ready tasks no live worker can take) are filled by
 * `getRun` and `wait`, which ask `GetRun`; the runs other calls answer
 * with leave them empty.
 */
export interface Run {
  runId: string;
  tenant: string;
  workflow: string;
  workflowVersion: number;
  status: string;
  statusReason: string;
  input: Json;
  output: Json;
  idempotencyKey: string;
  caller: string;
  lastSeq: number;
  createdAt: string;
  updatedAt: string;
  openRequests: OpenRequest[];
  unclaimable: UnclaimableTask[];
}

/**
 * One event of a run's history: `seq` is gapless from 1, `kind` the
 * snake_case type (`wait_started`, `approval_requested`, `run_completed`,
 * …), `payload` the whole event (`{"type": kind, …}`).
 */
export interface RunEvent {
  runId: string;
  seq: number;
  kind: string;
  payload: { [key: string]: Json };
  recordedAt: string;
}

/** A registered definition (`kind`: tool, agent or workflow). */
export interface Definition {
  kind: string;
  name: string;
  version: number;
  /** Hex SHA-256 of the canonical definition. */
  contentHash: string;
  createdAt: string;
  /** False when identical content was already registered. */
  created: boolean;
}

/** A page of `listRuns`; `nextPageToken` is empty on the last. */
export interface RunPage {
  runs: Run[];
  nextPageToken: string;
}

function decode(text: string): Json {
  return text === "" ? null : (JSON.parse(text) as Json);
}

/** True when the run has ended. */
export function isFinalRun(run: Run): boolean {
  return FINAL_STATUSES.has(run.status);
}

/** True for the event that ends a run. */
export function isFinalEvent(event: RunEvent): boolean {
  return FINAL_EVENT_KINDS.has(event.kind);
}

/** A Run from `GetRun`'s answer: the run with its open requests and unclaimable tasks. */
export function runFromGetRun(response: pb.GetRunResponse, method: string): Run {
  return {
    ...runFrom(response.run, method),
    openRequests: response.openRequests.map((r) => ({
      requestId: r.requestId,
      kind: r.kind,
      node: r.node,
      callId: r.callId,
      approverGrant: r.approverGrant,
    })),
    unclaimable: response.unclaimable.map((t) => ({
      taskId: t.taskId,
      kind: t.kind,
      requires: [...t.requires],
      missing: [...t.missing],
      reason: t.reason,
    })),
  };
}

/** A Run from the wire (a missing message: the call answered nothing, an engine bug); no open requests or unclaimable tasks: only `GetRun` has them. */
export function runFrom(run: pb.Run | undefined, method: string): Run {
  if (run === undefined) throw new Error(`${method} answered without a run`);
  return {
    runId: run.runId,
    tenant: run.tenant,
    workflow: run.workflow,
    workflowVersion: run.workflowVersion,
    status: run.status,
    statusReason: run.statusReason,
    input: decode(run.inputJson),
    output: decode(run.outputJson),
    idempotencyKey: run.idempotencyKey,
    caller: run.caller,
    lastSeq: Number(run.lastSeq),
    createdAt: run.createdAt,
    updatedAt: run.updatedAt,
    openRequests: [],
    unclaimable: [],
  };
}

/** A RunEvent from the wire. */
export function eventFrom(event: pb.RunEvent): RunEvent {
  const payload = decode(event.payloadJson);
  return {
    runId: event.runId,
    seq: Number(event.seq),
    kind: event.kind,
    payload: payload !== null && typeof payload === "object" && !Array.isArray(payload) ? payload : { type: event.kind },
    recordedAt: event.recordedAt,
  };
}

/** A Definition from the wire. */
export function definitionFrom(d: pb.Definition): Definition {
  return {
    kind: d.kind,
    name: d.name,
    version: d.version,
    contentHash: d.contentHash,
    createdAt: d.createdAt,
    created: d.created,
  };
}
