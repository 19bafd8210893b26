//! The stdio transport of an MCP server process: its stdin written one
//! JSON-RPC line at a time, its stdout read and decoded line by line, its
//! stderr logged (and its last lines kept), its exit noticed.
//!
//! Why not rmcp's `AsyncRwTransport`: three things a durable engine must
//! know that it does not say.
//! - **Whether a request was written whole.** A `tools/call` line is
//!   written under the call's slot lock ([`Writer`]), so the moment its
//!   last byte is taken by the pipe is the moment the slot says `Written`;
//!   a call that ends first (its timeout, while a server that stopped
//!   reading its stdin leaves the pipe full) is `Abandoned` under the same
//!   lock and provably not sent: a partial line is no request. A line left
//!   half-written makes the writer unusable ([`Writer::broken`]); the
//!   client then restarts the server.
//! - **An answer that cannot be decoded.** A line with a lone surrogate
//!   escape (`"x\ud83dy"`) or bytes that are not UTF-8 is repaired
//!   ([`crate::json_text`], U+FFFD) and read; one that is still not a
//!   JSON-RPC message but names the `id` of a request in flight fails that
//!   request at once (its call ends `Undecodable`), instead of being
//!   dropped while the call waits for its timeout. Every such line is
//!   logged.
//! - **An answer too large to read** ([`MAX_STDIO_MESSAGE_BYTES`]) fails
//!   its call at once (`AnswerTooLarge`).
//!
//! A server that exits is waited for briefly when its stdout ends, so its
//! exit status and last stderr lines can be told ([`Exit`]): a server that
//! exits before the handshake is reported as such.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::model::{ClientJsonRpcMessage, ErrorCode, RequestId, ServerJsonRpcMessage};
use rmcp::service::RoleClient;
use rmcp::transport::Transport;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWrite, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout};

use super::{Calls, MarkedTransport, SendState, lock};

/// Longest message a stdio server may send, in bytes (one JSON-RPC line).
/// A longer line is skipped and the call it answers ends at once as
/// `CallOutcome::AnswerTooLarge`. Results are truncated to the call's size
/// limit after they are read, so this only bounds the memory one message
/// may take.
pub(crate) const MAX_STDIO_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// How much of a line's start is kept to find its JSON-RPC `id`.
const LINE_HEAD_BYTES: usize = 512;
/// Private JSON-RPC error code of the error put in place of a skipped
/// oversized answer (never sent by a server: the slot's flag decides).
pub(super) const ANSWER_TOO_LARGE_CODE: i32 = -32_099;
/// Private JSON-RPC error code of the error put in place of an answer that
/// cannot be decoded (the slot's `undecodable` decides).
pub(super) const ANSWER_UNDECODABLE_CODE: i32 = -32_098;
/// JSON-RPC "invalid request": the answer to a server's request that
/// cannot be decoded (as rmcp answers one).
const INVALID_REQUEST: i32 = -32600;
/// Longest stderr line logged at once, in bytes; longer lines are split.
const MAX_STDERR_LINE: u64 = 8 * 1024;
/// How many of the last stderr lines are kept to tell why a server exited.
const STDERR_TAIL_LINES: usize = 10;
/// Longest stderr line kept in that tail, in bytes.
const STDERR_TAIL_LINE_BYTES: usize = 512;
/// How long a closed stdio server may take to exit before it is killed.
const STDIO_EXIT_WAIT: Duration = Duration::from_secs(3);
/// How long a server whose stdout ended is waited for, to read its exit
/// status.
const EXIT_STATUS_WAIT: Duration = Duration::from_secs(1);
/// How much of an undecodable line is logged, in bytes.
const LOGGED_LINE_BYTES: usize = 256;

/// How a stdio server ended: its exit status once known, and its last
/// stderr lines. Shared by the transport (which notices the exit), the
/// stderr logger and the handshake (which reports it).
pub(super) struct Exit {
    /// How the process ended, once it has: its exit status, and whether it
    /// was killed by the client (then it did not exit by itself).
    status: tokio::sync::watch::Sender<Option<(String, bool)>>,
    stderr: Mutex<VecDeque<String>>,
}

