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
 * One run. `status` is `pending`, `running`, `paused`, `waiting`,
 * `completed`, `failed` or `cancelled`; `statusReason` says why a run is
 * paused, waiting, failed or cancelled; `output` is null until it
 * completes. Times are RFC 3339 strings in UTC.
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

/** A Run from the wire (a missing message: the call answered nothing, an engine bug). */
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
