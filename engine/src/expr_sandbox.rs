//! The expression sandbox: jq expressions of workflow definitions are
//! evaluated in child processes with hard limits, so that no expression can
//! crash, stall or starve the engine.
//!
//! jaq offers no fuel, step limit or interruption hook, and what
//! `definitions::expr` refuses or counts makes every evaluation end but does
//! not bound its cost: `reduce range(40) as $i (2; . * .)` asks for 2^40
//! bits, `def f(g): g | g; f(f(…(.)))` for 2^34 steps. Evaluated in the
//! engine, the first aborts the process (on a failed allocation, on every
//! restart when it sits behind a timer) and the second holds a runtime
//! thread and the run's lock for years. So a process that calls
//! [`enable_sandbox`] sends every evaluation to an evaluator: the same
//! executable, started with [`SANDBOX_ENV`] set, which [`run_sandbox_if_requested`]
//! (the first statement of its `main`) turns into a server of evaluations.
//!
//! # The evaluator
//!
//! On start it forbids core dumps, then, on a thread with the evaluation
//! stack of `definitions::expr`, caps its address space at what it has
//! mapped plus [`MEMORY_LIMIT_BYTES`] (`RLIMIT_AS`), and before each request
//! caps its CPU time at what it has used plus [`CPU_LIMIT_SECS`]
//! (`RLIMIT_CPU`, a backstop for an evaluator whose parent is gone). It
//! answers `ready`, then serves requests on stdin/stdout until stdin ends.
//! Its environment is emptied (it holds none of the engine's secrets), and it
//! runs in a process group of its own (a Ctrl-C at the terminal reaches the
//! engine, which shuts down, not the evaluator in the middle of a run's step).
//!
//! # Protocol
//!
//! Frames: a 4-byte big-endian length, then that many bytes of JSON.
//! - evaluator → parent, once at start: `"ready"`;
//! - parent → evaluator: `{"sources": ["<jq>", …], "input": <state>}`, the
//!   expressions of one [`Expr::eval`](crate::definitions::expr::Expr::eval)
//!   (one source) or [`Template::render`](crate::definitions::expr::Template::render)
//!   (all of its expressions, in document order), already compiled by the
//!   parent, which reports compile errors itself;
//! - evaluator → parent, one frame per source, in order, ending after the
//!   first error: `{"ok": <value>}` or `{"error": {"kind": "runtime",
//!   "message": …}}` (kinds: `runtime`, `no_value`, `many_values`,
//!   `range_limit`, `too_large`, `not_json`, `other`).
//!
//! # The parent
//!
//! A pool of at most [`MAX_EVALUATORS`] evaluators, started when first
//! needed. An evaluation takes an idle one (or starts one, or waits for one
//! to be free), sends the request, and waits for the answers until
//! [`EVAL_DEADLINE_MS`] after sending. Past the deadline it kills the
//! evaluator (SIGKILL) and fails with [`ExprError::TimedOut`]; an evaluator
//! that dies (a failed allocation aborts it, the kernel kills it) fails the
//! evaluation with [`ExprError::ResourceLimit`]; either way the pool starts
//! a new one for the next evaluation. The wait happens on the caller's
//! thread (the machine is synchronous: it runs inside `Store::transition`);
//! on a worker thread of a multi-threaded tokio runtime it is wrapped in
//! `block_in_place`, so the runtime moves its other tasks elsewhere for
//! that time, which is at most the deadline. Evaluation results are
//! recorded in the run's events, so replaying a history never evaluates
//! again: the sandbox changes how an expression fails, never what a
//! recorded run means.
//!
//! A process that never calls [`enable_sandbox`] (the engine crate's own
//! tests, which run the machine in the test binary) evaluates in process,
//! as before.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::definitions::expr::{self, ExprError};

