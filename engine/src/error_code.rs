//! The one map from errors to the wire: every error a client can see has an
//! [`ErrorCode`], which fixes its gRPC status code, its HTTP status and the
//! stable `code` string of the admin API's error body. The gRPC API
//! ([`crate::api`]), the admin and callback endpoints ([`crate::admin`],
//! [`crate::callbacks`]) and the MCP server all take their codes from here,
//! and [`CoordinatorError::code`] gives each coordinator error its one code.
//!
//! Like quickwit's `ServiceErrorCode`, this is voluntarily a restricted
//! subset of gRPC's codes: introduce new variants thoughtfully. The strings
//! ([`ErrorCode::as_str`]) are read by clients and never change.
//!
//! Architecture Invariant: database details never reach a client.
//! [`CoordinatorError::public_message`] replaces a store error with one
//! generic text; the layer that answers logs the error itself.

use axum::http::StatusCode;

use crate::coordinator::CoordinatorError;

/// What a client is told of a store failure (the details are logged).
const STORE_UNAVAILABLE: &str = "the engine's database is unavailable or failed; retry later";

/// The kind of an error as clients see it, on every wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// A malformed request: gRPC `INVALID_ARGUMENT`, HTTP 400,
    /// `invalid_argument`.
    InvalidArgument,
    /// No credentials, or ones that match nothing: gRPC `UNAUTHENTICATED`,
    /// HTTP 401, `unauthorized`.
    Unauthenticated,
    /// The caller is known but may not do this: gRPC `PERMISSION_DENIED`,
    /// HTTP 403, `forbidden`.
    PermissionDenied,
    /// No such thing (for this tenant), or no such route: gRPC `NOT_FOUND`,
    /// HTTP 404, `not_found`.
    NotFound,
    /// The route exists, but not with this method: gRPC `UNIMPLEMENTED`,
    /// HTTP 405, `method_not_allowed`.
    MethodNotAllowed,
    /// Someone else did it already (a second resolve, a second decision):
    /// gRPC `ABORTED`, HTTP 409, `conflict`.
    Conflict,
    /// Well-formed, but the state does not allow it (a stale attempt, a
    /// finished run): gRPC `FAILED_PRECONDITION`, HTTP 409,
    /// `failed_precondition`.
    FailedPrecondition,
    /// The body is larger than the limit: gRPC `RESOURCE_EXHAUSTED`, HTTP
    /// 413, `payload_too_large`.
    PayloadTooLarge,
    /// The body is not of a type the endpoint reads: gRPC
    /// `INVALID_ARGUMENT`, HTTP 415, `unsupported_media_type`.
    UnsupportedMediaType,
    /// Well-formed, but it does not match a schema (a result, an edit, an
    /// answer); each violation is listed: gRPC `INVALID_ARGUMENT`, HTTP 422,
    /// `unprocessable`.
    Unprocessable,
    /// The database is unavailable or failed; retrying later may succeed:
    /// gRPC `UNAVAILABLE`, HTTP 503, `unavailable`.
    Unavailable,
    /// A fault of the server itself: gRPC `INTERNAL`, HTTP 500, `internal`.
    Internal,
}

impl ErrorCode {
    /// The gRPC status code.
    pub fn grpc_code(self) -> tonic::Code {
        match self {
            ErrorCode::InvalidArgument => tonic::Code::InvalidArgument,
            ErrorCode::Unauthenticated => tonic::Code::Unauthenticated,
            ErrorCode::PermissionDenied => tonic::Code::PermissionDenied,
            ErrorCode::NotFound => tonic::Code::NotFound,
            ErrorCode::MethodNotAllowed => tonic::Code::Unimplemented,
            ErrorCode::Conflict => tonic::Code::Aborted,
            ErrorCode::FailedPrecondition => tonic::Code::FailedPrecondition,
            ErrorCode::PayloadTooLarge => tonic::Code::ResourceExhausted,
            ErrorCode::UnsupportedMediaType => tonic::Code::InvalidArgument,
            ErrorCode::Unprocessable => tonic::Code::InvalidArgument,
            ErrorCode::Unavailable => tonic::Code::Unavailable,
            ErrorCode::Internal => tonic::Code::Internal,
        }
    }

