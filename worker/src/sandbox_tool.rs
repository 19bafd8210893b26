//! Executes `tool_call` tasks whose binding is
//! [`ToolBinding::Sandbox`](belay_proto::wire::ToolBinding::Sandbox):
//! a tool's inline JavaScript or Python code, in an isolated sandbox.
//!
//! # How a call runs
//! The code is the body of a function whose parameters are the tool's
//! declared parameters (each bound to the argument of that name; one the
//! call leaves out is `undefined` / `None`), and what it returns is the
//! result. A small harness (`sandbox/harness.js`, `sandbox/harness.py`)
//! reads `{"code", "params", "args"}` from stdin, runs the function, and
//! writes one JSON line to stdout: the result, or the error (syntax error,
//! thrown exception, a result that is not JSON). What the code prints goes
//! to stderr, and the last [`STDERR_TAIL_BYTES`] of it are kept for errors.
//! The engine checks the result against the declared return type, as for
//! every tool.
//!
//! # Isolation
//! Each call is a fresh process tree:
//! `prlimit <limits> -- bwrap <namespaces, binds> -- <runtime> <harness>`.
//! - bubblewrap unshares every namespace (user, mount, PID, network, IPC,
//!   UTS, cgroup): the network namespace has only a loopback interface, so
//!   no connection leaves it; the process runs as uid 65534 with no
//!   capabilities, a new session, no further user namespaces, and dies
//!   with the worker (`--die-with-parent`).
//! - The file system is empty but for read-only binds of the runtime (its
//!   executable, the system's shared libraries, Python's `<prefix>/lib`,
//!   and `--sandbox-ro-bind` paths), a minimal `/dev`, and a new tmpfs
//!   working directory `/sandbox` (also `HOME` and `TMPDIR`) of at most
//!   `memory_mb` MiB, gone when the call ends. No `/proc`, `/etc`, `/tmp`
//!   or home directory of the host.
//! - The environment is cleared (`HOME`, `TMPDIR`, `LANG` only): nothing of
//!   the worker's (API keys, `BELAY_TOOL_CONFIG_*`) is visible.
//! - Limits: `RLIMIT_DATA` of `memory_mb` MiB (Python also `RLIMIT_AS`;
//!   Node.js reserves far more address space than it uses, so it gets
//!   `--max-old-space-size` instead), CPU time of the timeout plus one
//!   second, no core files, 256 open files; and a wall-clock timeout after
//!   which the process tree is killed (SIGKILL to bwrap, whose PID
//!   namespace then ends).
//!
//! # Failures
//! Every failure is a [`SandboxError`] naming what happened; the worker
//! survives all of them. A call that never started (no runtime on this
//! worker, bwrap could not set up the sandbox) is `NOT_SENT`; anything the
//! code did (syntax error, exception, timeout, memory limit, bad result,
//! crash) is `REJECTED`: the code is a pure computation, so running it
//! again would fail the same way, and the model is told.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use belay_proto::v1::FailureClass;
use belay_proto::wire::{SandboxBinding, SandboxRuntime};
use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

/// Default wall-clock limit of one call without `timeout:`, ms.
pub const DEFAULT_SANDBOX_TIMEOUT_MS: u64 = 10_000;
/// Default memory limit of one call without `memory_mb:`, MiB.
pub const DEFAULT_SANDBOX_MEMORY_MB: u64 = 256;
/// How much of the code's stderr an error keeps (its end), bytes.
pub const STDERR_TAIL_BYTES: usize = 2_000;
/// Largest stdout (the result line) read, bytes; more is an error.
pub const MAX_RESULT_BYTES: usize = 4 * 1024 * 1024;
/// Largest trace (stack) an error keeps, bytes.
const MAX_TRACE_BYTES: usize = 2_000;
/// Node.js's own memory (code, buffers, threads) besides its JS heap, MiB:
/// the heap may use `memory_mb` minus this.
const NODE_BASE_MB: u64 = 48;
/// Smallest JS heap given to Node.js, MiB.
const NODE_MIN_HEAP_MB: u64 = 16;
/// Time to wait for a killed sandbox to be reaped.
const REAP_WAIT: Duration = Duration::from_secs(5);