/// Environment variable that makes a process an evaluator (value `1`):
/// set by the parent when it starts one, read by
/// [`run_sandbox_if_requested`]. Internal: nothing else should set it.
pub const SANDBOX_ENV: &str = "BELAY_EXPR_SANDBOX_CHILD";

/// How long one evaluation (one [`Expr::eval`](crate::definitions::expr::Expr::eval),
/// or all the expressions of one
/// [`Template::render`](crate::definitions::expr::Template::render)) may
/// take, in milliseconds, counted from sending the request. An ordinary
/// expression takes microseconds; this is long enough for a big state
/// document on a loaded machine, and short enough that a run's step (which
/// holds the run's lock) is not held up for long.
pub const EVAL_DEADLINE_MS: u64 = 1_000;

/// Memory an evaluator may map beyond what it has mapped when it starts
/// (its code and its evaluation thread's stack), in bytes: `RLIMIT_AS`.
pub const MEMORY_LIMIT_BYTES: u64 = 1 << 30;

/// CPU time an evaluator may use for one request, in seconds
/// (`RLIMIT_CPU`, renewed before each request). A backstop: the parent
/// kills an evaluator long before, at [`EVAL_DEADLINE_MS`]; this one stops
/// an evaluator whose parent died while it was busy.
pub const CPU_LIMIT_SECS: u64 = 10;

/// Most evaluator processes at once (a process-wide pool).
pub const MAX_EVALUATORS: usize = 4;

/// How long a new evaluator may take to answer `ready`.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an evaluation waits for an evaluator to be free when all
/// [`MAX_EVALUATORS`] are busy. Each is busy at most [`EVAL_DEADLINE_MS`],
/// so this is only reached when starting evaluators keeps failing.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest frame the parent reads from an evaluator: values are at most
/// 1 MiB of JSON (`definitions::expr::MAX_VALUE_BYTES`), messages 500
/// characters.
const MAX_REPLY_BYTES: usize = 16 << 20;

// ---------------------------------------------------------------------
// Messages and frames.

/// A request: the expressions (compiled by the parent already) and the
/// input they all read.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Request {
    sources: Vec<String>,
    input: Value,
}

/// [`Request`] as the parent writes it, without copying the input.
#[derive(Serialize)]
struct RequestRef<'a> {
    sources: &'a [&'a str],
    input: &'a Value,
}

/// One frame from an evaluator.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
enum Reply {
    /// Once, at start: limits set, requests welcome.
    Ready,
    /// The value of the next expression.
    Ok(Value),
    /// The next expression failed; nothing follows for this request.
    Error(Failure),
}

/// An evaluation error as it crosses the pipe: the runtime kinds of
/// [`ExprError`] (compile errors never do, the parent compiles), and
/// `other` for anything the evaluator could not do.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Failure {
    Runtime { message: String },
    NoValue,
    ManyValues { count: usize, at_least: bool },
    RangeLimit { limit: u64 },
    TooLarge { limit: usize },
    NotJson { reason: String },
    Other { message: String },
}

impl From<ExprError> for Failure {
    fn from(error: ExprError) -> Failure {
        match error {
            ExprError::Runtime { message } => Failure::Runtime { message },
            ExprError::NoValue => Failure::NoValue,
            ExprError::ManyValues { count, at_least } => Failure::ManyValues { count, at_least },
            ExprError::RangeLimit { limit } => Failure::RangeLimit { limit },
            ExprError::TooLarge { limit } => Failure::TooLarge { limit },
            ExprError::NotJson { reason } => Failure::NotJson { reason },
            other => Failure::Other {
                message: other.to_string(),
            },
        }
    }
}

impl From<Failure> for ExprError {
    fn from(failure: Failure) -> ExprError {
        match failure {
            Failure::Runtime { message } => ExprError::Runtime { message },
            Failure::NoValue => ExprError::NoValue,
            Failure::ManyValues { count, at_least } => ExprError::ManyValues { count, at_least },
            Failure::RangeLimit { limit } => ExprError::RangeLimit { limit },
            Failure::TooLarge { limit } => ExprError::TooLarge { limit },
            Failure::NotJson { reason } => ExprError::NotJson { reason },
            Failure::Other { message } => ExprError::Sandbox { message },
        }
    }
}

