//! The listener every endpoint serves on: TCP with `TCP_NODELAY`, TLS
//! handshakes in tasks of their own.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use futures_util::Stream;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use super::peer::subject_rfc4514;
use super::{Connection, PeerInfo, Protocol, ServerTls, plaintext};

/// How long a client has to finish its TLS handshake (or, on a TLS port,
/// to read the answer to its plaintext request) before it is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes in progress at most; past that, no connection is accepted
/// until one finishes (the kernel's backlog holds the rest).
pub const MAX_PENDING_HANDSHAKES: usize = 1024;

/// The first byte of a TLS record that carries a handshake (a ClientHello).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// A bound socket that yields [`Connection`]s, plaintext or TLS. Convert
/// a `TcpListener` with `From` for plaintext; [`Listener::tls`] for TLS.
/// Dropping it closes the socket and drops the handshakes in progress.
pub struct Listener {
    tcp: TcpListener,
    tls: Option<(TlsAcceptor, Protocol)>,
    handshakes: JoinSet<Option<Connection>>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("tcp", &self.tcp)
            .field("tls", &self.tls.as_ref().map(|(_, protocol)| protocol))
            .field("handshakes", &self.handshakes.len())
            .finish()
    }
}

impl From<TcpListener> for Listener {
    fn from(tcp: TcpListener) -> Listener {
        Listener::plain(tcp)
    }
}

impl Listener {
    /// Plaintext connections on `tcp`.
    pub fn plain(tcp: TcpListener) -> Listener {
        Listener {
            tcp,
            tls: None,
            handshakes: JoinSet::new(),
        }
    }

    /// TLS connections on `tcp`, speaking `protocol` (its ALPN).
    pub fn tls(tcp: TcpListener, tls: &ServerTls, protocol: Protocol) -> Listener {
        Listener {
            tcp,
            tls: Some((tls.acceptor(protocol), protocol)),
            handshakes: JoinSet::new(),
        }
    }

    /// TLS with `tls` when given, else plaintext.
    pub fn new(tcp: TcpListener, tls: Option<&ServerTls>, protocol: Protocol) -> Listener {
        match tls {
            Some(tls) => Listener::tls(tcp, tls, protocol),
            None => Listener::plain(tcp),
        }
    }

    /// The bound address.
    ///
    /// Errors: the socket's.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Whether connections are TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The next connection: a plaintext one as soon as it is accepted, a
    /// TLS one once its handshake is done. Never fails: failed handshakes
    /// are logged at debug and dropped, accept errors are retried (after
    /// 1 s when they are not about one connection, e.g. too many open
    /// files).
    pub async fn accept(&mut self) -> Connection {
        loop {
            let room = self.handshakes.len() < MAX_PENDING_HANDSHAKES;
            tokio::select! {
                accepted = self.tcp.accept(), if room => match accepted {
                    Ok((stream, addr)) => {
                        if let Some(conn) = self.start(stream, addr) {
                            return conn;
                        }
                    }
                    Err(e) => accept_error(e).await,
                },
                Some(done) = self.handshakes.join_next(), if !self.handshakes.is_empty() => {
                    if let Ok(Some(conn)) = done {
                        return conn;
                    }
                }
            }
        }
    }

    /// The connections as the stream tonic's
    /// `serve_with_incoming_shutdown` takes.
    pub fn into_incoming(self) -> impl Stream<Item = Result<Connection, io::Error>> + Send {
        futures_util::stream::unfold(self, |mut listener| async move {
            let conn = listener.accept().await;
            Some((Ok(conn), listener))
        })
    }

    /// A plaintext connection at once, or `None` with its handshake started.
    fn start(&mut self, stream: TcpStream, addr: SocketAddr) -> Option<Connection> {
        // Without it every small reply waits for the client's delayed ACK
        // (~40 ms per step, measured by `belay-bench`).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%addr, error = %e, "TCP_NODELAY not set");
        }
        let peer = PeerInfo {
            remote_addr: Some(addr),
            client_cert_subject: None,
        };
        match &self.tls {
            None => Some(Connection::plain(stream, peer)),
            Some((acceptor, protocol)) => {
                let (acceptor, protocol) = (acceptor.clone(), *protocol);
                self.handshakes
                    .spawn(handshake(acceptor, protocol, stream, addr));
                None
            }
        }
    }
}

impl axum::serve::Listener for Listener {
    type Io = Connection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Connection, SocketAddr) {
        let conn = Listener::accept(self).await;
        let addr = conn
            .peer()
            .remote_addr
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        (conn, addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Listener::local_addr(self)
    }
}

/// axum's `ConnectInfo<PeerInfo>` (and [`super::serve_http`]'s extension).
impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Listener>>
    for PeerInfo
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, Listener>) -> PeerInfo {
        stream.io().peer().clone()
    }
}

async fn handshake(
    acceptor: TlsAcceptor,
    protocol: Protocol,
    stream: TcpStream,
    addr: SocketAddr,
) -> Option<Connection> {
    match tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        accept_tls(acceptor, protocol, stream, addr),
    )
    .await
    {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            tracing::debug!(%addr, error = %e, "TLS handshake failed; connection dropped");
            None
        }
        Err(_) => {
            tracing::debug!(%addr, timeout_s = HANDSHAKE_TIMEOUT.as_secs(), "TLS handshake timed out; connection dropped");
            None
        }
    }
}

async fn accept_tls(
    acceptor: TlsAcceptor,
    protocol: Protocol,
    stream: TcpStream,
    addr: SocketAddr,
) -> io::Result<Option<Connection>> {
    let mut first = [0u8; 1];
    if stream.peek(&mut first).await? == 0 {
        return Ok(None);
    }
    if first[0] != TLS_HANDSHAKE_RECORD {
        tracing::debug!(%addr, "plaintext client on a TLS port; answering that it needs TLS");
        plaintext::refuse(stream, protocol).await;
        return Ok(None);
    }
    let tls = acceptor.accept(stream).await?;
    let client_cert_subject = match tls.get_ref().1.peer_certificates() {
        Some([leaf, ..]) => {
            let subject = subject_rfc4514(leaf);
            if subject.is_none() {
                tracing::warn!(%addr, "a verified client certificate has a subject that does not parse; treating the client as without one");
            }
            subject
        }
        _ => None,
    };
    let peer = PeerInfo {
        remote_addr: Some(addr),
        client_cert_subject,
    };
    Ok(Some(Connection::tls(tls, peer)))
}

async fn accept_error(e: io::Error) {
    if matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    ) {
        return;
    }
    // E.g. EMFILE: retrying at once would spin; connections may close
    // meanwhile.
    tracing::error!(error = %e, "accept error; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