impl Default for Exit {
    fn default() -> Self {
        Self {
            status: tokio::sync::watch::Sender::new(None),
            stderr: Mutex::default(),
        }
    }
}

impl Exit {
    /// The exit status (`exit status: 3`, `signal: 9 (SIGKILL)`), once the
    /// process has exited by itself (not killed by the client).
    pub(super) fn status(&self) -> Option<String> {
        match &*self.status.borrow() {
            Some((status, false)) => Some(status.clone()),
            _ => None,
        }
    }

    /// [`Exit::status`], waiting at most `timeout` for the process to end.
    pub(super) async fn wait(&self, timeout: Duration) -> Option<String> {
        self.ended(timeout).await;
        self.status()
    }

    /// Whether the process ended (by itself or killed) within `timeout`.
    async fn ended(&self, timeout: Duration) -> bool {
        let mut status = self.status.subscribe();
        tokio::time::timeout(timeout, status.wait_for(Option::is_some))
            .await
            .is_ok()
    }

    /// The last stderr lines (at most [`STDERR_TAIL_LINES`]), oldest first.
    pub(super) fn stderr(&self) -> Vec<String> {
        lock(&self.stderr).iter().cloned().collect()
    }

    fn record(&self, status: std::process::ExitStatus, killed: bool) {
        self.status.send_replace(Some((status.to_string(), killed)));
    }

    fn keep(&self, line: &str) {
        let mut end = line.len().min(STDERR_TAIL_LINE_BYTES);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        let mut tail = lock(&self.stderr);
        if tail.len() == STDERR_TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line[..end].to_owned());
    }
}

/// A stdio server process's pipes. The process itself belongs to a reaper
/// task ([`reap`]), which records its exit status the moment it exits and
/// kills it when told to (or when this is dropped); `close` first closes
/// its stdin and lets it exit for a moment.
pub(super) struct StdioProcess {
    writer: Arc<Writer>,
    reader: Reader,
    exit: Arc<Exit>,
    server: String,
    /// Cancelled (also on drop): the reaper kills the process.
    kill: tokio_util::sync::DropGuard,
}

/// What [`StdioProcess::spawn`] hands back beside the process.
pub(super) struct Spawned {
    /// The transport.
    pub(super) process: StdioProcess,
    /// The process id.
    pub(super) pid: Option<u32>,
    /// How it ended, once it has.
    pub(super) exit: Arc<Exit>,
    /// The stderr logger; it ends when the process's stderr does.
    pub(super) stderr: tokio::task::JoinHandle<()>,
}

impl StdioProcess {
    /// Starts `cmd` with piped stdin, stdout and stderr (stderr logged by a
    /// task of its own). `calls` and `generation`: the client's call slots
    /// and this connection's number, for the writer and the reader.
    pub(super) fn spawn(
        mut cmd: tokio::process::Command,
        server: &str,
        calls: Arc<Calls>,
        generation: u64,
    ) -> io::Result<Spawned> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let missing = || io::Error::other("a pipe of the child process is missing");
        let stdin = child.stdin.take().ok_or_else(missing)?;
        let stdout = child.stdout.take().ok_or_else(missing)?;
        let stderr = child.stderr.take().ok_or_else(missing)?;
        let pid = child.id();
        let exit = Arc::new(Exit::default());
        let kill = tokio_util::sync::CancellationToken::new();
        tokio::spawn(reap(child, kill.clone(), exit.clone()));
        let stderr = tokio::spawn(log_stderr(server.to_owned(), pid, stderr, exit.clone()));
        let writer = Arc::new(Writer {
            stdin: tokio::sync::Mutex::new(Some(stdin)),
            broken: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            calls: calls.clone(),
            generation,
        });
        let process = StdioProcess {
            kill: kill.drop_guard(),
            writer,
            reader: Reader {
                read: BufReader::new(stdout),
                line: Vec::new(),
                discarding: false,
                calls,
                generation,
            },
            exit: exit.clone(),
            server: server.to_owned(),
        };
        Ok(Spawned {
            process,
            pid,
            exit,
            stderr,
        })
    }

    /// The stdout ended: wait a moment for the process to exit, so that
    /// what follows (a failed handshake, a lost connection) can tell how.
    async fn note_exit(&mut self) {
        if let Some(status) = self.exit.wait(EXIT_STATUS_WAIT).await {
            tracing::info!(server = self.server, status, "MCP server process exited");
        }
    }
}