/// Write one frame: its length (4 bytes, big-endian), then `body`.
fn write_frame(w: &mut impl Write, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a frame of {} bytes is too large", body.len()),
        )
    })?;
    w.write_all(&len.to_be_bytes())?;
    w.write_all(body)?;
    w.flush()
}

/// Read one frame of at most `max` bytes; `None` at the end of the stream
/// before a frame starts.
fn read_frame(r: &mut impl Read, max: usize) -> io::Result<Option<Vec<u8>>> {
    let mut header = [0_u8; 4];
    let mut got = 0;
    while got < header.len() {
        match r.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = usize::try_from(u32::from_be_bytes(header)).unwrap_or(usize::MAX);
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes, more than {max}"),
        ));
    }
    let mut body = vec![0_u8; len];
    r.read_exact(&mut body)?;
    Ok(Some(body))
}

fn encode<T: Serialize>(message: &T) -> io::Result<Vec<u8>> {
    serde_json::to_vec(message).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

fn decode_reply(body: &[u8]) -> io::Result<Reply> {
    serde_json::from_slice(body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// A request as the evaluator reads it. The state document may nest deeper
/// than `serde_json`'s default limit of 128 (a run input near that limit
/// inside the document's own levels); the parent holds it already, and the
/// evaluator reads it on its large stack.
fn decode_request(body: &[u8]) -> Result<Request, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(body);
    de.disable_recursion_limit();
    let request = Request::deserialize(&mut de)?;
    de.end()?;
    Ok(request)
}

// ---------------------------------------------------------------------
// The evaluator (child) side.

/// If this process was started as an evaluator ([`SANDBOX_ENV`] is set),
/// serve evaluations on stdin/stdout until stdin ends, then exit; otherwise
/// return at once. Call it as the first statement of `main` of every binary
/// that may call [`enable_sandbox`], before anything starts threads or
/// reads the environment.
pub fn run_sandbox_if_requested() {
    if std::env::var_os(SANDBOX_ENV).is_none() {
        return;
    }
    std::process::exit(serve_process());
}

/// The evaluator's life: limits, then the serving loop on a thread with the
/// evaluation stack. Returns the exit code.
fn serve_process() -> i32 {
    // A failed allocation aborts the process: no core file for that.
    let _ = set_both_limits(nix::sys::resource::Resource::RLIMIT_CORE, 0);
    let spawned = std::thread::Builder::new()
        .name("belay-jq-sandbox".into())
        .stack_size(expr::EVAL_STACK_BYTES)
        .spawn(|| {
            expr::mark_eval_stack();
            if let Err(e) = limit_memory() {
                eprintln!("belay expression sandbox: cannot limit memory: {e}");
                return 71;
            }
            let stdin = io::stdin();
            let stdout = io::stdout();
            match serve(
                &mut stdin.lock(),
                &mut BufWriter::new(stdout.lock()),
                cpu_backstop,
            ) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("belay expression sandbox: {e}");
                    74
                }
            }
        });
    match spawned {
        Ok(handle) => handle.join().unwrap_or(101),
        Err(e) => {
            eprintln!("belay expression sandbox: cannot start the evaluation thread: {e}");
            71
        }
    }
}