/// Host paths the shared libraries live in; each is bound read-only (or
/// recreated as the same symlink) when it exists.
const LIBRARY_DIRS: &[&str] = &[
    "/lib",
    "/lib64",
    "/lib32",
    "/libx32",
    "/usr/lib",
    "/usr/lib64",
    "/usr/lib32",
    "/usr/libx32",
];

static JS_HARNESS: &str = include_str!("sandbox/harness.js");
static PY_HARNESS: &str = include_str!("sandbox/harness.py");

/// Settings of the sandbox (`belay-worker --sandbox-*` flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxConfig {
    /// The bubblewrap executable (`--sandbox-bwrap`); default `bwrap`, found
    /// on `PATH`.
    pub bwrap: PathBuf,
    /// util-linux's `prlimit` (`--sandbox-prlimit`); default `prlimit`.
    pub prlimit: PathBuf,
    /// Node.js for `runtime: javascript` (`--sandbox-node`); default `node`.
    pub node: PathBuf,
    /// CPython 3 for `runtime: python` (`--sandbox-python`); default
    /// `python3`.
    pub python: PathBuf,
    /// Wall-clock limit of a call whose tool has no `timeout:`, ms
    /// (`--sandbox-timeout-ms`). Default [`DEFAULT_SANDBOX_TIMEOUT_MS`].
    pub default_timeout_ms: u64,
    /// Memory limit of a call whose tool has no `memory_mb:`, MiB
    /// (`--sandbox-memory-mb`). Default [`DEFAULT_SANDBOX_MEMORY_MB`].
    pub default_memory_mb: u64,
    /// More host paths bound read-only into every sandbox, at the same
    /// place (`--sandbox-ro-bind`, repeatable): for a runtime installed
    /// with files outside its executable, the system's libraries and
    /// Python's `<prefix>/lib`.
    pub extra_ro_binds: Vec<PathBuf>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            bwrap: PathBuf::from("bwrap"),
            prlimit: PathBuf::from("prlimit"),
            node: PathBuf::from("node"),
            python: PathBuf::from("python3"),
            default_timeout_ms: DEFAULT_SANDBOX_TIMEOUT_MS,
            default_memory_mb: DEFAULT_SANDBOX_MEMORY_MB,
            extra_ro_binds: Vec::new(),
        }
    }
}

/// The `belay-worker` flags of the sandbox (flattened into its arguments).
#[derive(Debug, Clone, clap::Args)]
pub struct SandboxArgs {
    /// bubblewrap executable that isolates `type: sandbox` tools (Debian
    /// package `bubblewrap`).
    #[arg(long, env = "BELAY_SANDBOX_BWRAP", default_value = "bwrap")]
    pub sandbox_bwrap: PathBuf,
    /// util-linux `prlimit`, which sets a sandbox's memory and CPU limits.
    #[arg(long, env = "BELAY_SANDBOX_PRLIMIT", default_value = "prlimit")]
    pub sandbox_prlimit: PathBuf,
    /// Node.js for `runtime: javascript` tools.
    #[arg(long, env = "BELAY_SANDBOX_NODE", default_value = "node")]
    pub sandbox_node: PathBuf,
    /// CPython 3 for `runtime: python` tools.
    #[arg(long, env = "BELAY_SANDBOX_PYTHON", default_value = "python3")]
    pub sandbox_python: PathBuf,
    /// Wall-clock limit of a sandbox tool without `timeout:`, in ms.
    #[arg(long, env = "BELAY_SANDBOX_TIMEOUT_MS", default_value_t = DEFAULT_SANDBOX_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub sandbox_timeout_ms: u64,
    /// Memory limit of a sandbox tool without `memory_mb:`, in MiB.
    #[arg(long, env = "BELAY_SANDBOX_MEMORY_MB", default_value_t = DEFAULT_SANDBOX_MEMORY_MB,
          value_parser = clap::value_parser!(u64).range(64..=16_384))]
    pub sandbox_memory_mb: u64,
    /// More host paths bound read-only into every sandbox (repeatable, or
    /// comma-separated): for a runtime with files outside its executable,
    /// the system's library directories and Python's `<prefix>/lib`.
    #[arg(
        long = "sandbox-ro-bind",
        env = "BELAY_SANDBOX_RO_BINDS",
        value_delimiter = ',',
        value_parser = existing_absolute_path
    )]
    pub sandbox_ro_binds: Vec<PathBuf>,
}