/// Owns a stdio server process: records its exit status when it exits, or
/// kills it when `kill` is cancelled and records that.
async fn reap(mut child: Child, kill: tokio_util::sync::CancellationToken, exit: Arc<Exit>) {
    let (status, killed) = tokio::select! {
        biased;
        status = child.wait() => (status, false),
        () = kill.cancelled() => (
            match child.kill().await {
                Ok(()) => child.wait().await,
                Err(e) => Err(e),
            },
            true,
        ),
    };
    if let Ok(status) = status {
        exit.record(status, killed);
    }
}

/// Serialises one message as a JSON-RPC line.
fn line_of(item: &ClientJsonRpcMessage) -> io::Result<Vec<u8>> {
    let mut line = serde_json::to_vec(item).map_err(io::Error::other)?;
    line.push(b'\n');
    Ok(line)
}

impl MarkedTransport for StdioProcess {
    fn send_marked(
        &mut self,
        item: ClientJsonRpcMessage,
        marker: Option<u64>,
    ) -> impl Future<Output = Result<(), io::Error>> + Send + 'static {
        let writer = self.writer.clone();
        let line = line_of(&item);
        async move { writer.write(line?, marker).await }
    }
}

impl Transport<RoleClient> for StdioProcess {
    type Error = io::Error;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.send_marked(item, None)
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        loop {
            match self.reader.next_line().await {
                LineRead::Line => {}
                LineRead::Oversized(head) => {
                    if let Some(message) = self.reader.too_large(id_in_head(&head)) {
                        return Some(message);
                    }
                    continue;
                }
                LineRead::Eof | LineRead::Failed => {
                    self.note_exit().await;
                    return None;
                }
            }
            let decoded = decode_line(&self.reader.line);
            if let Decoded::Message(message, repairs) = decoded {
                self.reader.line.clear();
                if repairs.any() {
                    tracing::warn!(
                        server = self.server,
                        lone_surrogates = repairs.lone_surrogates,
                        invalid_utf8 = repairs.invalid_utf8,
                        "an MCP server's message held text that is not Unicode; replaced with U+FFFD"
                    );
                }
                return Some(*message);
            }
            let line = shown(&self.reader.line);
            self.reader.line.clear();
            match decoded {
                Decoded::Message(..) | Decoded::Skip => {}
                Decoded::Request { id, reason } => {
                    tracing::warn!(server = self.server, %reason, line,
                        "an MCP server's request cannot be decoded; answered `invalid request`");
                    self.writer.answer_invalid(id);
                }
                Decoded::Answer { id, reason } => {
                    tracing::warn!(server = self.server, %reason, line,
                        "an MCP server's answer cannot be decoded; the request it answers fails");
                    return Some(self.reader.undecodable(id, reason));
                }
                Decoded::Unknown { reason } => {
                    tracing::warn!(server = self.server, %reason, line,
                        "an MCP server sent a line that is not a JSON-RPC message and names no request; skipped");
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.writer.closed.store(true, Ordering::SeqCst);
        // A write stuck on a full pipe holds the stdin: the server is not
        // reading, so it is stopped at once.
        let closed = match self.writer.stdin.try_lock() {
            Ok(mut stdin) => stdin.take().is_some(),
            Err(_) => false,
        };
        // A line left half-written: the server is not reading (or reads
        // garbage); it is not waited for.
        let broken = self.writer.broken.load(Ordering::SeqCst);
        if !closed || broken || !self.exit.ended(STDIO_EXIT_WAIT).await {
            self.kill_now().await;
        }
        Ok(())
    }
}

impl StdioProcess {
    /// Kills the process and waits (briefly) until it is gone.
    async fn kill_now(&mut self) {
        // Replacing the guard drops (cancels) the old one.
        self.kill = tokio_util::sync::CancellationToken::new().drop_guard();
        self.exit.ended(EXIT_STATUS_WAIT).await;
    }
}

/// At most [`LOGGED_LINE_BYTES`] of a line, as text, for a log line.
fn shown(line: &[u8]) -> String {
    let head = &line[..line.len().min(LOGGED_LINE_BYTES)];
    let text = String::from_utf8_lossy(head);
    let text = text.trim_end();
    if line.len() > LOGGED_LINE_BYTES {
        format!("{text}… ({} bytes)", line.len())
    } else {
        text.to_owned()
    }
}

// ---------------------------------------------------------------------------
// Writing.

/// A line being written: dropped half-way (its send was aborted, the
/// connection closing), it breaks the writer, as a failed write does.
struct Partial<'a> {
    broken: &'a AtomicBool,
    written: usize,
    len: usize,
}

impl Drop for Partial<'_> {
    fn drop(&mut self) {
        if self.written > 0 && self.written < self.len {
            self.broken.store(true, Ordering::SeqCst);
        }
    }
}