    /// The HTTP status.
    pub fn http_status(self) -> StatusCode {
        match self {
            ErrorCode::InvalidArgument => StatusCode::BAD_REQUEST,
            ErrorCode::Unauthenticated => StatusCode::UNAUTHORIZED,
            ErrorCode::PermissionDenied => StatusCode::FORBIDDEN,
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::Conflict => StatusCode::CONFLICT,
            ErrorCode::FailedPrecondition => StatusCode::CONFLICT,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable snake_case name: the `code` of the admin API's error body.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::Unauthenticated => "unauthorized",
            ErrorCode::PermissionDenied => "forbidden",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Conflict => "conflict",
            ErrorCode::FailedPrecondition => "failed_precondition",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::Unprocessable => "unprocessable",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
        }
    }

    /// Whether the request itself is at fault (HTTP 4xx): the same request
    /// gets the same answer, so the caller must change it rather than retry.
    pub fn is_client_error(self) -> bool {
        self.http_status().is_client_error()
    }
}

impl CoordinatorError {
    /// The error's one code, on every wire.
    pub fn code(&self) -> ErrorCode {
        match self {
            CoordinatorError::NotFound(_) => ErrorCode::NotFound,
            CoordinatorError::InvalidArgument(_) | CoordinatorError::Definitions(_) => {
                ErrorCode::InvalidArgument
            }
            CoordinatorError::FailedPrecondition(_) => ErrorCode::FailedPrecondition,
            CoordinatorError::Conflict(_) => ErrorCode::Conflict,
            CoordinatorError::PermissionDenied(_) => ErrorCode::PermissionDenied,
            CoordinatorError::Unprocessable { .. } => ErrorCode::Unprocessable,
            CoordinatorError::Store(_) => ErrorCode::Unavailable,
        }
    }

    /// The message a client is shown (the details, if any, are
    /// [`CoordinatorError::details`]). A store error's is a generic text:
    /// what failed is for the log (the caller logs it), never for a client.
    pub fn public_message(&self) -> String {
        match self {
            CoordinatorError::InvalidArgument(msg) => msg.clone(),
            CoordinatorError::Store(_) => STORE_UNAVAILABLE.to_owned(),
            e @ (CoordinatorError::NotFound(_)
            | CoordinatorError::Definitions(_)
            | CoordinatorError::FailedPrecondition(_)
            | CoordinatorError::Conflict(_)
            | CoordinatorError::PermissionDenied(_)
            | CoordinatorError::Unprocessable { .. }) => e.to_string(),
        }
    }

