//! The gRPC authentication layer: a tower layer in front of every service
//! that authenticates each request ([`Authenticator`]), refuses it when the
//! method's [`policy`](crate::auth::policy) does not admit the principal's
//! role, and otherwise attaches the [`Principal`] to the request's
//! extensions for the handler ([`principal`]). Health and reflection are
//! public. Nothing of a refused request reaches a handler, so it changes
//! nothing.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use tonic::Status;

use crate::auth::policy::{self, Access};
use crate::auth::{AuthError, Authenticator, Credentials, Principal};

/// Adds [`AuthService`] in front of a service.
#[derive(Debug, Clone)]
pub struct AuthLayer {
    auth: Authenticator,
}

impl AuthLayer {
    /// A layer authenticating with `auth`.
    pub fn new(auth: Authenticator) -> AuthLayer {
        AuthLayer { auth }
    }
}

impl<S> tower_layer::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> AuthService<S> {
        AuthService {
            inner,
            auth: self.auth.clone(),
        }
    }
}

/// The service [`AuthLayer`] makes.
#[derive(Debug, Clone)]
pub struct AuthService<S> {
    inner: S,
    auth: Authenticator,
}

impl<S, B, R> tower_service::Service<Request<B>> for AuthService<S>
where
    S: tower_service::Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
    R: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        // The clone that was polled ready serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let auth = self.auth.clone();
        Box::pin(async move {
            let admitted = match credentials_of(&req) {
                Ok(credentials) => admit(&auth, req.uri().path().to_owned(), credentials).await,
                Err(status) => Err(status),
            };
            match admitted {
                Ok(Some(principal)) => {
                    req.extensions_mut().insert(principal);
                    inner.call(req).await
                }
                Ok(None) => inner.call(req).await,
                Err(status) => Ok(status.into_http()),
            }
        })
    }
}

/// What a request presents (taken out of it, so no reference to the
/// request is held while the store is asked).
fn credentials_of<B>(req: &Request<B>) -> Result<Credentials, Status> {
    Ok(Credentials::from_headers(
        req.headers(),
        peer_cert_subject(req.extensions()),
    )?)
}

/// The principal of an admitted request to `path`, `None` for a public
/// method.
async fn admit(
    auth: &Authenticator,
    path: String,
    credentials: Credentials,
) -> Result<Option<Principal>, Status> {
    let path = path.as_str();
    let roles = match policy::grpc_access(path) {
        Some(Access::Public) => return Ok(None),
        Some(Access::Roles(roles)) => roles,
        None => {
            return Err(Status::permission_denied(format!(
                "no access policy admits method {path}"
            )));
        }
    };
    let principal = auth.authenticate(credentials).await?;
    if !principal.has_role(roles) {
        let names: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
        return Err(Status::permission_denied(format!(
            "principal `{}` has role {}; {path} needs role {}",
            principal.id,
            principal.role,
            names.join(" or ")
        )));
    }
    Ok(Some(principal))
}

/// The principal the layer attached to `req`. Errors: `UNAUTHENTICATED`
/// when there is none (the layer did not run: fail closed).
pub fn principal<T>(req: &tonic::Request<T>) -> Result<Principal, Status> {
    req.extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("no authenticated principal"))
}

impl From<AuthError> for Status {
    fn from(e: AuthError) -> Status {
        if matches!(e, AuthError::Store(_) | AuthError::Internal(_)) {
            tracing::error!(error = %e, "authentication failed");
        }
        Status::new(e.code().grpc_code(), e.public_message())
    }
}

/// The subject of the connection's verified client certificate (the
/// listener's [`PeerInfo`](crate::tls::PeerInfo)).
fn peer_cert_subject(extensions: &http::Extensions) -> Option<String> {
    extensions
        .get::<crate::tls::PeerInfo>()
        .and_then(|p| p.client_cert_subject.clone())
}