/// A server's stdin. One line at a time (the lock); a `tools/call` line is
/// written under its call's slot lock, see the module docs.
pub(super) struct Writer {
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    /// A line was left half-written (its call ended first): nothing more
    /// can be written that the server would read as sent.
    broken: AtomicBool,
    /// The transport is closing.
    closed: AtomicBool,
    calls: Arc<Calls>,
    generation: u64,
}

impl Writer {
    /// Writes `line` whole, or fails. `marker`: the `tools/call` it
    /// carries, whose slot is `Written` exactly when the pipe took the
    /// last byte; a call that is no longer `Handed` on this connection
    /// (abandoned, ended, moved to another connection) is not written on.
    async fn write(self: Arc<Self>, line: Vec<u8>, marker: Option<u64>) -> io::Result<()> {
        let mut stdin = self.stdin.lock().await;
        if self.closed.load(Ordering::SeqCst) {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the connection is closing",
            ));
        }
        let Some(pipe) = stdin.as_mut() else {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the server's stdin is closed",
            ));
        };
        if self.broken.load(Ordering::SeqCst) {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "an earlier request was left half-written on the server's stdin, so nothing more can be written",
            ));
        }
        let mut partial = Partial {
            broken: &self.broken,
            written: 0,
            len: line.len(),
        };
        std::future::poll_fn(|cx| self.poll_line(cx, pipe, &line, &mut partial.written, marker))
            .await
    }

    fn poll_line(
        &self,
        cx: &mut Context<'_>,
        pipe: &mut ChildStdin,
        line: &[u8],
        written: &mut usize,
        marker: Option<u64>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut slots = lock(&self.calls.slots);
            let mut slot = marker.map(|m| slots.get_mut(&m));
            let still_sending = match &slot {
                None => true,
                Some(slot) => slot.as_ref().is_some_and(|s| {
                    s.state == SendState::Handed && s.generation == self.generation
                }),
            };
            if !still_sending {
                if *written > 0 {
                    self.broken.store(true, Ordering::SeqCst);
                }
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::Interrupted,
                    "the call ended before its request was written whole",
                )));
            }
            match Pin::new(&mut *pipe).poll_write(cx, &line[*written..]) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(
                        Err(self.failed(*written, io::ErrorKind::WriteZero.into())),
                    );
                }
                Poll::Ready(Ok(n)) => {
                    *written += n;
                    if *written == line.len() {
                        if let Some(Some(slot)) = slot.as_mut() {
                            slot.state = SendState::Written;
                        }
                        return Poll::Ready(Ok(()));
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(self.failed(*written, e))),
            }
        }
    }

    /// A write failed after `written` bytes: a partial line breaks the
    /// writer.
    fn failed(&self, written: usize, error: io::Error) -> io::Error {
        if written > 0 {
            self.broken.store(true, Ordering::SeqCst);
        }
        error
    }

    /// Answers a server request that cannot be decoded with JSON-RPC
    /// "invalid request" (in the background: the reader does not wait for
    /// the writer).
    fn answer_invalid(self: &Arc<Self>, id: RequestId) {
        let message = ClientJsonRpcMessage::error(
            ErrorData::new(
                ErrorCode(INVALID_REQUEST),
                "Invalid request: the request cannot be decoded",
                None,
            ),
            Some(id),
        );
        let Ok(line) = line_of(&message) else {
            return;
        };
        let writer = self.clone();
        tokio::spawn(async move {
            if let Err(e) = writer.write(line, None).await {
                tracing::debug!(error = %e, "cannot answer an undecodable MCP server request");
            }
        });
    }
}