/// Answer `ready`, then each request of `input` on `output` until `input`
/// ends. `before_request` runs before each evaluation (the CPU backstop).
/// Must run on a thread marked by `expr::mark_eval_stack`.
fn serve(
    input: &mut impl Read,
    output: &mut impl Write,
    mut before_request: impl FnMut(),
) -> io::Result<()> {
    write_frame(output, &encode(&Reply::Ready)?)?;
    while let Some(body) = read_frame(input, usize::MAX)? {
        let request = match decode_request(&body) {
            Ok(request) => request,
            Err(e) => {
                let reply = Reply::Error(Failure::Other {
                    message: format!("the evaluator could not read the request: {e}"),
                });
                write_frame(output, &encode(&reply)?)?;
                continue;
            }
        };
        drop(body);
        before_request();
        let mut written = Ok(());
        expr::eval_sources(&request.sources, &request.input, |outcome| {
            if written.is_err() {
                return;
            }
            let reply = match outcome {
                Ok(value) => Reply::Ok(value),
                Err(error) => Reply::Error(Failure::from(error)),
            };
            written = encode(&reply).and_then(|body| write_frame(output, &body));
        });
        written?;
    }
    Ok(())
}

/// Set the soft and hard limit of `resource` to `value`, or to the hard
/// limit when that is lower (lowering a limit is always allowed).
fn set_both_limits(resource: nix::sys::resource::Resource, value: u64) -> nix::Result<()> {
    use nix::sys::resource::{getrlimit, setrlimit};
    let (_, hard) = getrlimit(resource)?;
    let value = value.min(hard);
    setrlimit(resource, value, value)
}

/// Cap the address space at what is mapped now plus [`MEMORY_LIMIT_BYTES`].
fn limit_memory() -> nix::Result<()> {
    let mapped = mapped_bytes().unwrap_or(0);
    set_both_limits(
        nix::sys::resource::Resource::RLIMIT_AS,
        mapped.saturating_add(MEMORY_LIMIT_BYTES),
    )
}

/// The process's virtual memory size (`VmSize` of `/proc/self/status`), in
/// bytes; `None` where there is no such file.
fn mapped_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmSize:"))?;
    let kib: u64 = line
        .trim_start_matches("VmSize:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib.saturating_mul(1024))
}

/// Allow [`CPU_LIMIT_SECS`] more seconds of CPU time than used so far
/// (soft limit: SIGXCPU, which ends the process). Best effort.
fn cpu_backstop() {
    use nix::sys::resource::{Resource, UsageWho, getrlimit, getrusage, setrlimit};
    let Ok(usage) = getrusage(UsageWho::RUSAGE_SELF) else {
        return;
    };
    let used = u64::try_from(usage.user_time().tv_sec() + usage.system_time().tv_sec())
        .unwrap_or(0)
        // Whole seconds are counted down; one more keeps the margin.
        .saturating_add(1);
    let Ok((_, hard)) = getrlimit(Resource::RLIMIT_CPU) else {
        return;
    };
    let _ = setrlimit(
        Resource::RLIMIT_CPU,
        used.saturating_add(CPU_LIMIT_SECS).min(hard),
        hard,
    );
}

// ---------------------------------------------------------------------
// The parent side.

/// Evaluate this process's expressions in evaluator processes from now on,
/// started from this executable (`std::env::current_exe`), which must call
/// [`run_sandbox_if_requested`] first thing in `main`. Call it once, early
/// in `main` (later calls change nothing). Without it, expressions are
/// evaluated in process.
pub fn enable_sandbox() {
    match std::env::current_exe() {
        Ok(program) => enable_sandbox_with(program),
        Err(e) => tracing::warn!(
            error = %e,
            "the expression sandbox is off: this executable's path is unknown; expressions are evaluated in process"
        ),
    }
}

/// [`enable_sandbox`] with evaluators started from `program` (a binary that
/// calls [`run_sandbox_if_requested`] first thing, such as `belay-engine`):
/// for tests and for programs that embed the engine without doing so.
pub fn enable_sandbox_with(program: impl Into<PathBuf>) {
    let pool = Pool {
        program: program.into(),
        state: Mutex::new(PoolState {
            idle: Vec::new(),
            live: 0,
        }),
        freed: Condvar::new(),
    };
    if POOL.set(pool).is_ok() {
        expr::set_remote(evaluate);
    }
}

