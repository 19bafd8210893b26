/**
 * The client: every call of `RunService`, `DefinitionService` and
 * `TenantService`, with retries of `UNAVAILABLE` and typed errors; `watch`
 * is an async iterator of events that reconnects from its last `seq`
 * when the stream breaks.
 * @module
 */
import { randomUUID } from "node:crypto";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

import { createClient, type Client } from "@connectrpc/connect";

import { BelayError, ConfigError, DeadlineExceeded, errorFromCall } from "./errors.js";
import { DefinitionService, RunService, TenantService } from "./gen/belay/v1/belay_pb.js";
import { toJson } from "./json.js";
import {
  type Definition,
  type Json,
  type Run,
  type RunEvent,
  type RunPage,
  definitionFrom,
  eventFrom,
  isFinalEvent,
  isFinalRun,
  runFrom,
  runFromGetRun,
} from "./models.js";
import { type ClientOptions, type Resolved, envOptions, resolve } from "./options.js";
import { Reconnects, withRetries } from "./retry.js";

/** Options of `startRun`. */
export interface StartOptions {
  /** The same (tenant, key) always gives the same run; none: one is made for this call. */
  idempotencyKey?: string;
  /** Who asks; recorded on the run. */
  caller?: string;
  /** Permissions the caller holds; may only narrow the key's grants. */
  callerGrants?: string[];
}

/** Options of `approve` and `decline`. */
export interface DecisionOptions {
  reason?: string;
  /** Who decides; recorded as `<principal>/<approver>`. */
  approver?: string;
  /** Must include the node's `approver_grant`. */
  approverGrants?: string[];
  /** With `approve`, where the node allows edits: the subject as approved. */
  editedSubject?: Json;
  /**
   * The request decided (`GetRun`'s `openRequests`, e.g. `review~2.approval`): needed once a loop
   * visited the node twice, and safe to retry (the same decision again changes nothing).
   */
  requestId?: string;
}

const DEFINITION_FILE = /(\.tools\.abl|\.ya?ml)$/;

function bundleFiles(paths: string[]): { path: string; content: string }[] {
  const files: { path: string; content: string }[] = [];
  const visit = (path: string): void => {
    let stat;
    try {
      stat = statSync(path);
    } catch {
      throw new ConfigError(`definitions path ${path} does not exist`);
    }
    if (stat.isDirectory()) {
      for (const name of readdirSync(path).sort()) visit(join(path, name));
    } else if (DEFINITION_FILE.test(path)) {
      files.push({ path, content: readFileSync(path, "utf8") });
    }
  };
  paths.forEach(visit);
  return files;
}

/**
 * A client of one engine, acting for one tenant (see `ClientOptions`).
 * Calls reject with a `BelayError` subclass (`NotFound`,
 * `PermissionDenied`, …) carrying the gRPC code and the engine's message;
 * the constructor throws `ConfigError` for options that cannot work.
 */
export class BelayClient {
  /** The tenant the client acts for (empty: the key's only tenant). */
  readonly tenant: string;
  readonly #o: Resolved;
  readonly #runs: Client<typeof RunService>;
  readonly #definitions: Client<typeof DefinitionService>;
  readonly #tenants: Client<typeof TenantService>;

  constructor(options: ClientOptions = {}) {
    this.#o = resolve(options);
    this.tenant = this.#o.tenant;
    this.#runs = createClient(RunService, this.#o.transport);
    this.#definitions = createClient(DefinitionService, this.#o.transport);
    this.#tenants = createClient(TenantService, this.#o.transport);
  }

  /** A client configured as the CLI is (`BELAY_ENGINE_URL`, `BELAY_API_KEY`, `BELAY_TENANT`, …); `overrides` win. */
  static fromEnv(overrides: ClientOptions = {}): BelayClient {
    return new BelayClient({ ...envOptions(), ...overrides });
  }

  /** Close the connection: open calls and watches end, later calls reconnect. */
  close(): void {
    this.#o.sessions.abort();
  }

  async #call<T>(method: string, call: (options: { timeoutMs: number }) => Promise<T>): Promise<T> {
    return withRetries(this.#o.retry, async () => {
      try {
        return await call({ timeoutMs: this.#o.timeoutMs });
      } catch (e) {
        throw errorFromCall(e, method);
      }
    });
  }

  /**
   * Start a run of the latest version of `workflow` with `input` (JSON;
   * `null` or none: `{}`, as in Python). Throws `InvalidJson` before any
   * call for input JSON cannot hold; rejects with `NotFound` for an unknown
   * workflow, `InvalidArgument` for input its schema refuses.
   */
  async startRun(workflow: string, input: Json = {}, options: StartOptions = {}): Promise<{ run: Run; created: boolean }> {
    const request = {
      tenant: this.tenant,
      workflow,
      inputJson: toJson(input ?? {}, "the run's input"),
      idempotencyKey: options.idempotencyKey ?? randomUUID(),
      caller: options.caller ?? "",
      callerGrants: options.callerGrants ?? [],
    };
    const m = "belay.v1.RunService/StartRun";
    const response = await this.#call(m, (o) => this.#runs.startRun(request, o));
    return { run: runFrom(response.run, m), created: response.created };
  }