// ---------------------------------------------------------------------------
// Reading.

struct Reader {
    read: BufReader<ChildStdout>,
    /// The line being read (its bytes so far, then the whole line).
    line: Vec<u8>,
    /// Skipping the rest of an oversized line.
    discarding: bool,
    calls: Arc<Calls>,
    generation: u64,
}

/// How reading a line ended.
enum LineRead {
    /// [`Reader::line`] holds a whole line (with its newline).
    Line,
    /// A line longer than [`MAX_STDIO_MESSAGE_BYTES`]: skipped; its first
    /// bytes.
    Oversized(Vec<u8>),
    /// The server closed its stdout.
    Eof,
    /// Reading failed.
    Failed,
}

impl Reader {
    /// Reads the next line, never holding more than
    /// [`MAX_STDIO_MESSAGE_BYTES`] of it. Cancellation safe: a read
    /// dropped half-way leaves its bytes in [`Reader::line`] for the next
    /// call (nothing is awaited between taking bytes and keeping them).
    async fn next_line(&mut self) -> LineRead {
        loop {
            let available = match self.read.fill_buf().await {
                Ok(available) => available,
                Err(_) => return LineRead::Failed,
            };
            if available.is_empty() {
                return LineRead::Eof;
            }
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |at| at + 1);
            if self.discarding {
                self.read.consume(take);
                self.discarding = newline.is_none();
                continue;
            }
            if self.line.len().saturating_add(take) > MAX_STDIO_MESSAGE_BYTES {
                let mut head = std::mem::take(&mut self.line);
                head.truncate(LINE_HEAD_BYTES);
                let room = LINE_HEAD_BYTES.saturating_sub(head.len());
                head.extend_from_slice(&available[..take.min(room)]);
                self.read.consume(take);
                self.discarding = newline.is_none();
                return LineRead::Oversized(head);
            }
            self.line.extend_from_slice(&available[..take]);
            self.read.consume(take);
            if newline.is_some() {
                return LineRead::Line;
            }
        }
    }

    /// An error answer to the call whose answer was skipped as too large
    /// (found by the line's `id`, else the only call in flight), so that it
    /// ends now rather than at its timeout; `None` when no call is known.
    fn too_large(&self, id: Option<RequestId>) -> Option<ServerJsonRpcMessage> {
        let marker = match &id {
            Some(id) => self.calls.by_request_id(self.generation, id),
            None => self.calls.single_in_flight(self.generation),
        };
        let Some(marker) = marker else {
            tracing::error!(
                ?id,
                max_bytes = MAX_STDIO_MESSAGE_BYTES,
                "an MCP server sent a message too large to read, answering no known call; skipped"
            );
            return None;
        };
        let mut slots = lock(&self.calls.slots);
        let slot = slots.get_mut(&marker)?;
        let id = slot.request_id.clone()?;
        slot.too_large = true;
        Some(ServerJsonRpcMessage::error(
            ErrorData::new(
                ErrorCode(ANSWER_TOO_LARGE_CODE),
                format!("the answer is larger than {MAX_STDIO_MESSAGE_BYTES} bytes"),
                None,
            ),
            Some(id),
        ))
    }

    /// An error answer in place of an answer to `id` that cannot be
    /// decoded: the call it answers (if it is one) is marked so, and the
    /// request (a call, a listing) ends now.
    fn undecodable(&self, id: RequestId, reason: String) -> ServerJsonRpcMessage {
        if let Some(marker) = self.calls.by_request_id(self.generation, &id)
            && let Some(slot) = lock(&self.calls.slots).get_mut(&marker)
        {
            slot.undecodable = Some(reason.clone());
        }
        ServerJsonRpcMessage::error(
            ErrorData::new(
                ErrorCode(ANSWER_UNDECODABLE_CODE),
                format!("the answer cannot be decoded: {reason}"),
                None,
            ),
            Some(id),
        )
    }
}

