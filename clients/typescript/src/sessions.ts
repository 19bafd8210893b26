/**
 * The HTTP/2 connection of a client: connect-node's session manager, with
 * every session it opens for a call heard to its end (see `SessionManager`).
 * @module
 */
import type { ClientHttp2Stream, Http2Session } from "node:http2";

import { Http2SessionManager } from "@connectrpc/connect-node";

/**
 * connect-node's session manager, except that every HTTP/2 session it opens
 * for a call keeps an `error` listener of its own. connect-node 2.1 takes
 * its listener off a session it leaves (`close()`, a reconnect) even when
 * that session was destroyed with an error it emits only once its socket
 * has closed (a keepalive ping that timed out): unheard, that error ended
 * the process. By then the session is done and its calls have failed
 * (`Unavailable`), so the error is dropped here.
 */
export class SessionManager extends Http2SessionManager {
  readonly #heard = new WeakSet<Http2Session>();

  override async request(...args: Parameters<Http2SessionManager["request"]>): Promise<ClientHttp2Stream> {
    const stream = await super.request(...args);
    const session = stream.session;
    if (session !== undefined && !this.#heard.has(session)) {
      this.#heard.add(session);
      session.on("error", () => undefined);
    }
    return stream;
  }
}