/// A `--sandbox-ro-bind` path: absolute, and there when the worker starts
/// (bwrap would fail every call on a missing one, naming only itself).
///
/// # Errors
/// A message naming the path: empty, relative, or not found.
pub fn existing_absolute_path(s: &str) -> Result<PathBuf, String> {
    if s.is_empty() {
        return Err(
            "an empty path (leave the flag or BELAY_SANDBOX_RO_BINDS out to bind nothing more)"
                .into(),
        );
    }
    let path = PathBuf::from(s);
    if !path.is_absolute() {
        return Err(format!("`{s}` is not an absolute path"));
    }
    match std::fs::metadata(&path) {
        Ok(_) => Ok(path),
        Err(e) => Err(format!("`{s}` cannot be bound: {e}")),
    }
}

impl SandboxArgs {
    /// The [`SandboxConfig`] these flags give.
    pub fn into_config(self) -> SandboxConfig {
        SandboxConfig {
            bwrap: self.sandbox_bwrap,
            prlimit: self.sandbox_prlimit,
            node: self.sandbox_node,
            python: self.sandbox_python,
            default_timeout_ms: self.sandbox_timeout_ms,
            default_memory_mb: self.sandbox_memory_mb,
            extra_ro_binds: self.sandbox_ro_binds,
        }
    }
}

/// Why a sandbox call failed. Each message names what happened.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SandboxError {
    /// The runtime (or bwrap) is not usable on this worker; nothing ran.
    #[error("the {runtime} sandbox is not available on this worker: {reason}")]
    Unavailable {
        /// `javascript` or `python`.
        runtime: &'static str,
        /// What is missing.
        reason: String,
    },
    /// The sandbox could not be set up (bwrap failed before the code ran).
    #[error("the sandbox could not be set up ({status}): {stderr}")]
    Setup {
        /// Exit status, as text.
        status: String,
        /// The end of bwrap's stderr.
        stderr: String,
    },
    /// The code does not parse.
    #[error("the code has a syntax error: {message}\n{trace}")]
    Syntax {
        /// The parser's message.
        message: String,
        /// Where (file `tool.js` / `tool.py`, line, caret).
        trace: String,
    },
    /// The code threw (raised) an exception.
    #[error("the code threw {name}: {message}\n{trace}")]
    Exception {
        /// The exception's type (`TypeError`, `KeyError`, ...).
        name: String,
        /// Its message.
        message: String,
        /// The stack, bounded.
        trace: String,
    },
    /// The code ran longer than its timeout and was killed.
    #[error("the code ran longer than its timeout of {timeout_ms} ms and was killed")]
    Timeout {
        /// The limit, ms.
        timeout_ms: u64,
    },
    /// The code needed more memory than `memory_mb` allows.
    #[error("the code exceeded its memory limit of {memory_mb} MiB ({detail})")]
    Memory {
        /// The limit, MiB.
        memory_mb: u64,
        /// What the runtime said.
        detail: String,
    },
    /// The code returned nothing, or something that is not JSON.
    #[error("the code's result is not a JSON value: {0}")]
    Result(String),
    /// The process ended without a result (a crash, a signal, `exit()`).
    #[error("the sandbox process ended without a result ({status}); stderr: {stderr}")]
    Crashed {
        /// Exit status or signal, as text.
        status: String,
        /// The end of its stderr.
        stderr: String,
    },
}

impl SandboxError {
    /// The failure class reported to the engine: `NOT_SENT` when nothing
    /// ran, else `REJECTED` (the code would fail the same way again).
    pub fn class(&self) -> FailureClass {
        match self {
            SandboxError::Unavailable { .. } | SandboxError::Setup { .. } => FailureClass::NotSent,
            _ => FailureClass::Rejected,
        }
    }
}