/// What a line from a server is.
pub(super) enum Decoded {
    /// A message (repaired, when [`crate::json_text::Repairs::any`]).
    Message(Box<ServerJsonRpcMessage>, crate::json_text::Repairs),
    /// An empty line, or a notification that cannot be decoded.
    Skip,
    /// A request of the server's that cannot be decoded.
    Request {
        /// Its id.
        id: RequestId,
        /// Why.
        reason: String,
    },
    /// An answer that cannot be decoded, to the request `id`.
    Answer {
        /// The request it answers.
        id: RequestId,
        /// Why.
        reason: String,
    },
    /// Not a JSON-RPC message, and no request id can be found in it.
    Unknown {
        /// Why.
        reason: String,
    },
}

/// Decodes one line of a server's stdout (its newline, a `\r` before it
/// and a UTF-8 byte order mark ignored). Text that is not Unicode (lone
/// surrogate escapes, bytes that are not UTF-8) is repaired with U+FFFD
/// first if that makes it decodable. Pure.
pub(super) fn decode_line(line: &[u8]) -> Decoded {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Decoded::Skip;
    }
    let first = match serde_json::from_slice::<ServerJsonRpcMessage>(line) {
        Ok(message) => {
            return Decoded::Message(Box::new(message), crate::json_text::Repairs::default());
        }
        Err(e) => e,
    };
    let repaired = crate::json_text::repair(line);
    if let Some((text, repairs)) = &repaired
        && let Ok(message) = serde_json::from_slice::<ServerJsonRpcMessage>(text)
    {
        return Decoded::Message(Box::new(message), *repairs);
    }
    let text = repaired.as_ref().map_or(line, |(text, _)| text.as_slice());
    let reason = first.to_string();
    match serde_json::from_slice::<Value>(text) {
        Ok(value) => classify_value(&value, reason),
        Err(_) => {
            let head = &line[..line.len().min(LINE_HEAD_BYTES)];
            // A cut-off request of the server's names its own id, which
            // is not one of ours.
            let names_method = head.windows(8).any(|w| w == b"\"method\"");
            match id_in_head(head) {
                Some(id) if !names_method => Decoded::Answer { id, reason },
                _ => Decoded::Unknown { reason },
            }
        }
    }
}

/// A JSON value that is not a JSON-RPC message rmcp reads.
fn classify_value(value: &Value, reason: String) -> Decoded {
    let id = value
        .get("id")
        .and_then(|id| serde_json::from_value::<RequestId>(id.clone()).ok());
    match (value.get("method").is_some(), id) {
        (true, Some(id)) => Decoded::Request { id, reason },
        (true, None) => Decoded::Skip,
        (false, Some(id)) => Decoded::Answer { id, reason },
        (false, None) => Decoded::Unknown { reason },
    }
}

