//! One accepted connection, plaintext or TLS, with its [`PeerInfo`].

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use super::PeerInfo;

/// An accepted connection: reads and writes go through TLS when the
/// listener serves it. tonic finds its [`PeerInfo`] through
/// `tonic::transport::server::Connected`, implemented in [`crate::api`]
/// (the one module of the engine that names tonic); axum through
/// `ConnectInfo` ([`super::Listener`]).
#[derive(Debug)]
pub struct Connection {
    io: Io,
    peer: PeerInfo,
}

#[derive(Debug)]
enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Connection {
    pub(super) fn plain(stream: TcpStream, peer: PeerInfo) -> Connection {
        Connection {
            io: Io::Plain(stream),
            peer,
        }
    }

    pub(super) fn tls(stream: TlsStream<TcpStream>, peer: PeerInfo) -> Connection {
        Connection {
            io: Io::Tls(Box::new(stream)),
            peer,
        }
    }

    /// Who is on the other end.
    pub fn peer(&self) -> &PeerInfo {
        &self.peer
    }

    /// Whether the connection is TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self.io, Io::Tls(_))
    }

    /// The ALPN protocol the TLS handshake agreed on (`None` for
    /// plaintext, or when the client offered none).
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        match &self.io {
            Io::Plain(_) => None,
            Io::Tls(s) => s.get_ref().1.alpn_protocol(),
        }
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
