//! A TCP proxy of the harness's own (this kernel has no `netem`): it sits on
//! a link (workers and clients to an engine, engines to PostgreSQL, workers
//! to the tool server), forwards bytes both ways, and takes two faults:
//!
//! - [`Proxy::drop_all`]: every connection open now is closed at once (with
//!   a reset where the platform allows), whatever is in flight; new
//!   connections are accepted as usual;
//! - [`Proxy::stall_for`]: for a while nothing is forwarded on any
//!   connection, old or new; bytes wait in the sockets' buffers and go on
//!   when the stall ends (a network that hangs, not one that loses data).
//!
//! The upstream address can change ([`Proxy::set_upstream`]: an engine
//! restarted on a new port), so what dials the proxy keeps one address.
//! Connections whose upstream cannot be reached are closed at once.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long a new connection waits for its upstream to accept.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Bytes read at once, each way.
const BUFFER_BYTES: usize = 32 * 1024;

/// What every connection of a proxy obeys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LinkState {
    /// Bumped by [`Proxy::drop_all`]: a connection opened under an older
    /// generation closes.
    generation: u64,
    /// Bumped by every stall; the stall that ends last lifts it.
    stall_epoch: u64,
    /// Nothing is forwarded while set.
    stalled: bool,
}

/// What a proxy has done so far.
#[derive(Debug, Default)]
pub struct ProxyCounts {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Connections closed because the upstream could not be reached.
    pub refused: AtomicU64,
    /// Connections closed by [`Proxy::drop_all`].
    pub dropped: AtomicU64,
}

/// One proxied link; stops listening when dropped.
#[derive(Debug)]
pub struct Proxy {
    name: String,
    listen: SocketAddr,
    upstream: Arc<Mutex<SocketAddr>>,
    state: watch::Sender<LinkState>,
    counts: Arc<ProxyCounts>,
    accept: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    ///
    /// Errors: no port can be bound.
    pub async fn start(name: &str, upstream: SocketAddr) -> Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .with_context(|| format!("binding the {name} proxy"))?;
        let listen = listener.local_addr()?;
        let upstream = Arc::new(Mutex::new(upstream));
        let (state, _) = watch::channel(LinkState {
            generation: 0,
            stall_epoch: 0,
            stalled: false,
        });
        let counts = Arc::new(ProxyCounts::default());
        let accept = tokio::spawn(accept_loop(
            listener,
            Arc::clone(&upstream),
            state.clone(),
            Arc::clone(&counts),
        ));
        Ok(Proxy {
            name: name.to_owned(),
            listen,
            upstream,
            state,
            counts,
            accept,
        })
    }

    /// The link's name, for the report.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where to connect instead of the upstream.
    pub fn addr(&self) -> SocketAddr {
        self.listen
    }

    /// Sends new connections to `upstream` from now on (open ones stay).
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *self.upstream.lock().unwrap_or_else(PoisonError::into_inner) = upstream;
    }

    /// Closes every connection open now.
    pub fn drop_all(&self) {
        self.state.send_modify(|s| s.generation += 1);
    }

    /// Forwards nothing for `duration` (a later stall that ends later wins).
    pub fn stall_for(&self, duration: Duration) {
        let mut epoch = 0;
        self.state.send_modify(|s| {
            s.stall_epoch += 1;
            s.stalled = true;
            epoch = s.stall_epoch;
        });
        let state = self.state.clone();
        tokio::spawn(async move {
            tokio::time::sleep(duration).await;
            state.send_if_modified(|s| {
                let lift = s.stall_epoch == epoch && s.stalled;
                if lift {
                    s.stalled = false;
                }
                lift
            });
        });
    }

    /// Ends any stall now.
    pub fn unstall(&self) {
        self.state.send_if_modified(|s| {
            let was = s.stalled;
            s.stalled = false;
            s.stall_epoch += 1;
            was
        });
    }

    /// What it has done so far.
    pub fn counts(&self) -> &ProxyCounts {
        &self.counts
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: Arc<Mutex<SocketAddr>>,
    state: watch::Sender<LinkState>,
    counts: Arc<ProxyCounts>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of descriptors or similar: try again shortly.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        counts.accepted.fetch_add(1, Ordering::Relaxed);
        let to = *upstream.lock().unwrap_or_else(PoisonError::into_inner);
        let link = state.subscribe();
        let generation = link.borrow().generation;
        tokio::spawn(serve(client, to, link, generation, Arc::clone(&counts)));
    }
}

