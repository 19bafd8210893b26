//! `type: sandbox` tools run by real Node.js and CPython under bubblewrap
//! (`belay_worker::sandbox_tool`): the seed's examples, argument binding,
//! the isolation (network, files, environment, a fresh working directory
//! per call), the limits (timeout, memory) and every typed error.
//!
//! Needs `bwrap`, `prlimit`, `node` and `python3`: `.ci/sandbox-tools.sh`
//! installs bubblewrap when it is missing (the tests run it themselves).
#![allow(missing_docs, clippy::unwrap_used)]

use std::io::Write as _;
use std::time::{Duration, Instant};

use belay_proto::v1::FailureClass;
use belay_proto::wire::{SandboxBinding, SandboxRuntime};
use belay_worker::sandbox_tool::{STDERR_TAIL_BYTES, SandboxConfig, SandboxError, SandboxTools};
use serde_json::{Value, json};

use SandboxRuntime::{Javascript as Js, Python as Py};

/// `bwrap` is there: installed by `.ci/sandbox-tools.sh` (once per test
/// binary) when it is missing, so the README's test command works on a
/// fresh machine; panics at once, naming what is missing, otherwise.
fn require_bwrap() {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let found = || {
        std::process::Command::new("bwrap")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let result = DONE.get_or_init(|| {
        if found() {
            return Ok(());
        }
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/sandbox-tools.sh");
        let status = std::process::Command::new("bash")
            .arg(&script)
            .stdout(std::process::Stdio::null())
            .status()
            .map_err(|e| format!("running {}: {e}", script.display()))?;
        if status.success() && found() {
            return Ok(());
        }
        Err(format!(
            "bwrap (Debian package bubblewrap) is not installed and {} could not install it ({status}); \
             install it with `apt-get install -y bubblewrap`",
            script.display()
        ))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

async fn tools() -> SandboxTools {
    require_bwrap();
    let tools = SandboxTools::start(SandboxConfig::default()).await;
    for runtime in [Js, Py] {
        tools
            .check(&binding(runtime, "", &[]))
            .expect("bwrap, prlimit, node and python3 are installed");
    }
    tools
}

fn binding(runtime: SandboxRuntime, code: &str, params: &[&str]) -> SandboxBinding {
    SandboxBinding {
        runtime,
        code: code.to_owned(),
        params: params.iter().map(|p| (*p).to_owned()).collect(),
        timeout_ms: Some(10_000),
        memory_mb: Some(128),
    }
}

async fn run(
    tools: &SandboxTools,
    runtime: SandboxRuntime,
    code: &str,
    params: &[&str],
    args: Value,
) -> Result<Value, SandboxError> {
    tools.run(&binding(runtime, code, params), &args).await
}

#[tokio::test]
async fn the_seeds_examples_return_the_declared_results() {
    let tools = tools().await;
    let tax = "const rates = { CA: 0.133, NY: 0.109, TX: 0 };\nconst rate = rates[state] || 0.05;\nreturn { tax: income * rate, rate };\n";
    assert_eq!(
        run(
            &tools,
            Js,
            tax,
            &["income", "state"],
            json!({"income": 1000, "state": "NY"})
        )
        .await
        .unwrap(),
        json!({"tax": 109, "rate": 0.109})
    );
    assert_eq!(
        run(
            &tools,
            Js,
            tax,
            &["income", "state"],
            json!({"income": 1000, "state": "WA"})
        )
        .await
        .unwrap(),
        json!({"tax": 50, "rate": 0.05})
    );
    let currency = "const formatter = new Intl.NumberFormat('en-US', {\n  style: 'currency',\n  currency: currency\n});\nreturn { formatted: formatter.format(amount) };\n";
    assert_eq!(
        run(
            &tools,
            Js,
            currency,
            &["amount", "currency"],
            json!({"amount": 1234.5, "currency": "EUR"})
        )
        .await
        .unwrap(),
        json!({"formatted": "€1,234.50"})
    );
    let analyze = "import re\nwords = len(text.split())\nsentences = len(re.split(r'[.!?]+', text))\nreturn {\"word_count\": words, \"sentences\": sentences}\n";
    assert_eq!(
        run(
            &tools,
            Py,
            analyze,
            &["text"],
            json!({"text": "One two three. Four five"})
        )
        .await
        .unwrap(),
        json!({"word_count": 5, "sentences": 2})
    );
}

#[tokio::test]
async fn arguments_are_bound_by_name_and_prints_do_not_disturb_the_result() {
    let tools = tools().await;
    // An optional parameter the call leaves out is `undefined` / `None`.
    let js = "console.log('noise'); process.stdout.write('more noise\\n');\nreturn { a: a * 2, b: b.toUpperCase(), missing: c === undefined, nested: n.x[1] };";
    assert_eq!(
        run(
            &tools,
            Js,
            js,
            &["a", "b", "c", "n"],
            json!({"b": "hi", "a": 21, "n": {"x": [1, 2]}})
        )
        .await
        .unwrap(),
        json!({"a": 42, "b": "HI", "missing": true, "nested": 2})
    );
    let py = "print('noise')\nreturn {'a': a * 2, 'b': b.upper(), 'missing': c is None, 'nested': n['x'][1]}";
    assert_eq!(
        run(
            &tools,
            Py,
            py,
            &["a", "b", "c", "n"],
            json!({"b": "hi", "a": 21, "n": {"x": [1, 2]}})
        )
        .await
        .unwrap(),
        json!({"a": 42, "b": "HI", "missing": true, "nested": 2})
    );
    // An async function's promise is awaited.
    assert_eq!(
        run(
            &tools,
            Js,
            "await new Promise(r => setTimeout(r, 10));\nreturn [x];",
            &["x"],
            json!({"x": "late"})
        )
        .await
        .unwrap(),
        json!(["late"])
    );
}

/// The first connection `listener` accepts is the test's own: nothing
/// from the sandbox reached it before.
fn assert_no_connection_reached(listener: &std::net::TcpListener) {
    let ours = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (_, peer) = listener.accept().unwrap();
    assert_eq!(
        peer,
        ours.local_addr().unwrap(),
        "the sandbox reached the listener"
    );
}

#[tokio::test]
async fn the_network_is_unreachable() {
    let tools = tools().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let js = "const net = require('net');\nreturn await new Promise((resolve) => {\n  const s = net.connect(port, '127.0.0.1');\n  s.on('connect', () => resolve('connected'));\n  s.on('error', (e) => resolve(e.code));\n});";
    let code = run(&tools, Js, js, &["port"], json!({"port": port}))
        .await
        .unwrap();
    assert_eq!(code, json!("ECONNREFUSED"));
    let py = "import socket\ntry:\n    socket.create_connection(('127.0.0.1', port), timeout=5)\n    return 'connected'\nexcept OSError as e:\n    return type(e).__name__";
    let code = run(&tools, Py, py, &["port"], json!({"port": port}))
        .await
        .unwrap();
    assert_eq!(code, json!("ConnectionRefusedError"));
    // No name resolution and no route out either.
    let py = "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 443), timeout=5)\n    return 'connected'\nexcept OSError as e:\n    return e.errno";
    let errno = run(&tools, Py, py, &[], json!({})).await.unwrap();
    assert_eq!(errno, json!(101), "ENETUNREACH");
    assert_no_connection_reached(&listener);
}

#[tokio::test]
async fn files_outside_the_working_directory_cannot_be_read() {
    let tools = tools().await;
    let dir = std::env::temp_dir().join(format!("belay-sandbox-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("secret.txt");
    std::fs::File::create(&secret)
        .unwrap()
        .write_all(b"the worker's secret")
        .unwrap();
    let path = secret.to_str().unwrap();
    for target in [path, "/etc/hostname", "/etc/passwd", "/proc/self/environ"] {
        let err = run(
            &tools,
            Py,
            "return open(p).read()",
            &["p"],
            json!({"p": target}),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&err, SandboxError::Exception { name, .. } if name == "FileNotFoundError"),
            "{target}: {err}"
        );
        let js = "return require('fs').readFileSync(p, 'utf8');";
        let err = run(&tools, Js, js, &["p"], json!({"p": target}))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, SandboxError::Exception { message, .. } if message.contains("ENOENT")),
            "{target}: {err}"
        );
    }
    // What the sandbox sees: the runtime's files, `/dev` and its working
    // directory; nothing of the host's `/etc`, `/tmp`, `/root` or `/home`.
    let listing = run(
        &tools,
        Js,
        "return require('fs').readdirSync('/').sort();",
        &[],
        json!({}),
    )
    .await
    .unwrap();
    for absent in ["etc", "tmp", "home", "proc", "var"] {
        assert!(
            !listing.as_array().unwrap().contains(&json!(absent)),
            "{listing}"
        );
    }
    // The runtime's files are read-only.
    let err = run(&tools, Py, "open('/usr/lib/x', 'w')", &[], json!({}))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, SandboxError::Exception { name, .. } if name == "OSError"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn the_working_directory_is_writable_and_fresh_for_every_call() {
    let tools = tools().await;
    let py = "import os\nbefore = sorted(os.listdir('.'))\nwith open('state.txt', 'w') as f:\n    f.write(v)\nwith open(os.path.join(os.environ['TMPDIR'], 't'), 'w') as f:\n    f.write(v)\nreturn {'cwd': os.getcwd(), 'before': before, 'read': open('state.txt').read()}";
    for v in ["first", "second"] {
        assert_eq!(
            run(&tools, Py, py, &["v"], json!({"v": v})).await.unwrap(),
            json!({"cwd": "/sandbox", "before": [], "read": v})
        );
    }
    let js = "const fs = require('fs');\nconst before = fs.readdirSync('.');\nfs.writeFileSync('state.txt', 'x');\nreturn before;";
    for _ in 0..2 {
        assert_eq!(
            run(&tools, Js, js, &[], json!({})).await.unwrap(),
            json!([])
        );
    }
}

#[tokio::test]
async fn the_workers_environment_is_not_visible() {
    let tools = tools().await;
    // Cargo sets this for every test process, so the worker has it.
    let marker = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    assert!(!marker.is_empty());
    let env = run(
        &tools,
        Py,
        "import os\nreturn dict(os.environ)",
        &[],
        json!({}),
    )
    .await
    .unwrap();
    let keys: Vec<&String> = env.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["HOME", "LANG", "PWD", "TMPDIR"], "{env}");
    assert!(!env.to_string().contains(&marker));
    let env = run(&tools, Js, "return process.env;", &[], json!({}))
        .await
        .unwrap();
    assert!(env.get("CARGO_MANIFEST_DIR").is_none() && !env.to_string().contains(&marker));
    assert_eq!(env["HOME"], "/sandbox");
    // No capabilities and not root.
    let uid = run(&tools, Py, "import os\nreturn os.getuid()", &[], json!({}))
        .await
        .unwrap();
    assert_eq!(uid, json!(65534));
}

#[tokio::test]
async fn an_endless_loop_is_killed_at_the_timeout() {
    let tools = tools().await;
    for (runtime, code) in [(Js, "while (true) {}"), (Py, "while True:\n    pass")] {
        let mut b = binding(runtime, code, &[]);
        b.timeout_ms = Some(1_000);
        let started = Instant::now();
        let err = tools.run(&b, &json!({})).await.unwrap_err();
        let took = started.elapsed();
        assert_eq!(err, SandboxError::Timeout { timeout_ms: 1_000 });
        assert_eq!(err.class(), FailureClass::Rejected);
        assert!(
            took >= Duration::from_millis(1_000) && took < Duration::from_secs(5),
            "{took:?}"
        );
        assert!(
            err.to_string()
                .contains("longer than its timeout of 1000 ms")
        );
    }
}

#[tokio::test]
async fn a_memory_hog_is_stopped_at_memory_mb() {
    let tools = tools().await;
    let hogs = [
        (
            Js,
            "const a = []; while (true) a.push(new Array(100000).fill(1.5));",
        ),
        (
            Js,
            "const a = []; while (true) a.push(Buffer.alloc(10 * 1024 * 1024, 1));",
        ),
        (
            Py,
            "a = []\nwhile True:\n    a.append(bytearray(10 * 1024 * 1024))",
        ),
        // Shared memory is not data: RLIMIT_AS stops it.
        (
            Py,
            "import mmap\nm = mmap.mmap(-1, 1024 * 1024 * 1024)\nm.write(b'x' * (1024 * 1024 * 1024))",
        ),
    ];
    for (runtime, code) in hogs {
        let mut b = binding(runtime, code, &[]);
        b.memory_mb = Some(128);
        b.timeout_ms = Some(30_000);
        let started = Instant::now();
        let err = tools.run(&b, &json!({})).await.unwrap_err();
        assert!(
            matches!(err, SandboxError::Memory { memory_mb: 128, .. }),
            "{code}: {err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(25),
            "stopped by memory, not time"
        );
        eprintln!("{code}: {err} after {:?}", started.elapsed());
        assert!(
            err.to_string()
                .starts_with("the code exceeded its memory limit of 128 MiB")
        );
    }
    // The same amount fits in a larger limit.
    let mut b = binding(Py, "a = bytearray(200 * 1024 * 1024)\nreturn len(a)", &[]);
    b.memory_mb = Some(512);
    assert_eq!(
        tools.run(&b, &json!({})).await.unwrap(),
        json!(200 * 1024 * 1024)
    );
    b.memory_mb = Some(128);
    assert!(matches!(
        tools.run(&b, &json!({})).await,
        Err(SandboxError::Memory { .. })
    ));
}

#[tokio::test]
async fn every_failure_is_a_typed_error_and_the_next_call_runs() {
    let tools = tools().await;
    let err = run(&tools, Js, "const x = ;\nreturn 1;", &[], json!({}))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, SandboxError::Syntax { message, trace } if message == "Unexpected token ';'" && trace.starts_with("tool.js:1\n")),
        "{err}"
    );
    let err = run(&tools, Py, "x = 1\nreturn (", &[], json!({}))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, SandboxError::Syntax { message, trace } if message.contains("line 2") && trace.contains("tool.py")),
        "{err}"
    );
    let err = run(
        &tools,
        Js,
        "\nthrow new TypeError('bad ' + x);",
        &["x"],
        json!({"x": 1}),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, SandboxError::Exception { name, message, trace } if name == "TypeError" && message == "bad 1" && trace.contains("tool.js:2") && !trace.contains("[eval]")),
        "{err}"
    );
    let err = run(&tools, Js, "throw 'plain';", &[], json!({}))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, SandboxError::Exception { name, message, .. } if name == "string" && message == "plain")
    );
    let err = run(&tools, Py, "return {}['k']", &[], json!({}))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, SandboxError::Exception { name, trace, .. } if name == "KeyError" && trace.contains("tool.py\", line 1") && !trace.contains("_main")),
        "{err}"
    );
    assert_eq!(err.class(), FailureClass::Rejected);
    // Results that are not JSON values.
    for (runtime, code) in [
        (Js, "const x = 1;"),
        (Js, "return 10n;"),
        (Js, "const a = {}; a.a = a; return a;"),
        (Py, "x = 1"),
        (Py, "return {1, 2}"),
        (Py, "return float('nan')"),
    ] {
        let err = run(&tools, runtime, code, &[], json!({}))
            .await
            .unwrap_err();
        assert!(matches!(err, SandboxError::Result(_)), "{code}: {err}");
        assert_eq!(err.class(), FailureClass::Rejected);
    }
    // Output where the result belongs.
    let err = run(
        &tools,
        Py,
        "import os\nos.write(1, b'hello\\n')\nos._exit(0)",
        &[],
        json!({}),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err,
        SandboxError::Result("the sandbox wrote `hello` where its result belongs".into())
    );
    // An exit without a result, with a long stderr: its tail is kept.
    let py = "import os, sys\nsys.stderr.write('x' * 100000 + 'THE END')\nsys.stderr.flush()\nos._exit(3)";
    let err = run(&tools, Py, py, &[], json!({})).await.unwrap_err();
    match &err {
        SandboxError::Crashed { status, stderr } => {
            assert_eq!(status, "exit status 3");
            assert!(
                stderr.len() <= STDERR_TAIL_BYTES && stderr.ends_with("THE END"),
                "{} bytes: {}",
                stderr.len(),
                &stderr[stderr.len().saturating_sub(100)..]
            );
        }
        other => panic!("{other}"),
    }
    let err = run(
        &tools,
        Py,
        "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)",
        &[],
        json!({}),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, SandboxError::Crashed { status, .. } if status == "killed by signal 11" || status == "exit status 139"),
        "{err}"
    );
    // The worker is fine: the next call runs.
    assert_eq!(
        run(&tools, Py, "return 1 + 1", &[], json!({}))
            .await
            .unwrap(),
        json!(2)
    );
}

#[tokio::test]
async fn a_worker_without_the_runtime_refuses_before_running() {
    let tools = SandboxTools::start(SandboxConfig {
        node: "/nonexistent/node".into(),
        ..SandboxConfig::default()
    })
    .await;
    let b = binding(Js, "return 1;", &[]);
    let err = tools.check(&b).unwrap_err();
    assert_eq!(err.class(), FailureClass::NotSent);
    assert_eq!(
        err.to_string(),
        "the javascript sandbox is not available on this worker: /nonexistent/node does not exist"
    );
    assert_eq!(tools.run(&b, &json!({})).await.unwrap_err(), err);
    // Python still runs.
    assert_eq!(
        tools
            .run(&binding(Py, "return 3", &[]), &json!({}))
            .await
            .unwrap(),
        json!(3)
    );
}
