//! Size probe (docs/BENCHMARKS.md, issue 19): what prometheus-client costs the daemon, as
//! `size_none` plus the metric kinds src/metrics.rs uses (labelled counter families, an f64
//! counter, u64 gauges, histograms with units) and the OpenMetrics encoder.
use std::io::Read;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

fn main() {
    let mut body = Vec::new();
    std::io::stdin().read_to_end(&mut body).unwrap();
    let mut registry = Registry::with_prefix("agentd");
    let family = Family::<Vec<(&'static str, String)>, Counter>::default();
    registry.register("messages", "Messages", family.clone());
    let cost = Counter::<f64, AtomicU64>::default();
    registry.register("cost_usd", "Cost", cost.clone());
    let gauge = Gauge::<u64, AtomicU64>::default();
    registry.register("queue_depth", "Queue", gauge.clone());
    let histogram = Histogram::new([0.1, 1.0, 10.0]);
    registry.register_with_unit("duration", "Duration", Unit::Seconds, histogram.clone());
    family
        .get_or_create(&vec![("source", String::from_utf8_lossy(&body).into_owned())])
        .inc();
    cost.inc_by(body.len() as f64);
    gauge.set(body.len() as u64);
    histogram.observe(body.len() as f64);
    let mut out = String::new();
    encode(&mut out, &registry).unwrap();
    println!("{out}");
}