/// The top-level `"id"` of a JSON-RPC message from the start of its line,
/// when it is there (a number, or a string without escapes).
pub(super) fn id_in_head(head: &[u8]) -> Option<RequestId> {
    let skip_ws = |mut i: usize| {
        while head.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        i
    };
    let mut depth = 0usize;
    let mut i = 0;
    while i < head.len() {
        match head[i] {
            b'"' => {
                let start = i + 1;
                i = start;
                while *head.get(i)? != b'"' {
                    i += if head[i] == b'\\' { 2 } else { 1 };
                }
                let key = &head[start..i];
                i += 1;
                if depth == 1 && key == b"id" {
                    let colon = skip_ws(i);
                    if head.get(colon) != Some(&b':') {
                        continue;
                    }
                    let value = skip_ws(colon + 1);
                    if head.get(value) == Some(&b'"') {
                        let end = value + 1 + head[value + 1..].iter().position(|b| *b == b'"')?;
                        let text = std::str::from_utf8(&head[value + 1..end]).ok()?;
                        if text.contains('\\') {
                            return None;
                        }
                        return Some(RequestId::String(text.into()));
                    }
                    let end = value
                        + head[value..]
                            .iter()
                            .position(|b| !(b.is_ascii_digit() || *b == b'-'))?;
                    let number = std::str::from_utf8(&head[value..end]).ok()?.parse().ok()?;
                    return Some(RequestId::Number(number));
                }
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    None
}

/// Logs a stdio server's stderr line by line, so it never mixes with the
/// protocol on stdout, and keeps its last lines in `exit`.
async fn log_stderr(server: String, pid: Option<u32>, stderr: ChildStderr, exit: Arc<Exit>) {
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut reader)
            .take(MAX_STDERR_LINE)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end();
                exit.keep(text);
                tracing::info!(target: "belay_worker::mcp::stderr", server, pid, "{text}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_of_an_oversized_line_is_read_from_its_start() {
        let id = |head: &str| id_in_head(head.as_bytes());
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"text":"xx"#),
            Some(RequestId::Number(7))
        );
        assert_eq!(
            id(r#"{"id" : "a-1", "jsonrpc":"2.0","result":{"#),
            Some(RequestId::String("a-1".into()))
        );
        // Only the top-level `id` counts; a cut-off head has none.
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","result":{"id":3,"content":[{"text":"xx"#),
            None
        );
        assert_eq!(id(r#"{"jsonrpc":"2.0","result":{"text":"\"id\":4"#), None);
        assert_eq!(id(r#"{"jsonrpc":"2.0","id":12"#), None);
    }

    fn decoded_kind(line: &[u8]) -> (&'static str, crate::json_text::Repairs) {
        match decode_line(line) {
            Decoded::Message(_, repairs) => ("message", repairs),
            Decoded::Skip => ("skip", Default::default()),
            Decoded::Request { .. } => ("request", Default::default()),
            Decoded::Answer { .. } => ("answer", Default::default()),
            Decoded::Unknown { .. } => ("unknown", Default::default()),
        }
    }

    #[test]
    fn lines_decode_repaired_or_say_what_they_answer() {
        let kind = |line: &str| decoded_kind(line.as_bytes());
        let answer =
            r#"{"jsonrpc":"2.0","id":4,"result":{"content":[{"type":"text","text":"x\ud83dy"}]}}"#;
        let (what, repairs) = kind(answer);
        assert_eq!((what, repairs.lone_surrogates), ("message", 1));
        assert!(matches!(
            decode_line(answer.as_bytes()),
            Decoded::Message(m, _) if matches!(&*m, ServerJsonRpcMessage::Response(r)
                if serde_json::to_value(&r.result).is_ok_and(|v| v["content"][0]["text"] == "x\u{FFFD}y"))
        ));
        assert_eq!(kind("\r\n").0, "skip");
        assert_eq!(
            kind("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":7}\n").0,
            "skip"
        );
        assert!(matches!(
            decode_line(br#"{"jsonrpc":"2.0","id":"s1","method":"sampling/createMessage","params":7}"#),
            Decoded::Request { id: RequestId::String(s), .. } if &*s == "s1"
        ));
        // Cut off: the id at its start says which request it answered.
        assert!(matches!(
            decode_line(
                br#"{"jsonrpc":"2.0","id":9,"result":{"content":[{"type":"text","text":"ab"#
            ),
            Decoded::Answer {
                id: RequestId::Number(9),
                ..
            }
        ));
        assert_eq!(kind("not json at all").0, "unknown");
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","id":3,"method":"x","params":{"a":"#).0,
            "unknown"
        );
    }
}