/// A runtime found on this worker: its real executable and what must be
/// bound for it to start.
#[derive(Debug, Clone)]
struct Runtime {
    exe: PathBuf,
    binds: Vec<PathBuf>,
}

/// Runs sandbox tools. Built once per worker ([`SandboxTools::start`]);
/// cheap to share.
#[derive(Debug)]
pub struct SandboxTools {
    config: SandboxConfig,
    bwrap: Result<PathBuf, String>,
    prlimit: Result<PathBuf, String>,
    node: Result<Runtime, String>,
    python: Result<Runtime, String>,
    /// `--symlink`/`--ro-bind` arguments of the library directories.
    library_args: Vec<String>,
}

impl SandboxTools {
    /// Finds bwrap, prlimit and the two runtimes (asking each runtime for
    /// its real executable, so a launcher like a pyenv shim is looked
    /// through). One that is missing is logged (at info: a warning comes
    /// only when a call needs it), and the tools that need it fail
    /// `NOT_SENT` naming it; the worker runs on.
    pub async fn start(config: SandboxConfig) -> Self {
        let bwrap = find_program(&config.bwrap);
        let prlimit = find_program(&config.prlimit);
        let node = resolve_runtime(&config.node, SandboxRuntime::Javascript).await;
        let python = resolve_runtime(&config.python, SandboxRuntime::Python).await;
        for (what, missing) in [
            ("bwrap", bwrap.as_ref().err()),
            ("prlimit", prlimit.as_ref().err()),
            ("node", node.as_ref().err()),
            ("python", python.as_ref().err()),
        ] {
            // Not a warning: most workers run no sandbox tool. A call of
            // one that cannot run here warns (`run`).
            if let Some(reason) = missing {
                tracing::info!(what, %reason, "sandbox tools that need it cannot run on this worker");
            }
        }
        Self {
            library_args: library_args(),
            config,
            bwrap,
            prlimit,
            node,
            python,
        }
    }

    /// The runtimes this worker can run (each found, with bwrap and
    /// prlimit): what it tells the engine it has.
    pub fn runtimes(&self) -> Vec<SandboxRuntime> {
        [SandboxRuntime::Javascript, SandboxRuntime::Python]
            .into_iter()
            .filter(|r| {
                self.check(&SandboxBinding {
                    runtime: *r,
                    code: String::new(),
                    params: Vec::new(),
                    timeout_ms: None,
                    memory_mb: None,
                })
                .is_ok()
            })
            .collect()
    }

    /// Whether this worker can run `binding` (its runtime, bwrap and
    /// prlimit were found), checked before dispatch.
    pub fn check(&self, binding: &SandboxBinding) -> Result<(), SandboxError> {
        let runtime = binding.runtime.as_str();
        let missing = match binding.runtime {
            SandboxRuntime::Javascript => self.node.as_ref().err(),
            SandboxRuntime::Python => self.python.as_ref().err(),
        }
        .or(self.bwrap.as_ref().err())
        .or(self.prlimit.as_ref().err());
        match missing {
            None => Ok(()),
            Some(reason) => Err(SandboxError::Unavailable {
                runtime,
                reason: reason.clone(),
            }),
        }
    }