  /** One run with its current status (`NotFound` for another tenant's). */
  async getRun(runId: string): Promise<Run> {
    const m = "belay.v1.RunService/GetRun";
    const response = await this.#call(m, (o) => this.#runs.getRun({ tenant: this.tenant, runId }, o));
    return runFromGetRun(response, m);
  }

  /** A page of the tenant's runs, newest first (`pageSize` 1..=500, 0: 50). */
  async listRuns(options: { status?: string; pageSize?: number; pageToken?: string } = {}): Promise<RunPage> {
    const m = "belay.v1.RunService/ListRuns";
    const request = { tenant: this.tenant, status: options.status ?? "", pageSize: options.pageSize ?? 0, pageToken: options.pageToken ?? "" };
    const response = await this.#call(m, (o) => this.#runs.listRuns(request, o));
    return { runs: response.runs.map((r) => runFrom(r, m)), nextPageToken: response.nextPageToken };
  }

  /** A page of a run's events with `seq > afterSeq` (`limit` 1..=1000, 0: 1000). */
  async events(runId: string, afterSeq = 0, limit = 0): Promise<RunEvent[]> {
    const m = "belay.v1.RunService/ListRunEvents";
    const request = { tenant: this.tenant, runId, afterSeq: BigInt(afterSeq), limit };
    const response = await this.#call(m, (o) => this.#runs.listRunEvents(request, o));
    return response.events.map(eventFrom);
  }

