//! The PostgreSQL cluster the harness restarts: found with `pg_lsclusters`
//! (the cluster listening on the port of `--database-url`), restarted with
//! `pg_ctlcluster --skip-systemctl-redirect <version> <name> restart -m
//! immediate` (a crash, as far as clients can tell: no checkpoint, every
//! connection cut), and waited for until it answers again. At the end the
//! harness makes sure it is up, starting it if a restart left it down.

use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use sqlx::Connection;
use tokio::process::Command;
use tokio::time::Instant;

/// One cluster of `pg_lsclusters`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// Major version, e.g. `15`.
    pub version: String,
    /// Cluster name, e.g. `main`.
    pub name: String,
    /// The port it listens on.
    pub port: u16,
}

impl std::fmt::Display for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} (port {})", self.version, self.name, self.port)
    }
}

/// The clusters in `pg_lsclusters --no-header` output (`Ver Cluster Port
/// Status Owner Data-directory Log-file`, blank-separated).
pub fn parse_clusters(text: &str) -> Vec<Cluster> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let version = fields.next()?.to_owned();
            let name = fields.next()?.to_owned();
            let port = fields.next()?.parse().ok()?;
            Some(Cluster {
                version,
                name,
                port,
            })
        })
        .collect()
}

/// `VERSION/NAME` as given to `--pg-cluster`.
///
/// Errors: not of that form.
pub fn parse_cluster_arg(text: &str, port: u16) -> Result<Cluster> {
    let (version, name) = text
        .split_once('/')
        .filter(|(v, n)| !v.is_empty() && !n.is_empty())
        .ok_or_else(|| anyhow!("--pg-cluster {text:?}: expected VERSION/NAME, e.g. 15/main"))?;
    Ok(Cluster {
        version: version.to_owned(),
        name: name.to_owned(),
        port,
    })
}

/// The cluster listening on `port`.
///
/// Errors: `pg_lsclusters` missing or failing, or no cluster on that port.
pub async fn find_cluster(port: u16) -> Result<Cluster> {
    let output = Command::new("pg_lsclusters")
        .arg("--no-header")
        .output()
        .await
        .context(
            "running pg_lsclusters (PostgreSQL restarts need Debian's postgresql-common; \
             pass --no-pg-restarts to go without them)",
        )?;
    if !output.status.success() {
        bail!(
            "pg_lsclusters failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let clusters = parse_clusters(&String::from_utf8_lossy(&output.stdout));
    clusters
        .iter()
        .find(|c| c.port == port)
        .cloned()
        .ok_or_else(|| {
            anyhow!(
                "no PostgreSQL cluster listens on port {port} (pg_lsclusters lists {:?}); \
                 name one with --pg-cluster VERSION/NAME or pass --no-pg-restarts",
                clusters.iter().map(ToString::to_string).collect::<Vec<_>>()
            )
        })
}

async fn ctl(cluster: &Cluster, args: &[&str]) -> Result<()> {
    let output = Command::new("pg_ctlcluster")
        .arg("--skip-systemctl-redirect")
        .arg(&cluster.version)
        .arg(&cluster.name)
        .args(args)
        .output()
        .await
        .context("running pg_ctlcluster")?;
    if !output.status.success() {
        bail!(
            "pg_ctlcluster {cluster} {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// Restarts `cluster` in immediate mode; returns how long it took.
///
/// Errors: `pg_ctlcluster` failing.
pub async fn restart(cluster: &Cluster) -> Result<Duration> {
    let started = Instant::now();
    ctl(cluster, &["restart", "-m", "immediate"]).await?;
    Ok(started.elapsed())
}

/// Waits until a connection to `url` answers `SELECT 1`.
///
/// Errors: none did within `timeout` (the last error).
pub async fn wait_ready(url: &str, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let attempt = async {
            let mut conn = sqlx::PgConnection::connect(url).await?;
            sqlx::query("SELECT 1").execute(&mut conn).await?;
            conn.close().await
        };
        match tokio::time::timeout(Duration::from_secs(5), attempt).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) if Instant::now() > deadline => {
                bail!(
                    "PostgreSQL at {url} did not answer within {} s: {e}",
                    timeout.as_secs()
                )
            }
            Err(_) if Instant::now() > deadline => {
                bail!(
                    "PostgreSQL at {url} did not answer within {} s",
                    timeout.as_secs()
                )
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Makes sure `cluster` answers at `url`: waits for it, and starts it when
/// it does not answer (a restart that failed half-way leaves it down).
///
/// Errors: it still does not answer.
pub async fn ensure_up(cluster: Option<&Cluster>, url: &str) -> Result<()> {
    if wait_ready(url, Duration::from_secs(20)).await.is_ok() {
        return Ok(());
    }
    if let Some(cluster) = cluster {
        // "already running" fails too; what counts is whether it answers.
        let started = ctl(cluster, &["start"]).await;
        if let Err(e) = started {
            tracing::warn!(error = %e, "starting PostgreSQL");
        }
    }
    wait_ready(url, Duration::from_secs(60)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clusters_are_read_from_pg_lsclusters() {
        let text = "15  main    5432 online postgres /var/lib/postgresql/15/main /var/log/postgresql/postgresql-15-main.log\n\
                    16  chaos   5433 down   postgres /var/lib/postgresql/16/chaos /var/log/x.log\n\
                    garbage\n";
        assert_eq!(
            parse_clusters(text),
            vec![
                Cluster {
                    version: "15".into(),
                    name: "main".into(),
                    port: 5432
                },
                Cluster {
                    version: "16".into(),
                    name: "chaos".into(),
                    port: 5433
                },
            ]
        );
        assert_eq!(
            parse_cluster_arg("15/main", 5432).map(|c| c.name).ok(),
            Some("main".into())
        );
        assert!(parse_cluster_arg("15", 5432).is_err());
        assert!(parse_cluster_arg("/main", 5432).is_err());
    }
}
