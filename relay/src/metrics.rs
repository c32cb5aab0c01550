//! `--metrics-addr`: the relay's metrics in Prometheus's text format (OpenMetrics, from
//! `prometheus-client`), served at `/metrics` by a thread of their own (`tiny_http`).
//! docs/operations/relay.md lists them.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    pub cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    /// `oracle`, or the cluster's name.
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// `oracle`, or the cluster's name.
    pub source: String,
    pub message: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// Every metric of the relay (cheap to update whether or not they are served).
#[derive(Clone, Default)]
pub struct Metrics {
    rows: Family<ClusterLabels, Counter>,
    rounds: Family<ClusterLabels, Counter>,
    errors: Family<SourceLabels, Counter>,
    cursor: Gauge<i64, AtomicI64>,
    cursor_physical: FloatGauge,
    cursor_advanced: FloatGauge,
    lag: FloatGauge,
    last_error: Family<ErrorLabels, Gauge>,
    last_error_time: FloatGauge,
}

fn now_seconds() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The physical part of a tsoracle timestamp, in milliseconds (0 for a negative value: none).
pub fn physical_ms(ts: i64) -> i64 {
    tsoracle_core::timestamp::physical_ms(u64::try_from(ts).unwrap_or(0)) as i64
}

/// The same in seconds.
pub fn physical_seconds(ts: i64) -> f64 {
    physical_ms(ts) as f64 / 1000.0
}

/// A label value as the text format writes it (prometheus-client writes label values as they
/// are): backslash, double quote and newline escaped; at most 400 characters.
fn escaped(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for ch in v.chars().take(400) {
        match ch {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

impl Metrics {
    pub fn new(clusters: &[String]) -> Metrics {
        let m = Metrics::default();
        for c in clusters {
            let l = ClusterLabels { cluster: c.clone() };
            // Present from the start at 0, so a rate over them is defined.
            drop(m.rows.get_or_create(&l));
            drop(m.rounds.get_or_create(&l));
        }
        m.cursor_advanced.set(now_seconds());
        m
    }

    fn registry(&self) -> Registry {
        let mut r = Registry::with_prefix("tsoracle_relay");
        r.register("rows", "Rows emitted (written and synced), per cluster", self.rows.clone());
        r.register(
            "rounds",
            "Rounds that read the cluster's outbox up to R_f and emitted its rows",
            self.rounds.clone(),
        );
        r.register(
            "errors",
            "Errors met, per source (oracle, or a cluster's name); each is retried",
            self.errors.clone(),
        );
        r.register(
            "cursor",
            "The cursor: every row at or below this timestamp has been emitted",
            self.cursor.clone(),
        );
        r.register(
            "cursor_physical_seconds",
            "The cursor's physical part, Unix seconds",
            self.cursor_physical.clone(),
        );
        r.register(
            "cursor_advanced_timestamp_seconds",
            "When the cursor last moved (the relay's start before it first does), Unix seconds",
            self.cursor_advanced.clone(),
        );
        r.register(
            "resolved_lag_seconds",
            "At the last round, how far R_f lagged the oracle's newest value (tso_status().last_issued)",
            self.lag.clone(),
        );
        r.register(
            "last_error_info",
            "The last error (1; absent before the first)",
            self.last_error.clone(),
        );
        r.register(
            "last_error_timestamp_seconds",
            "When the last error happened, Unix seconds (0 before the first)",
            self.last_error_time.clone(),
        );
        r
    }

    /// A round emitted `rows[i]` rows of cluster `names[i]`, and the cursor is now `cursor`.
    pub fn round(&self, names: &[String], rows: &[u64], cursor: i64) {
        for (name, n) in names.iter().zip(rows) {
            let l = ClusterLabels { cluster: name.clone() };
            self.rows.get_or_create(&l).inc_by(*n);
            self.rounds.get_or_create(&l).inc();
        }
        if self.cursor.get() != cursor {
            self.cursor_advanced.set(now_seconds());
        }
        self.start_at(cursor);
    }

    /// The cursor the relay starts from (or has reached).
    pub fn start_at(&self, cursor: i64) {
        self.cursor.set(cursor);
        self.cursor_physical.set(physical_seconds(cursor));
    }

    pub fn lag(&self, seconds: f64) {
        self.lag.set(seconds.max(0.0));
    }

    pub fn error(&self, source: &str, message: &str) {
        self.errors.get_or_create(&SourceLabels { source: escaped(source) }).inc();
        self.last_error.clear();
        let labels = ErrorLabels { source: escaped(source), message: escaped(message) };
        self.last_error.get_or_create(&labels).set(1);
        self.last_error_time.set(now_seconds());
    }

    /// The text a scrape gets.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry());
        text
    }

    /// Serve `/metrics` at `addr` on a thread of its own; the address it listens on.
    pub fn serve(&self, addr: SocketAddr) -> Result<SocketAddr, String> {
        let server = tiny_http::Server::http(addr).map_err(|e| e.to_string())?;
        let bound = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| "not listening on an IP address".to_string())?;
        let server = Arc::new(server);
        let metrics = self.clone();
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                for request in server.incoming_requests() {
                    let response = if request.url() == "/metrics" {
                        let header = tiny_http::Header::from_bytes(
                            &b"Content-Type"[..],
                            &b"application/openmetrics-text; version=1.0.0; charset=utf-8"[..],
                        );
                        let mut r = tiny_http::Response::from_string(metrics.encode());
                        if let Ok(h) = header {
                            r = r.with_header(h);
                        }
                        r
                    } else {
                        tiny_http::Response::from_string("see /metrics\n").with_status_code(404)
                    };
                    // A scraper that went away is no concern of the relay's.
                    let _ = request.respond(response);
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_names_every_metric() {
        let m = Metrics::new(&["a".into(), "b".into()]);
        m.round(&["a".into(), "b".into()], &[3, 0], 5 << 18);
        m.round(&["a".into(), "b".into()], &[1, 2], 7 << 18);
        m.lag(-1.0);
        m.error("b", "first");
        m.error("oracle", "say \"why\"");
        let t = m.encode();
        for line in [
            "tsoracle_relay_rows_total{cluster=\"a\"} 4",
            "tsoracle_relay_rows_total{cluster=\"b\"} 2",
            "tsoracle_relay_rounds_total{cluster=\"b\"} 2",
            "tsoracle_relay_errors_total{source=\"oracle\"} 1",
            "tsoracle_relay_cursor 1835008",
            "tsoracle_relay_cursor_physical_seconds 0.007",
            "tsoracle_relay_resolved_lag_seconds 0.0",
            "tsoracle_relay_last_error_info{source=\"oracle\",message=\"say \\\"why\\\"\"} 1",
        ] {
            assert!(t.lines().any(|l| l == line), "{line} in:\n{t}");
        }
        assert!(!t.contains("message=\"first\""), "only the last error: {t}");
        assert!(t.contains("# TYPE tsoracle_relay_rows counter"), "{t}");
    }
}