  /**
   * The run's events after `afterSeq`, as they happen, ending after the
   * event that ends the run. When the stream breaks (an engine restart, a
   * dropped connection) it reconnects with the retry policy's backoff from
   * the last `seq` it yielded: no event is missed or repeated; after
   * `maxAttempts` streams or `maxElapsedMs` of failures in a row it throws
   * the last error (`Unavailable`). An engine that stopped answering is
   * found by the keepalive pings (`keepaliveMs`). `timeoutMs` bounds the
   * whole watch (`DeadlineExceeded`); leaving the loop early cancels the
   * stream.
   */
  async *watch(runId: string, afterSeq = 0, options: { timeoutMs?: number } = {}): AsyncGenerator<RunEvent, void, undefined> {
    const deadline = options.timeoutMs === undefined ? undefined : Date.now() + options.timeoutMs;
    const reconnects = new Reconnects(this.#o.retry, runId, WATCH);
    let last = afterSeq;
    for (;;) {
      const remaining = deadline === undefined ? undefined : deadline - Date.now();
      if (remaining !== undefined && remaining <= 0) {
        throw new DeadlineExceeded(4, `watching run ${runId}: no end within ${options.timeoutMs} ms`, WATCH);
      }
      let delay: number | undefined;
      let progressed = false;
      try {
        for await (const event of this.#stream(runId, last, remaining)) {
          last = event.seq;
          progressed = true;
          reconnects.progressed();
          yield event;
          if (isFinalEvent(event)) return;
        }
      } catch (e) {
        if (!(e instanceof BelayError)) throw e;
        delay = reconnects.failed(e);
      }
      if (delay === undefined && !progressed) {
        if (isFinalRun(await this.getRun(runId))) return;
        delay = reconnects.endedEmpty();
      }
      if (delay !== undefined && delay > 0) await sleep(delay);
    }
  }

  async *#stream(runId: string, afterSeq: number, timeoutMs: number | undefined): AsyncGenerator<RunEvent, void, undefined> {
    const abort = new AbortController();
    const request = { tenant: this.tenant, runId, afterSeq: BigInt(afterSeq) };
    try {
      const options = timeoutMs === undefined ? { signal: abort.signal } : { signal: abort.signal, timeoutMs };
      for await (const message of this.#runs.watchRun(request, options)) yield eventFrom(message);
    } catch (e) {
      throw errorFromCall(e, WATCH, abort.signal.aborted);
    } finally {
      abort.abort();
    }
  }

  /**
   * Resolve once the run has ended (completed, failed or cancelled), with
   * the run. Rejects with `DeadlineExceeded` when it has not ended within
   * `timeoutMs`; survives engine restarts as `watch` does.
   */
  async wait(runId: string, timeoutMs?: number): Promise<Run> {
    const run = await this.getRun(runId);
    if (isFinalRun(run)) return run;
    try {
      const options = timeoutMs === undefined ? {} : { timeoutMs };
      for await (const event of this.watch(runId, run.lastSeq, options)) void event;
    } catch (e) {
      if (!(e instanceof DeadlineExceeded)) throw e;
      const now = await this.getRun(runId);
      throw new DeadlineExceeded(4, `run ${runId} did not end within ${timeoutMs} ms (it is ${now.status})`, WATCH);
    }
    return this.getRun(runId);
  }

  /**
   * Deliver signal `name` with `payload` (JSON) to a run; a signal with the
   * same `signalId` is applied once (none: an id is made for this call).
   * `InvalidArgument` when no wait takes that name or the payload does not
   * match its schema.
   */
  async signal(
    runId: string,
    name: string,
    payload: Json = null,
    options: { signalId?: string; sentBy?: string } = {},
  ): Promise<{ run: Run; duplicate: boolean }> {
    const m = "belay.v1.RunService/SignalRun";
    const request = {
      tenant: this.tenant,
      runId,
      name,
      signalId: options.signalId ?? randomUUID(),
      payloadJson: payload === null ? "" : toJson(payload, "the signal's payload"),
      sentBy: options.sentBy ?? "",
    };
    const response = await this.#call(m, (o) => this.#runs.signalRun(request, o));
    return { run: runFrom(response.run, m), duplicate: response.duplicate };
  }

  /** Approve the waiting `approval` node `node` (`PermissionDenied` without its grant, `Aborted` when already decided). */
  approve(runId: string, node: string, options: DecisionOptions = {}): Promise<Run> {
    return this.#decide(runId, node, true, options);
  }

  /** Decline the waiting `approval` node `node` (errors as `approve`). */
  decline(runId: string, node: string, options: Omit<DecisionOptions, "editedSubject"> = {}): Promise<Run> {
    return this.#decide(runId, node, false, options);
  }

  async #decide(runId: string, node: string, approve: boolean, options: DecisionOptions): Promise<Run> {
    const m = "belay.v1.RunService/DecideApproval";
    const request = {
      tenant: this.tenant,
      runId,
      node,
      approve,
      editedSubjectJson: options.editedSubject === undefined ? "" : toJson(options.editedSubject, "the edited subject"),
      approver: options.approver ?? "",
      approverGrants: options.approverGrants ?? [],
      reason: options.reason ?? "",
      requestId: options.requestId ?? "",
    };
    return runFrom((await this.#call(m, (o) => this.#runs.decideApproval(request, o))).run, m);
  }

  /** Cancel a run that has not ended (`FailedPrecondition` once it has). */
  async cancel(runId: string, reason = ""): Promise<Run> {
    const m = "belay.v1.RunService/CancelRun";
    return runFrom((await this.#call(m, (o) => this.#runs.cancelRun({ tenant: this.tenant, runId, reason }, o))).run, m);
  }

  /** Operator pause: no task of the run is claimed until `resume`. */
  async pause(runId: string, reason = "", operator = ""): Promise<Run> {
    const m = "belay.v1.RunService/PauseRun";
    const request = { tenant: this.tenant, runId, reason, operator };
    return runFrom((await this.#call(m, (o) => this.#runs.pauseRun(request, o))).run, m);
  }

  /** Lift an operator pause (a run with open uncertain outcomes stays paused). */
  async resume(runId: string, reason = "", operator = ""): Promise<Run> {
    const m = "belay.v1.RunService/ResumeRun";
    const request = { tenant: this.tenant, runId, reason, operator };
    return runFrom((await this.#call(m, (o) => this.#runs.resumeRun(request, o))).run, m);
  }

  /** Answer a tool's question to a person (`tool_call_input_requested`). */
  async provideToolInput(runId: string, callId: string, answer: Json, by = "", requestId = ""): Promise<Run> {
    const m = "belay.v1.RunService/ProvideToolInput";
    const request = { tenant: this.tenant, runId, callId, answerJson: toJson(answer, "the answer"), by, requestId };
    return runFrom((await this.#call(m, (o) => this.#runs.provideToolInput(request, o))).run, m);
  }

  /** Register `{path: content}` files as one bundle (`InvalidArgument` listing every error with file and line). */
  async registerBundle(files: Record<string, string>): Promise<Definition[]> {
    const m = "belay.v1.DefinitionService/RegisterBundle";
    const request = { tenant: this.tenant, files: Object.entries(files).map(([path, content]) => ({ path, content })) };
    return (await this.#call(m, (o) => this.#definitions.registerBundle(request, o))).definitions.map(definitionFrom);
  }

  /** Register every `.tools.abl`, `.yaml` and `.yml` file under `paths`. */
  registerPaths(paths: string[]): Promise<Definition[]> {
    return this.registerBundle(Object.fromEntries(bundleFiles(paths).map((f) => [f.path, f.content])));
  }

  /** The tenant's definitions, optionally of one `kind`. */
  async listDefinitions(kind = ""): Promise<Definition[]> {
    const m = "belay.v1.DefinitionService/ListDefinitions";
    return (await this.#call(m, (o) => this.#definitions.listDefinitions({ tenant: this.tenant, kind }, o))).definitions.map(definitionFrom);
  }

  /** Replace the permissions granted to the tenant; resolves to them. */
  async setTenantGrants(grants: string[]): Promise<string[]> {
    const m = "belay.v1.TenantService/SetTenantGrants";
    return (await this.#call(m, (o) => this.#tenants.setTenantGrants({ tenant: this.tenant, grants }, o))).grants;
  }

  /** The permissions granted to the tenant. */
  async getTenantGrants(): Promise<string[]> {
    const m = "belay.v1.TenantService/GetTenantGrants";
    return (await this.#call(m, (o) => this.#tenants.getTenantGrants({ tenant: this.tenant }, o))).grants;
  }
}

const WATCH = "belay.v1.RunService/WatchRun";
