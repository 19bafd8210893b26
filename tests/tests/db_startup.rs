//! An engine started while its PostgreSQL is still starting up (a node
//! reboot, a failover: the pods come up in any order) waits for it instead
//! of exiting. The database here sits behind a stand-in listener that
//! first answers every connection as a recovering PostgreSQL server does
//! (`FATAL 57P03 the database system is starting up`), then forwards to
//! the real one; the engine must come up on its own once it does. With
//! `--db-startup-wait 0s` the first refusal ends the start, with a message
//! naming the database.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use belay_tests::{ADMIN_TOKEN, Proc, TestDb, bin, pg_base};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How many connections the stand-in refuses before forwarding.
const REFUSED: usize = 3;
/// The code of PostgreSQL's `SSLRequest` (protocol docs, "Message Formats").
const SSL_REQUEST: i32 = 80_877_103;

/// Answer one connection as a PostgreSQL server in recovery: decline TLS,
/// read the startup message, send `ErrorResponse` (`FATAL`, `57P03`) and
/// close.
async fn refuse_as_starting_up(mut conn: TcpStream) -> Result<()> {
    loop {
        let len = conn.read_i32().await?;
        let code = conn.read_i32().await?;
        if code == SSL_REQUEST {
            conn.write_all(b"N").await?;
            continue;
        }
        let mut rest = vec![0u8; usize::try_from(len - 8).context("startup length")?];
        conn.read_exact(&mut rest).await?;
        break;
    }
    let mut fields = Vec::new();
    for (tag, text) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', "57P03"),
        (b'M', "the database system is starting up"),
    ] {
        fields.push(tag);
        fields.extend_from_slice(text.as_bytes());
        fields.push(0);
    }
    fields.push(0);
    let mut message = vec![b'E'];
    message.extend_from_slice(&(i32::try_from(fields.len())? + 4).to_be_bytes());
    message.extend_from_slice(&fields);
    conn.write_all(&message).await?;
    conn.shutdown().await?;
    Ok(())
}

/// The stand-in: refuses the first [`REFUSED`] connections, then forwards
/// each to `upstream`. Returns its port and the count of connections seen.
async fn stand_in(upstream: String) -> Result<(u16, Arc<AtomicUsize>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let seen = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let n = count.fetch_add(1, Ordering::SeqCst);
            let upstream = upstream.clone();
            tokio::spawn(async move {
                if n < REFUSED {
                    let _ = refuse_as_starting_up(conn).await;
                } else if let Ok(mut up) = TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
                }
            });
        }
    });
    Ok((port, seen))
}

/// The engine's flags: every endpoint on a free loopback port.
fn engine_args(wait: &str) -> Vec<String> {
    [
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--callback-listen",
        "127.0.0.1:0",
        "--db-startup-wait",
        wait,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The host and port of [`pg_base`] (`postgres://user@host:port`).
fn pg_address() -> String {
    let base = pg_base();
    base.rsplit('@')
        .next()
        .unwrap_or("127.0.0.1:5432")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_engine_started_before_its_database_waits_for_it() -> Result<()> {
    let db = TestDb::create().await?;
    let real = pg_address();
    let (port, seen) = stand_in(real.clone()).await?;
    let url = db.url.replace(&real, &format!("127.0.0.1:{port}"));
    ensure!(url != db.url, "{url}");
    let mut engine = Proc::spawn_lines(
        "engine-early",
        &bin("belay-engine")?,
        &engine_args("60s"),
        &[
            ("DATABASE_URL", url),
            ("BELAY_ADMIN_TOKENS", format!("ops:{ADMIN_TOKEN}:*")),
        ],
        3,
    )
    .await?;
    ensure!(
        seen.load(Ordering::SeqCst) > REFUSED,
        "the engine listened without reaching the database"
    );
    let log = std::fs::read_to_string(&engine.log)?;
    let retries = log
        .matches("the database cannot be reached yet; trying again")
        .count();
    ensure!(retries >= REFUSED, "{retries} retries logged: {log}");
    ensure!(log.contains("starting up"), "the refusal is named: {log}");
    engine.kill().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_startup_wait_the_first_refusal_ends_the_start() -> Result<()> {
    let db = TestDb::create().await?;
    let real = pg_address();
    let (port, seen) = stand_in(real.clone()).await?;
    let url = db.url.replace(&real, &format!("127.0.0.1:{port}"));
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(bin("belay-engine")?)
            .args(engine_args("0s"))
            .env("DATABASE_URL", url)
            .env("BELAY_ADMIN_TOKENS", format!("ops:{ADMIN_TOKEN}:*"))
            .output(),
    )
    .await
    .context("the engine did not exit")??;
    ensure!(!out.status.success(), "the engine started");
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        stderr.contains("connecting to the database") && stderr.contains("starting up"),
        "{stderr}"
    );
    ensure!(seen.load(Ordering::SeqCst) == 1, "one attempt only");
    db.drop_db().await
}