/// Whether this process evaluates expressions in the sandbox.
pub fn sandbox_enabled() -> bool {
    POOL.get().is_some()
}

static POOL: OnceLock<Pool> = OnceLock::new();

/// The hook `definitions::expr` calls for each evaluation.
fn evaluate(sources: &[&str], input: &Value) -> Vec<Result<Value, ExprError>> {
    match POOL.get() {
        Some(pool) => wait_off_runtime(|| pool.evaluate(sources, input)),
        None => vec![Err(ExprError::Sandbox {
            message: "the expression sandbox is not enabled".into(),
        })],
    }
}

/// Run `f`, which blocks for a bounded time, without stalling a tokio
/// runtime: on a multi-threaded runtime through `block_in_place` (its other
/// tasks move to another worker meanwhile); elsewhere (no runtime, a
/// current-thread runtime, where `block_in_place` is not allowed) as is.
fn wait_off_runtime<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// The evaluator processes of this process.
struct Pool {
    program: PathBuf,
    state: Mutex<PoolState>,
    /// Signalled when an evaluator becomes idle or goes away.
    freed: Condvar,
}

struct PoolState {
    idle: Vec<Evaluator>,
    /// Evaluators that exist: idle, busy, or being started.
    live: usize,
}

/// One evaluator process, and the thread that does its pipe I/O (so that
/// the caller only ever waits on a channel, with a deadline).
struct Evaluator {
    child: Child,
    jobs: mpsc::Sender<Job>,
    replies: mpsc::Receiver<io::Result<Reply>>,
}

/// A request for the I/O thread: the frame to write and how many answers
/// to read back (fewer after an error).
struct Job {
    frame: Vec<u8>,
    answers: usize,
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn evaluate(&self, sources: &[&str], input: &Value) -> Vec<Result<Value, ExprError>> {
        let frame = match encode(&RequestRef { sources, input }) {
            Ok(frame) => frame,
            Err(e) => {
                return vec![Err(ExprError::Sandbox {
                    message: format!("the request could not be written: {e}"),
                })];
            }
        };
        let evaluator = match self.acquire() {
            Ok(evaluator) => evaluator,
            Err(e) => return vec![Err(e)],
        };
        let deadline = Instant::now() + Duration::from_millis(EVAL_DEADLINE_MS);
        let job = Job {
            frame,
            answers: sources.len(),
        };
        let mut outcomes = Vec::with_capacity(sources.len());
        if evaluator.jobs.send(job).is_err() {
            let status = self.discard(evaluator);
            outcomes.push(Err(death(status)));
            return outcomes;
        }
        while outcomes.len() < sources.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            match evaluator.replies.recv_timeout(left) {
                Ok(Ok(Reply::Ok(value))) => outcomes.push(Ok(value)),
                Ok(Ok(Reply::Error(failure))) => {
                    outcomes.push(Err(failure.into()));
                    break;
                }
                Ok(Ok(Reply::Ready)) => {
                    self.discard(evaluator);
                    outcomes.push(Err(ExprError::Sandbox {
                        message: "the evaluator answered out of turn".into(),
                    }));
                    return outcomes;
                }
                Ok(Err(_)) | Err(RecvTimeoutError::Disconnected) => {
                    let status = self.discard(evaluator);
                    tracing::warn!(status = ?status, "an expression evaluator died during an evaluation; it is replaced");
                    outcomes.push(Err(death(status)));
                    return outcomes;
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.discard(evaluator);
                    tracing::warn!(
                        deadline_ms = EVAL_DEADLINE_MS,
                        "an expression evaluation ran past its deadline; its evaluator was killed and is replaced"
                    );
                    outcomes.push(Err(ExprError::TimedOut {
                        ms: EVAL_DEADLINE_MS,
                    }));
                    return outcomes;
                }
            }
        }
        self.release(evaluator);
        outcomes
    }

    /// An idle evaluator, a new one (below [`MAX_EVALUATORS`]), or the
    /// first to become free.
    fn acquire(&self) -> Result<Evaluator, ExprError> {
        let give_up = Instant::now() + ACQUIRE_TIMEOUT;
        let mut state = self.lock();
        loop {
            while let Some(mut evaluator) = state.idle.pop() {
                // One that died while idle (killed from outside) is not
                // handed an expression to be blamed on.
                if matches!(evaluator.child.try_wait(), Ok(None)) {
                    return Ok(evaluator);
                }
                let _ = evaluator.child.kill();
                let _ = evaluator.child.wait();
                state.live = state.live.saturating_sub(1);
            }
            if state.live < MAX_EVALUATORS {
                state.live += 1;
                drop(state);
                let started = start_evaluator(&self.program);
                if started.is_err() {
                    let mut state = self.lock();
                    state.live = state.live.saturating_sub(1);
                    drop(state);
                    self.freed.notify_one();
                }
                return started;
            }
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ExprError::Sandbox {
                    message: format!(
                        "all {MAX_EVALUATORS} expression evaluators stayed busy for {} s",
                        ACQUIRE_TIMEOUT.as_secs()
                    ),
                });
            }
            state = self
                .freed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn release(&self, evaluator: Evaluator) {
        self.lock().idle.push(evaluator);
        self.freed.notify_one();
    }

    /// Kill `evaluator` (SIGKILL; nothing if it is dead already), reap it
    /// and make room for a new one. Its exit status, when known.
    fn discard(&self, evaluator: Evaluator) -> Option<ExitStatus> {
        let Evaluator {
            mut child,
            jobs,
            replies,
        } = evaluator;
        let _ = child.kill();
        let status = child.wait().ok();
        // The I/O thread sees the pipes close (or these channels go) and ends.
        drop((jobs, replies));
        let mut state = self.lock();
        state.live = state.live.saturating_sub(1);
        drop(state);
        self.freed.notify_one();
        status
    }
}