    /// Runs `binding`'s code with `arguments` (a JSON object) and returns
    /// its result.
    pub async fn run(
        &self,
        binding: &SandboxBinding,
        arguments: &Value,
    ) -> Result<Value, SandboxError> {
        let name = binding.runtime.as_str();
        let unavailable = |reason: &String| {
            tracing::warn!(runtime = name, %reason, "a sandbox tool was called but cannot run on this worker");
            SandboxError::Unavailable {
                runtime: name,
                reason: reason.clone(),
            }
        };
        let runtime = match binding.runtime {
            SandboxRuntime::Javascript => &self.node,
            SandboxRuntime::Python => &self.python,
        }
        .as_ref()
        .map_err(unavailable)?;
        let bwrap = self.bwrap.as_ref().map_err(unavailable)?;
        let prlimit = self.prlimit.as_ref().map_err(unavailable)?;
        let timeout_ms = binding
            .timeout_ms
            .unwrap_or(self.config.default_timeout_ms)
            .max(1);
        let memory_mb = binding
            .memory_mb
            .unwrap_or(self.config.default_memory_mb)
            .max(1);
        let memory_bytes = memory_mb.saturating_mul(1024 * 1024);

        let mut cmd = Command::new(prlimit);
        cmd.arg(format!("--data={memory_bytes}"));
        if binding.runtime == SandboxRuntime::Python {
            cmd.arg(format!("--as={memory_bytes}"));
        }
        cmd.arg(format!("--cpu={}", timeout_ms.div_ceil(1000) + 1))
            .arg("--core=0")
            .arg("--nofile=256")
            .arg("--")
            .arg(bwrap);
        cmd.args([
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--uid",
            "65534",
            "--gid",
            "65534",
            "--hostname",
            "sandbox",
            "--clearenv",
            "--setenv",
            "HOME",
            "/sandbox",
            "--setenv",
            "TMPDIR",
            "/sandbox",
            "--setenv",
            "LANG",
            "C.UTF-8",
        ]);
        cmd.args(&self.library_args);
        let mut bound = vec![runtime.exe.clone()];
        bound.extend(runtime.binds.iter().cloned());
        bound.extend(self.config.extra_ro_binds.iter().cloned());
        for path in &bound {
            cmd.arg("--ro-bind-try").arg(path).arg(path);
        }
        cmd.args(["--dev", "/dev", "--size"])
            .arg(memory_bytes.to_string())
            .args(["--tmpfs", "/sandbox", "--chdir", "/sandbox", "--"])
            .arg(&runtime.exe);
        match binding.runtime {
            SandboxRuntime::Javascript => {
                let heap = memory_mb.saturating_sub(NODE_BASE_MB).max(NODE_MIN_HEAP_MB);
                cmd.arg(format!("--max-old-space-size={heap}"))
                    .arg("-e")
                    .arg(JS_HARNESS);
            }
            SandboxRuntime::Python => {
                cmd.args(["-I", "-S", "-B", "-c"]).arg(PY_HARNESS);
            }
        }
        cmd.env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let input = serde_json::json!({
            "code": binding.code,
            "params": binding.params,
            "args": arguments,
        })
        .to_string();

        let started = Instant::now();
        let mut child = cmd.spawn().map_err(|e| SandboxError::Unavailable {
            runtime: name,
            reason: format!("cannot start {}: {e}", prlimit.display()),
        })?;
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(SandboxError::Unavailable {
                runtime: name,
                reason: "the sandbox process has no pipes".into(),
            });
        };
        let write = async move {
            // A code that never reads stdin closes it early: not an error.
            let _ = stdin.write_all(input.as_bytes()).await;
            drop(stdin);
        };
        let outcome = tokio::time::timeout(Duration::from_millis(timeout_ms), async {
            let ((), out, err, status) = tokio::join!(
                write,
                read_head(stdout, MAX_RESULT_BYTES),
                read_ends(stderr, STDERR_TAIL_BYTES),
                child.wait()
            );
            (out, err, status)
        })
        .await;
        let (out, err, status) = match outcome {
            Ok(done) => done,
            Err(_) => {
                let _ = child.start_kill();
                let _ = tokio::time::timeout(REAP_WAIT, child.wait()).await;
                tracing::info!(
                    runtime = name,
                    timeout_ms,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "sandbox call killed at its timeout"
                );
                return Err(SandboxError::Timeout { timeout_ms });
            }
        };
        let status = status.map_err(|e| SandboxError::Crashed {
            status: format!("cannot wait for the process: {e}"),
            stderr: String::new(),
        })?;
        let (stdout, too_long) = out;
        let stderr = Stderr {
            head: String::from_utf8_lossy(&err.0).into_owned(),
            tail: String::from_utf8_lossy(&err.1).into_owned(),
        };
        tracing::debug!(
            runtime = name,
            elapsed_ms = started.elapsed().as_millis() as u64,
            %status,
            "sandbox call ended"
        );
        if too_long {
            return Err(SandboxError::Result(format!(
                "it is larger than {MAX_RESULT_BYTES} bytes"
            )));
        }
        interpret(&stdout, status, stderr, memory_mb)
    }
}

