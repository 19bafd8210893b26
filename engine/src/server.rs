//! The one way an engine process is put together: [`EngineOptions`] say
//! what it connects to and how its coordinator behaves, [`Engine::start`]
//! connects the store, applies migrations and builds the coordinator, and
//! [`Engine::serve`] serves the endpoints of a [`Listeners`] until a
//! shutdown future completes. The `belay-engine` binary, `belay dev`, the
//! onboarding example and the benchmark all go through here, so a new
//! endpoint or background task is wired once.
//!
//! Listeners are bound by the caller (each prints or reads the addresses
//! its own way; port 0 picks a free port); everything else is here,
//! including TLS ([`EngineOptions::tls`]): every endpoint serves TLS when
//! it is set, and a plaintext endpoint on a non-loopback address is
//! refused unless [`EngineOptions::insecure`] ([`crate::tls::check_exposure`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::admin;
use crate::auth::{AdminAuth, Authenticator};
use crate::coordinator::{Coordinator, CoordinatorConfig, CoordinatorError};
use crate::notify::{Notifier, NotifyError};
use crate::store::{Store, StoreError};
use crate::tls::{Exposure, ExposureError, Listener, Protocol, ServerTls, TlsError, TlsSettings};
use crate::vault::VaultKey;

pub use belay_proto::signal::shutdown_signal;

/// What an engine connects to and how its coordinator behaves.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// `postgres://…` (any number of engine replicas) or `sqlite://PATH`
    /// (one engine process per file; `sqlite::memory:` for a throwaway).
    pub database_url: String,
    /// Size of the store's connection pool.
    pub db_connections: u32,
    /// How long [`Engine::start`] goes on trying a database that cannot be
    /// reached yet (not listening, or PostgreSQL starting up or in
    /// recovery), with exponential backoff from 100 ms to 5 s; zero: fail
    /// at the first attempt. Any other failure ends the start at once.
    pub db_startup_wait: Duration,
    /// How long a verified API key (without an expiry) is kept before it
    /// is looked up again ([`crate::auth::key_cache`]): the most a
    /// revocation through another replica, or straight in the database,
    /// takes to reach this engine. Zero: every request looks its key up.
    /// Default [`DEFAULT_KEY_CACHE_TTL`].
    pub key_cache_ttl: Duration,
    /// Leases, sweeps, the tool cache and definition settings.
    pub coordinator: CoordinatorConfig,
    /// Key of the runs' secret vaults; `None`: a tool that needs the vault
    /// is refused at dispatch.
    pub vault_key: Option<VaultKey>,
    /// Base URL tool servers call back on (`type: async_webhook` tools),
    /// served by [`Listeners::callbacks`]; `None`: such tools are refused
    /// at dispatch.
    pub callback_base_url: Option<String>,
    /// Where signed operator notifications go; `None`: none are sent.
    pub webhook: Option<WebhookOptions>,
    /// The configured tokens (`--admin-tokens`): bootstrap principals
    /// accepted on the gRPC API and the admin endpoint beside the API keys
    /// of the database (`crate::auth`).
    pub tokens: AdminAuth,
    /// The certificate every endpoint serves TLS with; `None`: plaintext.
    pub tls: Option<TlsSettings>,
    /// Serve plaintext on non-loopback addresses too (`--insecure`), with
    /// a warning; otherwise such an endpoint is refused.
    pub insecure: bool,
}

/// The default of [`EngineOptions::key_cache_ttl`] (`--key-cache-ms`):
/// one second.
pub const DEFAULT_KEY_CACHE_TTL: Duration = Duration::from_secs(1);

impl EngineOptions {
    /// Options for `database_url` with `db_connections` connections and
    /// every other setting at its default.
    pub fn new(database_url: impl Into<String>, db_connections: u32) -> EngineOptions {
        EngineOptions {
            database_url: database_url.into(),
            db_connections,
            db_startup_wait: Duration::ZERO,
            key_cache_ttl: DEFAULT_KEY_CACHE_TTL,
            coordinator: CoordinatorConfig::default(),
            vault_key: None,
            callback_base_url: None,
            tokens: AdminAuth::default(),
            webhook: None,
            tls: None,
            insecure: false,
        }
    }
}

/// The webhook that receives operator notifications (`crate::notify`).
#[derive(Debug, Clone)]
pub struct WebhookOptions {
    /// The receiver's URL.
    pub url: String,
    /// Secret of the `Belay-Signature` HMAC-SHA256.
    pub secret: String,
    /// How often due notifications are looked for.
    pub interval: Duration,
}

