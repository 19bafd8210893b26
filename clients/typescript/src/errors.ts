/**
 * Errors of the client: one class per gRPC status code an engine answers
 * with, each carrying the code and Belay's message, and ConfigError for
 * options that cannot work.
 * @module
 */
import { Code, ConnectError } from "@connectrpc/connect";

/** A call the engine refused or could not serve. */
export class BelayError extends Error {
  /** The gRPC status code (`Code.NotFound` is 5, as in gRPC). */
  readonly code: Code;
  /** The engine's message: it names what is wrong (the run, the field, the grant). */
  readonly rawMessage: string;
  /** The RPC as `<package>.<Service>/<Method>`, e.g. `belay.v1.RunService/StartRun` (as in Python, and the engine's trace spans). */
  readonly method: string;

  constructor(code: Code, rawMessage: string, method: string) {
    super(`${codeName(code)} (${method}): ${rawMessage}`);
    this.name = new.target.name;
    this.code = code;
    this.rawMessage = rawMessage;
    this.method = method;
  }

  /** The code as gRPC spells it: `NOT_FOUND`, `PERMISSION_DENIED`, … */
  get codeName(): string {
    return codeName(this.code);
  }
}

/** `INVALID_ARGUMENT`: bad input (a schema mismatch, an unknown node). */
export class InvalidArgument extends BelayError {}
/** `NOT_FOUND`: no such run or workflow for this tenant. */
export class NotFound extends BelayError {}
/** `ALREADY_EXISTS`. */
export class AlreadyExists extends BelayError {}
/** `PERMISSION_DENIED`: the key's role, tenants or grants do not admit the call. */
export class PermissionDenied extends BelayError {}
/** `UNAUTHENTICATED`: no key, or a malformed, revoked or expired one. */
export class Unauthenticated extends BelayError {}
/** `FAILED_PRECONDITION`: the run is not in a state for the call. */
export class FailedPrecondition extends BelayError {}
/** `ABORTED`: a conflicting decision came first (an approval decided twice). */
export class Aborted extends BelayError {}
/** `RESOURCE_EXHAUSTED`: a limit was reached. */
export class ResourceExhausted extends BelayError {}
/** `UNAVAILABLE`: the engine could not be reached (after the retries of the policy). */
export class Unavailable extends BelayError {}
/** `DEADLINE_EXCEEDED`: the call, or a `wait`, ran out of time. */
export class DeadlineExceeded extends BelayError {}
/** `INTERNAL`: the engine failed (its log has the detail). */
export class Internal extends BelayError {}

/** Options that cannot work (a bad URL, TLS files with `http://`, a missing file). */
export class ConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ConfigError";
  }
}

/**
 * An argument that must be JSON (a run's input, a signal's payload, an
 * edited subject, an answer) holds a value JSON has not (`undefined`, a
 * function, a bigint, `NaN`, a `Date`, a `Map`, a cycle). Thrown before
 * anything is sent; the message names the argument, where the value is
 * (`$.items[2].when`) and what it is.
 */
export class InvalidJson extends TypeError {
  constructor(message: string) {
    super(message);
    this.name = "InvalidJson";
  }
}

const BY_CODE = new Map<Code, new (code: Code, message: string, method: string) => BelayError>([
  [Code.InvalidArgument, InvalidArgument],
  [Code.NotFound, NotFound],
  [Code.AlreadyExists, AlreadyExists],
  [Code.PermissionDenied, PermissionDenied],
  [Code.Unauthenticated, Unauthenticated],
  [Code.FailedPrecondition, FailedPrecondition],
  [Code.Aborted, Aborted],
  [Code.ResourceExhausted, ResourceExhausted],
  [Code.Unavailable, Unavailable],
  [Code.DeadlineExceeded, DeadlineExceeded],
  [Code.Internal, Internal],
]);

/** The gRPC name of a code (`Code.PermissionDenied` → `PERMISSION_DENIED`). */
export function codeName(code: Code): string {
  return (Code[code] ?? "UNKNOWN").replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
}

/** The exception for a status: its class by code, BelayError for the others. */
export function errorFromStatus(code: Code, message: string, method: string): BelayError {
  const Class = BY_CODE.get(code) ?? BelayError;
  return new Class(code, message, method);
}

// Node errors of a connection that broke under a call: connect-node reports
// them as ABORTED (a client hanging up, on a server), but for a client they
// mean the engine went away (a restart), which gRPC calls UNAVAILABLE.
const CONNECTION_LOST = new Set([
  "ECONNRESET",
  "EPIPE",
  "ERR_STREAM_DESTROYED",
  "ERR_HTTP2_INVALID_STREAM",
  "ERR_HTTP2_STREAM_ERROR",
  "ERR_HTTP2_SESSION_ERROR",
  "ERR_HTTP2_GOAWAY_SESSION",
]);

// Node's codes of a certificate the client does not accept (the tls
// module's list); OpenSSL's own (a handshake alert, a server that speaks
// no TLS) start with ERR_SSL_, Node's with ERR_TLS_.
const CERTIFICATE_REFUSED = new Set([
  "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_DECRYPT_CERT_SIGNATURE",
  "UNABLE_TO_DECODE_ISSUER_PUBLIC_KEY",
  "CERT_SIGNATURE_FAILURE",
  "CERT_NOT_YET_VALID",
  "CERT_HAS_EXPIRED",
  "ERROR_IN_CERT_NOT_BEFORE_FIELD",
  "ERROR_IN_CERT_NOT_AFTER_FIELD",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "CERT_CHAIN_TOO_LONG",
  "CERT_REVOKED",
  "INVALID_CA",
  "PATH_LENGTH_EXCEEDED",
  "INVALID_PURPOSE",
  "CERT_UNTRUSTED",
  "CERT_REJECTED",
  "HOSTNAME_MISMATCH",
]);

function tlsFailed(code: string): boolean {
  return code.startsWith("ERR_SSL_") || code.startsWith("ERR_TLS_") || CERTIFICATE_REFUSED.has(code);
}

/** The first Node error code in `error`'s cause chain that `matches`, if any. */
function causeCode(error: unknown, matches: (code: string) => boolean): string | undefined {
  for (let e = error, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && matches(code)) return code;
  }
  return undefined;
}

/**
 * The exception for anything a call threw (a ConnectError, or a transport
 * failure). A connection lost under the call is `Unavailable` (retried),
 * whatever code the transport gave it: ABORTED for a reset, CANCELED for a
 * stream the dying engine closed, when the client itself did not cancel
 * (`cancelledHere`). A TLS handshake that failed (a certificate the client
 * does not trust, a server that speaks no TLS), which connect-node reports
 * as INTERNAL, is `Unavailable` too, as gRPC (and the Python client) has
 * it. An engine's own `ABORTED` or `INTERNAL` stays.
 */
export function errorFromCall(error: unknown, method: string, cancelledHere = false): BelayError {
  if (error instanceof BelayError) return error;
  const e = ConnectError.from(error);
  const cause = e.cause ?? error;
  const tls = causeCode(cause, tlsFailed);
  if (tls !== undefined) {
    return new Unavailable(Code.Unavailable, `TLS handshake failed (${tls}): ${e.rawMessage}`, method);
  }
  const lost = causeCode(cause, (code) => CONNECTION_LOST.has(code)) !== undefined;
  if (e.code !== Code.Unavailable && (lost || (e.code === Code.Canceled && !cancelledHere))) {
    return new Unavailable(Code.Unavailable, e.rawMessage, method);
  }
  return errorFromStatus(e.code, e.rawMessage, method);
}