/// Start an evaluator from `program` and wait for its `ready`.
fn start_evaluator(program: &std::path::Path) -> Result<Evaluator, ExprError> {
    use std::os::unix::process::CommandExt;
    let failed = |what: String| ExprError::Sandbox {
        message: format!("the expression evaluator could not start: {what}"),
    };
    let mut child = Command::new(program)
        .env_clear()
        .env(SANDBOX_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()
        .map_err(|e| failed(format!("{}: {e}", program.display())))?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(failed("its pipes were not set up".into()));
    };
    let (jobs, job_rx) = mpsc::channel();
    let (reply_tx, replies) = mpsc::channel();
    let io = std::thread::Builder::new()
        .name("belay-jq-io".into())
        .spawn(move || pipe_io(stdin, stdout, &job_rx, &reply_tx));
    if let Err(e) = io {
        let _ = child.kill();
        let _ = child.wait();
        return Err(failed(format!("no thread for its pipes: {e}")));
    }
    match replies.recv_timeout(START_TIMEOUT) {
        Ok(Ok(Reply::Ready)) => Ok(Evaluator {
            child,
            jobs,
            replies,
        }),
        other => {
            let _ = child.kill();
            let status = child.wait().ok();
            let why = match other {
                Ok(Ok(reply)) => format!("it answered {reply:?}"),
                Ok(Err(e)) => format!("{e} (exit status {status:?})"),
                Err(_) => format!("no answer within {} s", START_TIMEOUT.as_secs()),
            };
            Err(failed(why))
        }
    }
}