/// The bound sockets an engine serves; `None` leaves an endpoint out.
#[derive(Debug)]
pub struct Listeners {
    /// The gRPC API (`belay.v1`, health, reflection).
    pub grpc: TcpListener,
    /// The admin HTTP endpoint (keys and configured tokens of operators
    /// and admins).
    pub admin: Option<TcpListener>,
    /// Where callbacks of `type: async_webhook` tools are received.
    pub callbacks: Option<CallbackListener>,
    /// Chosen workflows served as MCP tools (cargo feature `mcp-server`).
    #[cfg(feature = "mcp-server")]
    pub mcp: Option<(TcpListener, crate::mcp_server::McpServerSettings)>,
}

impl Listeners {
    /// Only the gRPC API on `grpc`.
    pub fn grpc_only(grpc: TcpListener) -> Listeners {
        Listeners {
            grpc,
            admin: None,
            callbacks: None,
            #[cfg(feature = "mcp-server")]
            mcp: None,
        }
    }
}

/// Where the callback endpoint is served.
#[derive(Debug)]
pub enum CallbackListener {
    /// A socket of its own.
    Own(TcpListener),
    /// Beside the admin endpoint, on its socket (`belay dev`: one port
    /// fewer); without an admin listener, nowhere.
    OnAdmin,
}