/// What the harness writes.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Report {
    Ok(Value),
    Error(ReportedError),
}

#[derive(Deserialize)]
struct ReportedError {
    kind: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    trace: String,
}

/// The start and the end of what a sandbox wrote to stderr (the same text
/// when it is short).
struct Stderr {
    head: String,
    tail: String,
}

impl Stderr {
    /// The line of the runtime's own message about running out of memory.
    fn oom_line(&self) -> Option<&str> {
        self.head
            .lines()
            .chain(self.tail.lines())
            .find(|l| OOM_MARKERS.iter().any(|m| l.contains(m)))
    }
}

/// What Node.js (V8) and Python write to stderr when they run out of
/// memory (`std::bad_alloc` when Node's own C++ allocation fails).
const OOM_MARKERS: &[&str] = &["out of memory", "MemoryError", "bad_alloc"];

/// Turns the process's output and status into the call's outcome.
fn interpret(
    stdout: &[u8],
    status: std::process::ExitStatus,
    stderr: Stderr,
    memory_mb: u64,
) -> Result<Value, SandboxError> {
    let last_line = stdout
        .split(|b| *b == b'\n')
        .rev()
        .find(|l| !l.iter().all(u8::is_ascii_whitespace));
    let report = last_line.and_then(|l| serde_json::from_slice::<Report>(l).ok());
    let status_text = describe_status(status);
    match report {
        Some(Report::Ok(value)) if status.success() => Ok(value),
        Some(Report::Error(e)) => {
            let trace = truncate(&e.trace, MAX_TRACE_BYTES);
            // Python's MemoryError; an allocation refused by the limits
            // (V8's "Array buffer allocation failed", ENOMEM from mmap).
            let out_of_memory = e.name == "MemoryError"
                || (e.name == "RangeError" && e.message.contains("allocation failed"))
                || e.message.contains("Cannot allocate memory");
            match e.kind.as_str() {
                _ if out_of_memory => Err(SandboxError::Memory {
                    memory_mb,
                    detail: if e.message.is_empty() {
                        e.name
                    } else {
                        format!("{}: {}", e.name, e.message)
                    },
                }),
                "syntax" => Err(SandboxError::Syntax {
                    message: e.message,
                    trace,
                }),
                "exception" => Err(SandboxError::Exception {
                    name: e.name,
                    message: e.message,
                    trace,
                }),
                "result" => Err(SandboxError::Result(format!("{}: {}", e.name, e.message))),
                _ => Err(SandboxError::Crashed {
                    status: format!("the harness failed: {}: {}", e.name, e.message),
                    stderr: tail(&stderr.tail),
                }),
            }
        }
        _ if stderr.oom_line().is_some() => Err(SandboxError::Memory {
            memory_mb,
            detail: format!(
                "{status_text}; {}",
                truncate(
                    stderr.oom_line().unwrap_or_default().trim(),
                    MAX_TRACE_BYTES
                )
            ),
        }),
        // bwrap's own messages start `bwrap:`: the code never ran.
        _ if !status.success() && stderr.head.starts_with("bwrap:") => Err(SandboxError::Setup {
            status: status_text,
            stderr: tail(&stderr.tail),
        }),
        _ if status.success() && last_line.is_some() => Err(SandboxError::Result(format!(
            "the sandbox wrote `{}` where its result belongs",
            String::from_utf8_lossy(last_line.unwrap_or_default())
                .chars()
                .take(200)
                .collect::<String>()
        ))),
        _ => Err(SandboxError::Crashed {
            status: status_text,
            stderr: tail(&stderr.tail),
        }),
    }
}

fn describe_status(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => status.to_string(),
    }
}