/// The I/O thread of one evaluator: its `ready`, then for each job the
/// request and its answers. Ends when the evaluator's pipes fail or close,
/// or when the evaluator is discarded.
fn pipe_io(
    mut stdin: ChildStdin,
    stdout: ChildStdout,
    jobs: &mpsc::Receiver<Job>,
    replies: &mpsc::Sender<io::Result<Reply>>,
) {
    let mut stdout = BufReader::new(stdout);
    let mut read_reply = || -> io::Result<Reply> {
        let body = read_frame(&mut stdout, MAX_REPLY_BYTES)?
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        decode_reply(&body)
    };
    let ready = read_reply();
    let failed = ready.is_err();
    if replies.send(ready).is_err() || failed {
        return;
    }
    while let Ok(job) = jobs.recv() {
        if let Err(e) = write_frame(&mut stdin, &job.frame) {
            let _ = replies.send(Err(e));
            return;
        }
        drop(job.frame);
        for _ in 0..job.answers {
            let reply = read_reply();
            let last = !matches!(reply, Ok(Reply::Ok(_)));
            let failed = reply.is_err();
            if replies.send(reply).is_err() || failed {
                return;
            }
            if last {
                break;
            }
        }
    }
}

/// What an evaluator's death during an evaluation means: killed by its CPU
/// limit, or (an abort on a failed allocation, a kill by the kernel's OOM
/// killer, a crash on memory) out of memory; anything else is reported as
/// it is.
fn death(status: Option<ExitStatus>) -> ExprError {
    use nix::sys::signal::Signal;
    use std::os::unix::process::ExitStatusExt;
    let signal = status
        .and_then(|s| s.signal())
        .and_then(|s| Signal::try_from(s).ok());
    match signal {
        Some(Signal::SIGXCPU) => ExprError::ResourceLimit {
            limit: format!("{CPU_LIMIT_SECS} s of CPU time"),
        },
        Some(Signal::SIGABRT | Signal::SIGKILL | Signal::SIGSEGV | Signal::SIGBUS) => {
            ExprError::ResourceLimit {
                limit: format!("{} MiB of memory", MEMORY_LIMIT_BYTES >> 20),
            }
        }
        _ => ExprError::Sandbox {
            message: match status {
                Some(status) => format!("the evaluator process ended unexpectedly ({status})"),
                None => "the evaluator process ended unexpectedly".into(),
            },
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn frames(bytes: &[u8]) -> Vec<Value> {
        let mut r = bytes;
        let mut out = Vec::new();
        while let Some(body) = read_frame(&mut r, usize::MAX).unwrap() {
            out.push(serde_json::from_slice(&body).unwrap());
        }
        out
    }

    #[test]
    fn frames_round_trip_and_stop_cleanly_at_the_end() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"{\"a\":1}").unwrap();
        write_frame(&mut buf, b"").unwrap();
        assert_eq!(&buf[..4], &[0, 0, 0, 7]);
        let mut r = buf.as_slice();
        assert_eq!(read_frame(&mut r, 100).unwrap().unwrap(), b"{\"a\":1}");
        assert_eq!(read_frame(&mut r, 100).unwrap().unwrap(), b"");
        assert!(read_frame(&mut r, 100).unwrap().is_none());
    }

    #[test]
    fn truncated_or_oversized_frames_are_errors() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"0123456789").unwrap();
        let cut = &buf[..8];
        assert_eq!(
            read_frame(&mut &cut[..], 100).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        assert_eq!(
            read_frame(&mut &buf[..2], 100).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        assert_eq!(
            read_frame(&mut buf.as_slice(), 9).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn messages_have_the_documented_shapes() {
        assert_eq!(encode(&Reply::Ready).unwrap(), b"\"ready\"");
        assert_eq!(
            serde_json::to_value(Reply::Ok(json!({"a": [1]}))).unwrap(),
            json!({"ok": {"a": [1]}})
        );
        assert_eq!(
            serde_json::to_value(Reply::Error(Failure::ManyValues {
                count: 3,
                at_least: false
            }))
            .unwrap(),
            json!({"error": {"kind": "many_values", "count": 3, "at_least": false}})
        );
        let input = json!({"input": {"n": 1}});
        let body = encode(&RequestRef {
            sources: &[".input.n", ".x"],
            input: &input,
        })
        .unwrap();
        assert_eq!(
            decode_request(&body).unwrap(),
            Request {
                sources: vec![".input.n".into(), ".x".into()],
                input
            }
        );
    }

    #[test]
    fn runtime_errors_cross_unchanged_and_others_become_sandbox_errors() {
        let kept = [
            ExprError::Runtime {
                message: "boom".into(),
            },
            ExprError::NoValue,
            ExprError::ManyValues {
                count: 1000,
                at_least: true,
            },
            ExprError::RangeLimit { limit: 7 },
            ExprError::TooLarge { limit: 9 },
            ExprError::NotJson {
                reason: "NaN".into(),
            },
        ];
        for error in kept {
            let wire = serde_json::to_vec(&Failure::from(error.clone())).unwrap();
            let back: Failure = serde_json::from_slice(&wire).unwrap();
            assert_eq!(ExprError::from(back), error);
        }
        let other = ExprError::TimedOut { ms: 5 };
        assert_eq!(
            ExprError::from(Failure::from(other.clone())),
            ExprError::Sandbox {
                message: other.to_string()
            }
        );
    }

    #[test]
    fn deaths_are_named_by_their_signal() {
        use std::os::unix::process::ExitStatusExt;
        let signalled = |s: i32| Some(ExitStatus::from_raw(s));
        assert!(death(signalled(6)).to_string().contains("MiB of memory"));
        assert!(death(signalled(9)).to_string().contains("MiB of memory"));
        assert!(death(signalled(24)).to_string().contains("of CPU time"));
        assert!(matches!(
            death(Some(ExitStatus::from_raw(3 << 8))),
            ExprError::Sandbox { .. }
        ));
        assert!(matches!(death(None), ExprError::Sandbox { .. }));
    }

    /// The serving loop over in-memory pipes, as a child would run it.
    /// Returns the frames written and how many requests were evaluated.
    fn serve_bytes(requests: &[Vec<u8>]) -> (Vec<Value>, usize) {
        let mut input = Vec::new();
        for r in requests {
            write_frame(&mut input, r).unwrap();
        }
        let handle = std::thread::Builder::new()
            .stack_size(expr::EVAL_STACK_BYTES)
            .spawn(move || {
                expr::mark_eval_stack();
                let mut output = Vec::new();
                let mut requests = 0;
                serve(&mut input.as_slice(), &mut output, || requests += 1).unwrap();
                (output, requests)
            })
            .unwrap();
        let (output, served) = handle.join().unwrap();
        (frames(&output), served)
    }

    #[test]
    fn the_evaluator_answers_ready_then_each_source_until_the_first_error() {
        let input = json!({"input": {"n": 41, "s": "x"}});
        let request = |sources: &[&str]| {
            encode(&RequestRef {
                sources,
                input: &input,
            })
            .unwrap()
        };
        let (out, evaluated) = serve_bytes(&[
            request(&[".input.n + 1", ".input.s * 3"]),
            request(&[".input.n", "error(\"no\")", ".input.s"]),
            request(&["range(.input.n * 5000) | empty"]),
            b"not json".to_vec(),
            request(&["1, 2"]),
        ]);
        assert_eq!(
            out,
            vec![
                json!("ready"),
                json!({"ok": 42}),
                json!({"ok": "xxx"}),
                json!({"ok": 41}),
                json!({"error": {"kind": "runtime", "message": "no"}}),
                json!({"error": {"kind": "range_limit", "limit": 100000}}),
                out[6].clone(),
                json!({"error": {"kind": "many_values", "count": 2, "at_least": false}}),
            ]
        );
        assert_eq!(out[6]["error"]["kind"], "other", "{}", out[6]);
        assert_eq!(evaluated, 4, "the unreadable request is not evaluated");
    }
}
