//! The rule that keeps plaintext off the network: a listener on a
//! non-loopback address serves TLS, or the operator said `--insecure`.

use std::net::SocketAddr;

/// How a listener may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposure {
    /// TLS, or a loopback address: nothing to say.
    Fine,
    /// Plaintext on a non-loopback address, allowed by `--insecure`: the
    /// caller logs a warning.
    InsecureAllowed,
}

/// A plaintext listener on a non-loopback address without `--insecure`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{endpoint} would listen on {addr} without TLS, which other machines can reach: give --tls-cert and --tls-key (BELAY_TLS_CERT, BELAY_TLS_KEY) to serve TLS, or --insecure to serve plaintext anyway (only behind a network that is trusted, or a proxy that terminates TLS)"
)]
pub struct ExposureError {
    /// Which endpoint, e.g. `the gRPC API`.
    pub endpoint: &'static str,
    /// The bound address.
    pub addr: SocketAddr,
}

/// Whether `endpoint` may listen on `addr`: always with TLS (`tls`); on a
/// loopback address (`127.0.0.0/8`, `::1`, IPv4-mapped loopback) always;
/// elsewhere (any other address, also `0.0.0.0` and `::`) only with
/// `insecure`.
///
/// Errors: [`ExposureError`] naming the endpoint, the address and both
/// ways out.
pub fn check_exposure(
    endpoint: &'static str,
    addr: SocketAddr,
    tls: bool,
    insecure: bool,
) -> Result<Exposure, ExposureError> {
    if tls || addr.ip().to_canonical().is_loopback() {
        Ok(Exposure::Fine)
    } else if insecure {
        Ok(Exposure::InsecureAllowed)
    } else {
        Err(ExposureError { endpoint, addr })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("address")
    }

    #[test]
    fn loopback_or_tls_is_fine() {
        for a in [
            "127.0.0.1:1",
            "127.9.9.9:1",
            "[::1]:1",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert_eq!(
                check_exposure("x", addr(a), false, false),
                Ok(Exposure::Fine),
                "{a}"
            );
        }
        assert_eq!(
            check_exposure("x", addr("0.0.0.0:1"), true, false),
            Ok(Exposure::Fine)
        );
    }

    #[test]
    fn plaintext_elsewhere_needs_insecure_and_the_error_names_both_ways_out() {
        for a in ["0.0.0.0:50051", "[::]:50051", "10.1.2.3:50051"] {
            let err = check_exposure("the gRPC API", addr(a), false, false).expect_err(a);
            let text = err.to_string();
            assert!(text.starts_with("the gRPC API would listen on "), "{text}");
            assert!(text.contains(&addr(a).to_string()), "{text}");
            assert!(text.contains("--tls-cert and --tls-key"), "{text}");
            assert!(text.contains("--insecure"), "{text}");
            assert_eq!(
                check_exposure("the gRPC API", addr(a), false, true),
                Ok(Exposure::InsecureAllowed)
            );
        }
    }
}
