//! The HTTP serving shared by the operations listener ([`ops`]) and the job API (`api`): an
//! accept loop of our own that bounds connections and header time ([`Limits`]).

pub mod ops;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// The `[http]` section: the operations listener.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    pub addr: SocketAddr,
    /// Connections served at once (probes, scrapes); more are closed as they arrive.
    pub max_connections: usize,
    /// A connection that takes longer to send its request headers is closed.
    pub header_timeout_ms: u64,
    pub max_body_bytes: usize,
}

impl HttpSettings {
    /// The accept loop's limits for this listener.
    pub fn limits(&self) -> Limits {
        Limits {
            max_connections: self.max_connections.max(1),
            header_timeout: Duration::from_millis(self.header_timeout_ms),
            max_body_bytes: self.max_body_bytes,
        }
    }
}

/// Limits that keep slow or many clients from exhausting the pod (file handles, tasks).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once; more are closed as they arrive.
    pub max_connections: usize,
    /// A connection whose request headers take longer (a slow client, or an idle keep-alive
    /// connection) is closed.
    pub header_timeout: Duration,
    /// Request bodies over this are refused (413) by `serve`'s routes, which take none.
    pub max_body_bytes: usize,
}

/// Binds `addr` and serves `app` on the bounded accept loop until `stop` is cancelled (also
/// the job API's listener, see `api`). Returns the bound address.
pub async fn serve_router(
    addr: SocketAddr,
    app: Router,
    limits: Limits,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(accept(listener, app, limits, stop));
    Ok(bound)
}

/// The accept loop: one task per connection, at most `max_connections`, each closed when its
/// headers are late; at `stop` no new connection is taken and open ones finish their request.
async fn accept(listener: TcpListener, app: Router, limits: Limits, stop: CancellationToken) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // EMFILE and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "http accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!("http connection refused: at the connection cap");
            continue; // dropping the stream closes it
        };
        let conn =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let stop = stop.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
}