    /// The items of an error that lists problems, one per problem: each
    /// definition error, each violation of an unprocessable value; empty
    /// for the others.
    pub fn details(&self) -> Vec<String> {
        match self {
            CoordinatorError::Definitions(errors) => errors.iter().map(|e| e.to_string()).collect(),
            CoordinatorError::Unprocessable { errors, .. } => errors.clone(),
            CoordinatorError::NotFound(_)
            | CoordinatorError::InvalidArgument(_)
            | CoordinatorError::FailedPrecondition(_)
            | CoordinatorError::Conflict(_)
            | CoordinatorError::PermissionDenied(_)
            | CoordinatorError::Store(_) => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;
    use tonic::Code;

    /// Every code, each once.
    const ALL: [ErrorCode; 12] = [
        ErrorCode::InvalidArgument,
        ErrorCode::Unauthenticated,
        ErrorCode::PermissionDenied,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::Conflict,
        ErrorCode::FailedPrecondition,
        ErrorCode::PayloadTooLarge,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::Unprocessable,
        ErrorCode::Unavailable,
        ErrorCode::Internal,
    ];

    /// What clients rely on, written out once more: a change to the map
    /// above must change this too. A new variant fails to compile here
    /// until it is added (and to [`ALL`]).
    fn wire(code: ErrorCode) -> (Code, u16, &'static str) {
        match code {
            ErrorCode::InvalidArgument => (Code::InvalidArgument, 400, "invalid_argument"),
            ErrorCode::Unauthenticated => (Code::Unauthenticated, 401, "unauthorized"),
            ErrorCode::PermissionDenied => (Code::PermissionDenied, 403, "forbidden"),
            ErrorCode::NotFound => (Code::NotFound, 404, "not_found"),
            ErrorCode::MethodNotAllowed => (Code::Unimplemented, 405, "method_not_allowed"),
            ErrorCode::Conflict => (Code::Aborted, 409, "conflict"),
            ErrorCode::FailedPrecondition => (Code::FailedPrecondition, 409, "failed_precondition"),
            ErrorCode::PayloadTooLarge => (Code::ResourceExhausted, 413, "payload_too_large"),
            ErrorCode::UnsupportedMediaType => {
                (Code::InvalidArgument, 415, "unsupported_media_type")
            }
            ErrorCode::Unprocessable => (Code::InvalidArgument, 422, "unprocessable"),
            ErrorCode::Unavailable => (Code::Unavailable, 503, "unavailable"),
            ErrorCode::Internal => (Code::Internal, 500, "internal"),
        }
    }

    #[test]
    fn every_error_code_maps_consistently() {
        let mut names = std::collections::BTreeSet::new();
        for code in ALL {
            let (grpc, http, name) = wire(code);
            assert_eq!(
                (code.grpc_code(), code.http_status().as_u16(), code.as_str()),
                (grpc, http, name),
                "{code:?}"
            );
            assert!(names.insert(name), "{name} names two codes");
            assert!(
                !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{name} is not snake_case"
            );
            // An error is the caller's (4xx) or the server's (5xx), the same
            // on both wires: only the server's are UNAVAILABLE or INTERNAL.
            let server_side = matches!(grpc, Code::Unavailable | Code::Internal);
            assert!(
                code.http_status().is_client_error() || code.http_status().is_server_error(),
                "{code:?}"
            );
            assert_eq!(
                code.http_status().is_server_error(),
                server_side,
                "{code:?}"
            );
            assert_eq!(code.is_client_error(), !server_side, "{code:?}");
            assert_ne!(grpc, Code::Ok, "{code:?}");
        }
        assert_eq!(names.len(), ALL.len());
    }

    #[test]
    fn coordinator_errors_have_one_code_and_hide_the_store() {
        let cases = [
            (
                CoordinatorError::NotFound("run x".into()),
                ErrorCode::NotFound,
                "run x not found",
            ),
            (
                CoordinatorError::InvalidArgument("bad".into()),
                ErrorCode::InvalidArgument,
                "bad",
            ),
            (
                CoordinatorError::Definitions(Vec::new()),
                ErrorCode::InvalidArgument,
                "0 definition error(s)",
            ),
            (
                CoordinatorError::FailedPrecondition("finished".into()),
                ErrorCode::FailedPrecondition,
                "finished",
            ),
            (
                CoordinatorError::Conflict("already resolved".into()),
                ErrorCode::Conflict,
                "already resolved",
            ),
            (
                CoordinatorError::PermissionDenied("no grant".into()),
                ErrorCode::PermissionDenied,
                "no grant",
            ),
            (
                CoordinatorError::Unprocessable {
                    message: "no match".into(),
                    errors: vec!["/id: 5 is not a string".into()],
                },
                ErrorCode::Unprocessable,
                "no match",
            ),
            (
                CoordinatorError::Store(StoreError::Corrupt("SELECT password FROM t".into())),
                ErrorCode::Unavailable,
                STORE_UNAVAILABLE,
            ),
        ];
        for (e, code, message) in cases {
            assert_eq!(e.code(), code, "{e:?}");
            assert_eq!(e.public_message(), message, "{e:?}");
            assert!(!e.public_message().contains("SELECT"), "no SQL leaks");
            assert!(e.details().iter().all(|d| !d.contains("SELECT")));
        }
        // A duplicate unique value is the caller's conflict, not an outage.
        let e = CoordinatorError::from(StoreError::Conflict(
            "a principal with this key_id already exists".into(),
        ));
        assert_eq!(e.code(), ErrorCode::Conflict);
        assert_eq!(
            e.public_message(),
            "a principal with this key_id already exists"
        );
        let e = CoordinatorError::Unprocessable {
            message: "m".into(),
            errors: vec!["a".into(), "b".into()],
        };
        assert_eq!(e.details(), ["a", "b"]);
    }
}