/// Forwards one connection, accepted under `generation`, until either side
/// closes or the link drops it.
async fn serve(
    client: TcpStream,
    to: SocketAddr,
    state: watch::Receiver<LinkState>,
    generation: u64,
    counts: Arc<ProxyCounts>,
) {
    let server = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(to)).await {
        Ok(Ok(server)) => server,
        _ => {
            counts.refused.fetch_add(1, Ordering::Relaxed);
            // A reset, as from a host with nothing listening.
            let _ = client.set_zero_linger();
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = pump(client_read, server_write, state.clone(), generation);
    let down = pump(server_read, client_write, state, generation);
    let (up, down) = tokio::join!(up, down);
    if up.is_some() || down.is_some() {
        counts.dropped.fetch_add(1, Ordering::Relaxed);
    }
    // Both directions have stopped: the halves close here, with a reset
    // when the link dropped the connection (as a broken network or a killed
    // peer would), else with the orderly close each pump already sent.
    for half in [up, down].into_iter().flatten() {
        let _ = half.as_ref().set_zero_linger();
        // Without the orderly shutdown a dropped write half would send
        // first; its read half has already gone, so the socket closes now.
        half.forget();
    }
}

/// Waits until the link forwards again; `false` when it dropped this
/// connection's generation meanwhile.
async fn passable(state: &mut watch::Receiver<LinkState>, generation: u64) -> bool {
    match state
        .wait_for(|s| s.generation != generation || !s.stalled)
        .await
    {
        Ok(s) => s.generation == generation,
        Err(_) => false,
    }
}

/// Completes when the link drops `generation`.
async fn dropped(mut state: watch::Receiver<LinkState>, generation: u64) {
    let _ = state.wait_for(|s| s.generation != generation).await;
}

/// Copies `from` to `to` until end of file, an error, or a drop; returns
/// the write half when the link dropped the connection (so that the socket
/// closes, with a reset, only once both directions have stopped).
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut state: watch::Receiver<LinkState>,
    generation: u64,
) -> Option<OwnedWriteHalf> {
    let mut buf = vec![0_u8; BUFFER_BYTES];
    loop {
        if !passable(&mut state, generation).await {
            return Some(to);
        }
        let read = tokio::select! {
            read = from.read(&mut buf) => read,
            () = dropped(state.clone(), generation) => return Some(to),
        };
        let n = match read {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return None;
            }
            Ok(n) => n,
        };
        // A stall that began while reading holds these bytes too.
        if !passable(&mut state, generation).await {
            return Some(to);
        }
        tokio::select! {
            written = to.write_all(&buf[..n]) => if written.is_err() { return None },
            () = dropped(state.clone(), generation) => return Some(to),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on a free port.
    async fn echo() -> Result<SocketAddr> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = conn.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        Ok(addr)
    }

    async fn roundtrip(conn: &mut TcpStream, text: &[u8]) -> Result<Vec<u8>> {
        conn.write_all(text).await?;
        let mut buf = vec![0; text.len()];
        conn.read_exact(&mut buf).await?;
        Ok(buf)
    }

    #[tokio::test]
    async fn it_forwards_and_follows_a_new_upstream() -> Result<()> {
        let proxy = Proxy::start("test", echo().await?).await?;
        let mut conn = TcpStream::connect(proxy.addr()).await?;
        assert_eq!(roundtrip(&mut conn, b"ping").await?, b"ping");
        proxy.set_upstream(echo().await?);
        let mut again = TcpStream::connect(proxy.addr()).await?;
        assert_eq!(roundtrip(&mut again, b"pong").await?, b"pong");
        assert_eq!(
            roundtrip(&mut conn, b"old").await?,
            b"old",
            "open ones stay"
        );
        assert_eq!(proxy.counts().accepted.load(Ordering::Relaxed), 2);
        Ok(())
    }

    #[tokio::test]
    async fn drop_all_closes_open_connections_and_new_ones_work() -> Result<()> {
        let proxy = Proxy::start("test", echo().await?).await?;
        let mut conn = TcpStream::connect(proxy.addr()).await?;
        assert_eq!(roundtrip(&mut conn, b"a").await?, b"a");
        proxy.drop_all();
        let mut buf = [0_u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await?;
        assert!(matches!(read, Ok(0) | Err(_)), "closed: {read:?}");
        let mut fresh = TcpStream::connect(proxy.addr()).await?;
        assert_eq!(roundtrip(&mut fresh, b"b").await?, b"b");
        assert_eq!(proxy.counts().dropped.load(Ordering::Relaxed), 1);
        Ok(())
    }

    #[tokio::test]
    async fn a_stall_holds_bytes_until_it_ends() -> Result<()> {
        let proxy = Proxy::start("test", echo().await?).await?;
        let mut conn = TcpStream::connect(proxy.addr()).await?;
        assert_eq!(roundtrip(&mut conn, b"1").await?, b"1");
        proxy.stall_for(Duration::from_millis(600));
        let started = tokio::time::Instant::now();
        conn.write_all(b"2").await?;
        let mut buf = [0_u8; 1];
        let early = tokio::time::timeout(Duration::from_millis(300), conn.read(&mut buf)).await;
        assert!(early.is_err(), "nothing passes during the stall");
        conn.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"2");
        assert!(
            started.elapsed() >= Duration::from_millis(550),
            "{:?}",
            started.elapsed()
        );
        proxy.stall_for(Duration::from_secs(60));
        proxy.unstall();
        assert_eq!(
            roundtrip(&mut conn, b"3").await?,
            b"3",
            "unstall ends it at once"
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_connection_to_an_upstream_that_is_down_is_closed() -> Result<()> {
        let gone = TcpListener::bind("127.0.0.1:0").await?;
        let addr = gone.local_addr()?;
        drop(gone);
        let proxy = Proxy::start("test", addr).await?;
        let mut conn = TcpStream::connect(proxy.addr()).await?;
        let mut buf = [0_u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await?;
        assert!(matches!(read, Ok(0) | Err(_)), "closed: {read:?}");
        assert_eq!(proxy.counts().refused.load(Ordering::Relaxed), 1);
        Ok(())
    }
}
