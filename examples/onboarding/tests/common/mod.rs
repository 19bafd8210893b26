//! Helpers shared by the integration tests: in-process servers on ephemeral
//! ports and an HTTP client that ignores proxy settings.

#![allow(dead_code, missing_docs)]

use std::sync::Arc;

use belay_example_onboarding::crm_server::{CrmState, serve_crm_server};
use belay_example_onboarding::model_server::{ModelServerState, Script, serve_model_server};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A server running in-process until [`Running::stop`] (or drop).
pub struct Running<S> {
    pub url: String,
    pub state: Arc<S>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl<S> Running<S> {
    /// Triggers the shutdown future and waits until the serve function returns.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("server task").expect("server result");
        }
    }
}

impl<S> Drop for Running<S> {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn listener() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    (listener, url)
}

pub async fn start_model(script: Script, api_key: Option<&str>) -> Running<ModelServerState> {
    let (listener, url) = listener().await;
    let state = Arc::new(ModelServerState::new(script, api_key.map(str::to_owned)));
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve_model_server(listener, state.clone(), async move {
        let _ = stopped.await;
    }));
    Running {
        url,
        state,
        stop: Some(stop),
        task: Some(task),
    }
}

pub async fn start_onboarding_model() -> Running<ModelServerState> {
    start_model(Script::onboarding().expect("embedded script"), None).await
}

pub async fn start_crm() -> Running<CrmState> {
    let (listener, url) = listener().await;
    let state = Arc::new(CrmState::new());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve_crm_server(listener, state.clone(), async move {
        let _ = stopped.await;
    }));
    Running {
        url,
        state,
        stop: Some(stop),
        task: Some(task),
    }
}

/// A client that never goes through a proxy from the environment.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
}