/// The last [`STDERR_TAIL_BYTES`] of `text`, on a character boundary.
fn tail(text: &str) -> String {
    let mut start = text.len().saturating_sub(STDERR_TAIL_BYTES);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_string()
}

/// The first `max` bytes of `text`, on a character boundary.
fn truncate(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Reads `reader` to its end, keeping the first `max` bytes; `true` when
/// there was more.
async fn read_head(mut reader: impl AsyncRead + Unpin, max: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut more = false;
    let mut buf = [0u8; 8192];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = max.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                more |= n > room;
            }
        }
    }
    (kept, more)
}

/// Reads `reader` to its end, keeping the first and the last `max` bytes
/// (at most three times that in memory).
async fn read_ends(mut reader: impl AsyncRead + Unpin, max: usize) -> (Vec<u8>, Vec<u8>) {
    let mut head = Vec::new();
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = max.saturating_sub(head.len());
                head.extend_from_slice(&buf[..n.min(room)]);
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > 2 * max {
                    kept.drain(..kept.len() - max);
                }
            }
        }
    }
    if kept.len() > max {
        kept.drain(..kept.len() - max);
    }
    (head, kept)
}

/// `program` as an absolute path: as given when it has a `/`, else the
/// first match on `PATH`.
fn find_program(program: &Path) -> Result<PathBuf, String> {
    if program.components().count() > 1 {
        return if program.is_file() {
            Ok(program.to_path_buf())
        } else {
            Err(format!("{} does not exist", program.display()))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| format!("`{}` is not on PATH", program.display()))
}

/// Asks the runtime for its real executable (and Python for its
/// `base_prefix`, whose `lib` holds the standard library).
async fn resolve_runtime(program: &Path, runtime: SandboxRuntime) -> Result<Runtime, String> {
    let found = find_program(program)?;
    let mut cmd = Command::new(&found);
    match runtime {
        SandboxRuntime::Javascript => cmd.args(["-p", "process.execPath"]),
        SandboxRuntime::Python => cmd.args([
            "-I",
            "-S",
            "-c",
            "import sys; print(sys.executable); print(sys.base_prefix)",
        ]),
    };
    cmd.stdin(Stdio::null()).kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(10), cmd.output())
        .await
        .map_err(|_| format!("{} did not answer within 10 s", found.display()))?
        .map_err(|e| format!("cannot run {}: {e}", found.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} failed ({}): {}",
            found.display(),
            describe_status(output.status),
            tail(&String::from_utf8_lossy(&output.stderr))
        ));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut lines = text.lines();
    let exe = lines
        .next()
        .filter(|l| !l.is_empty())
        .ok_or_else(|| format!("{} did not name its executable", found.display()))?;
    let exe = std::fs::canonicalize(exe).map_err(|e| format!("{exe}: {e}"))?;
    let mut binds = Vec::new();
    if let Some(prefix) = lines.next().filter(|l| !l.is_empty()) {
        let lib = Path::new(prefix).join("lib");
        if lib.is_dir() && !LIBRARY_DIRS.iter().any(|d| Path::new(d) == lib) {
            binds.push(lib);
        }
    }
    Ok(Runtime { exe, binds })
}

/// bwrap arguments that give the sandbox the host's library directories:
/// a symlink as the same symlink (`/lib -> usr/lib`), a directory bound
/// read-only.
fn library_args() -> Vec<String> {
    let mut args = Vec::new();
    for dir in LIBRARY_DIRS {
        let path = Path::new(dir);
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            if let Ok(target) = std::fs::read_link(path) {
                args.push("--symlink".into());
                args.push(target.to_string_lossy().into_owned());
                args.push((*dir).to_string());
            }
        } else if meta.is_dir() {
            args.push("--ro-bind".into());
            args.push((*dir).to_string());
            args.push((*dir).to_string());
        }
    }
    args
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn tails_and_heads_cut_on_character_boundaries() {
        let text = format!("{}é", "a".repeat(STDERR_TAIL_BYTES));
        let t = tail(&text);
        assert!(t.len() <= STDERR_TAIL_BYTES && t.ends_with('é'));
        assert_eq!(truncate("aé", 2), "a");
    }
}