/// Why an engine did not start, or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The database could not be reached or opened.
    #[error("connecting to the database")]
    Connect(#[source] StoreError),
    /// A migration failed (or the database holds one this engine does not
    /// know).
    #[error("applying migrations")]
    Migrate(#[source] StoreError),
    /// The vault key or the callback base URL was refused.
    #[error("{setting}")]
    Setting {
        /// The setting, e.g. `vault key`.
        setting: &'static str,
        /// Why.
        #[source]
        source: CoordinatorError,
    },
    /// The webhook URL or secret was refused.
    #[error("webhook")]
    Webhook(#[source] NotifyError),
    /// The TLS files could not be loaded.
    #[error("TLS")]
    Tls(#[source] TlsError),
    /// An endpoint would serve plaintext on a non-loopback address.
    #[error(transparent)]
    Exposed(ExposureError),
    /// The fleet's behaviour level was raised past this engine's while it
    /// ran (`store::fleet_level`): it stopped, as it would refuse to start.
    #[error("{0}")]
    Outranked(String),
    /// An endpoint failed, or ended before the shutdown.
    #[error("{endpoint}: {message}")]
    Endpoint {
        /// Which one, e.g. `the admin endpoint`.
        endpoint: &'static str,
        /// What happened, on one line.
        message: String,
    },
}

/// Connect the store and apply migrations, trying again for up to
/// `options.db_startup_wait` while the database cannot be reached
/// ([`StoreError::is_unreachable`]), each retry logged with its error.
async fn open_store(options: &EngineOptions) -> Result<Store, ServeError> {
    use backon::{ExponentialBuilder, Retryable};
    let attempt = || async {
        let store = Store::connect(&options.database_url, options.db_connections)
            .await
            .map_err(ServeError::Connect)?;
        store.migrate().await.map_err(ServeError::Migrate)?;
        Ok::<Store, ServeError>(store)
    };
    let policy = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(5))
        .with_total_delay(Some(options.db_startup_wait))
        .without_max_times()
        .with_jitter();
    attempt
        .retry(policy)
        .when(|e| {
            !options.db_startup_wait.is_zero()
                && matches!(e, ServeError::Connect(s) | ServeError::Migrate(s) if s.is_unreachable())
        })
        .notify(|e, delay| {
            tracing::warn!(
                error = %match e {
                    ServeError::Connect(s) | ServeError::Migrate(s) => format!("{e}: {s}"),
                    other => other.to_string(),
                },
                retry_in_ms = delay.as_millis() as u64,
                wait_s = options.db_startup_wait.as_secs(),
                "the database cannot be reached yet; trying again"
            );
        })
        .await
}

/// A started engine: its store is migrated and its coordinator built.
pub struct Engine {
    coord: Arc<Coordinator>,
    notifier: Option<(Notifier, Duration)>,
    auth: Authenticator,
    tls: Option<ServerTls>,
    insecure: bool,
}

impl Engine {
    /// Connects the store, applies migrations and builds the coordinator
    /// with `options`.
    ///
    /// Errors: [`ServeError::Tls`] (checked first, before the database),
    /// [`ServeError::Connect`], [`ServeError::Migrate`],
    /// [`ServeError::Setting`] (vault key, callback base URL) and
    /// [`ServeError::Webhook`].
    pub async fn start(options: EngineOptions) -> Result<Engine, ServeError> {
        let tls = match &options.tls {
            Some(settings) => Some(ServerTls::load(settings).map_err(ServeError::Tls)?),
            None => None,
        };
        let store = open_store(&options).await?;
        let notifier = match &options.webhook {
            Some(w) => Some((
                Notifier::new(store.clone(), &w.url, &w.secret).map_err(ServeError::Webhook)?,
                w.interval,
            )),
            None => None,
        };
        let auth =
            Authenticator::new(store.clone(), options.tokens).with_key_cache(options.key_cache_ttl);
        let coord = Coordinator::new(
            crate::telemetry::record_node_spans(store),
            options.coordinator,
        );
        if let Some(key) = options.vault_key {
            coord
                .use_vault_key(key)
                .map_err(|source| ServeError::Setting {
                    setting: "vault key",
                    source,
                })?;
        }
        if let Some(base) = &options.callback_base_url {
            coord
                .serve_callbacks_at(base)
                .map_err(|source| ServeError::Setting {
                    setting: "callback base URL",
                    source,
                })?;
        }
        Ok(Engine {
            coord,
            notifier,
            auth,
            tls,
            insecure: options.insecure,
        })
    }

    /// The TLS every endpoint serves (`None`: plaintext); its reload step
    /// is [`ServerTls::reload_if_changed`].
    pub fn tls(&self) -> Option<&ServerTls> {
        self.tls.as_ref()
    }

    /// The check [`Engine::serve`] starts with (without its warnings), for
    /// a caller that prints the listeners' URLs before serving.
    ///
    /// Errors: [`ServeError::Exposed`].
    pub fn check_listeners(&self, listeners: &Listeners) -> Result<(), ServeError> {
        check_listeners(listeners, self.tls.is_some(), self.insecure, false)
    }

    /// `https` when the endpoints serve TLS, else `http`: the scheme of
    /// their URLs.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// Serves callbacks of `type: async_webhook` tools at `base_url` (what
    /// [`EngineOptions::callback_base_url`] does, for a caller that binds
    /// its listeners after the database is open).
    ///
    /// Errors: [`ServeError::Setting`] when the URL is refused.
    pub fn serve_callbacks_at(&self, base_url: &str) -> Result<(), ServeError> {
        self.coord
            .serve_callbacks_at(base_url)
            .map_err(|source| ServeError::Setting {
                setting: "callback base URL",
                source,
            })
    }

    /// The authenticator of every endpoint (its store's principals and the
    /// configured tokens).
    pub fn authenticator(&self) -> &Authenticator {
        &self.auth
    }

    /// The coordinator (to register definitions or start runs in-process).
    pub fn coordinator(&self) -> &Arc<Coordinator> {
        &self.coord
    }

    /// Serves `listeners` and runs the background work (LISTEN relay,
    /// lease sweeper, timers, outbox, notifications) until `shutdown`
    /// completes; then every endpoint drains gracefully and the background
    /// work stops, and the store is closed. Endpoints get 10 s to finish
    /// their requests after the shutdown, then they are closed. An endpoint that fails, or ends by itself, stops the
    /// others too: a pod without its admin endpoint is restarted rather
    /// than left half-serving.
    ///
    /// Errors: [`ServeError::Exposed`] before anything is served, for a
    /// plaintext endpoint on a non-loopback address without
    /// [`EngineOptions::insecure`]; [`ServeError::Endpoint`] naming the
    /// first endpoint that failed or ended early.
    pub async fn serve(
        self,
        listeners: Listeners,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let Engine {
            coord,
            notifier,
            auth,
            tls,
            insecure,
        } = self;
        check_listeners(&listeners, tls.is_some(), insecure, true)?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut endpoints = spawn_endpoints(&coord, &auth, listeners, tls.as_ref(), &stop_rx);
        let mut background = coord.spawn_background();
        if let Some(tls) = &tls {
            background.push(tls.spawn_reloader());
        }
        if let Some((notifier, interval)) = notifier {
            background.push(notifier.spawn(interval));
        }
        let mut failed = tokio::select! {
            () = shutdown => None,
            Some(joined) = endpoints.join_next() => Some(ended_early(joined)),
            reason = coord.fleet_outranked() => Some(ServeError::Outranked(reason)),
        };
        let _ = stop_tx.send(true);
        let drained = tokio::time::timeout(DRAIN_GRACE, async {
            while let Some(joined) = endpoints.join_next().await {
                if let Err(e) = joined_result(joined) {
                    failed.get_or_insert(e);
                }
            }
        })
        .await;
        if drained.is_err() {
            // A client holding a request open (half sent) must not keep a
            // stopping engine, and its database lock, alive.
            tracing::warn!(
                grace_s = DRAIN_GRACE.as_secs(),
                "endpoints still had requests in flight after the grace period; closing them"
            );
            endpoints.abort_all();
        }
        for handle in background {
            handle.abort();
        }
        // The spans of the last nodes read their start from the store.
        crate::telemetry::flush_node_spans().await;
        coord.store().close().await;
        failed.map_or(Ok(()), Err)
    }
}

/// How long the endpoints may take to finish their requests after the
/// shutdown, as the gRPC API's own grace (`api::serve`): then they are
/// closed.
const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// What an endpoint task returns: its name, and how it ended.
type Ended = (&'static str, Result<(), String>);

/// Every listener's address against [`crate::tls::check_exposure`]; with
/// `warn`, a warning for each plaintext one `insecure` lets through.
fn check_listeners(
    listeners: &Listeners,
    tls: bool,
    insecure: bool,
    warn: bool,
) -> Result<(), ServeError> {
    let mut bound: Vec<(&'static str, &TcpListener)> = vec![("the gRPC API", &listeners.grpc)];
    if let Some(l) = &listeners.admin {
        bound.push(("the admin endpoint", l));
    }
    if let Some(CallbackListener::Own(l)) = &listeners.callbacks {
        bound.push(("the callback endpoint", l));
    }
    #[cfg(feature = "mcp-server")]
    if let Some((l, _)) = &listeners.mcp {
        bound.push(("the MCP endpoint", l));
    }
    for (endpoint, listener) in bound {
        let Ok(addr) = listener.local_addr() else {
            continue;
        };
        match crate::tls::check_exposure(endpoint, addr, tls, insecure) {
            Ok(Exposure::Fine) => {}
            Ok(Exposure::InsecureAllowed) if !warn => {}
            Ok(Exposure::InsecureAllowed) => tracing::warn!(
                endpoint, %addr,
                "serving plaintext on a non-loopback address (--insecure): whoever can reach it can read and change the traffic, API keys included"
            ),
            Err(e) => return Err(ServeError::Exposed(e)),
        }
    }
    Ok(())
}

fn spawn_endpoints(
    coord: &Arc<Coordinator>,
    auth: &Authenticator,
    listeners: Listeners,
    tls: Option<&ServerTls>,
    stop: &watch::Receiver<bool>,
) -> JoinSet<Ended> {
    let mut set = JoinSet::new();
    let http = |l: TcpListener| Listener::new(l, tls, Protocol::Http1);
    let grpc = Listener::new(listeners.grpc, tls, Protocol::Grpc);
    let api = crate::api::serve(Arc::clone(coord), auth.clone(), grpc, stopped(stop));
    set.spawn(async move { ("the gRPC API", api.await.map_err(|e| format!("{e:#}"))) });
    let callbacks_on_admin = matches!(listeners.callbacks, Some(CallbackListener::OnAdmin));
    if let Some(listener) = listeners.admin {
        let mut router = admin::router_for(Arc::clone(coord), auth.clone(), tls.is_some());
        if callbacks_on_admin {
            router = router.merge(crate::callbacks::routes(Arc::clone(coord)));
        }
        let serve = crate::tls::serve_http(http(listener), router, stopped(stop));
        set.spawn(async move {
            let result = serve.await.map_err(|e| e.to_string());
            ("the admin endpoint", result)
        });
    }
    if let Some(CallbackListener::Own(listener)) = listeners.callbacks {
        let serve = crate::callbacks::serve(Arc::clone(coord), http(listener), stopped(stop));
        set.spawn(async move {
            let result = serve.await.map_err(|e| e.to_string());
            ("the callback endpoint", result)
        });
    }
    #[cfg(feature = "mcp-server")]
    if let Some((listener, settings)) = listeners.mcp {
        let serve =
            crate::mcp_server::serve(Arc::clone(coord), settings, http(listener), stopped(stop));
        set.spawn(async move {
            let result = serve.await.map_err(|e| e.to_string());
            ("the MCP endpoint", result)
        });
    }
    set
}

/// A future that completes when `rx` turns true (or its sender is gone).
fn stopped(rx: &watch::Receiver<bool>) -> impl Future<Output = ()> + Send + 'static {
    let mut rx = rx.clone();
    async move {
        let _ = rx.wait_for(|stopped| *stopped).await;
    }
}

/// An endpoint that ended before the shutdown: its error, or that it
/// stopped unexpectedly.
fn ended_early(joined: Result<Ended, tokio::task::JoinError>) -> ServeError {
    match joined_result(joined) {
        Err(e) => e,
        Ok(endpoint) => ServeError::Endpoint {
            endpoint,
            message: "stopped unexpectedly".into(),
        },
    }
}

fn joined_result(
    joined: Result<Ended, tokio::task::JoinError>,
) -> Result<&'static str, ServeError> {
    match joined {
        Ok((endpoint, Ok(()))) => Ok(endpoint),
        Ok((endpoint, Err(message))) => Err(ServeError::Endpoint { endpoint, message }),
        Err(e) => Err(ServeError::Endpoint {
            endpoint: "an endpoint task",
            message: e.to_string(),
        }),
    }
}
