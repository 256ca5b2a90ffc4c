//! The deploy files end to end: `redis-server`, the daemon running the configuration from
//! the Kubernetes ConfigMap, and a real `prometheus` (Debian's package) scraping it with the
//! scrape config and the rules from `deploy/prometheus/`. Every recording rule and every
//! panel of the Grafana dashboard must return data, the alert rules must load and evaluate,
//! and none may fire on a healthy daemon. The build, process, HTTP and intake metrics are
//! checked as Prometheus stored them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::cli::SpawnPiped;
use crate::support::config::server_and_config;
use crate::support::daemon::Daemon;
use crate::support::redis::{free_port, RedisServer};
use crate::support::wait::wait_for;

/// Where the deploy files live.
fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `text` with `from` replaced by `to`, which must occur in it.
fn replaced(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "expected {from:?} in the deploy file");
    text.replace(from, to)
}

/// A `prometheus` child process on a loopback port with its own data directory, killed
/// on drop.
struct Prometheus {
    child: Child,
    base: String,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts prometheus with `deploy/prometheus/prometheus.yml` pointed at the daemon on
    /// `target_port`, scraping and evaluating every second.
    fn start(target_port: u16) -> Prometheus {
        let installed = Command::new("prometheus")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            installed,
            "prometheus is not installed: this test needs a real Prometheus \
             (scripts/ensure-prometheus, or apt-get install prometheus)"
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let src = deploy().join("prometheus");
        let mut config = read(&src.join("prometheus.yml"));
        let target = format!("127.0.0.1:{target_port}");
        for (from, to) in [
            ("127.0.0.1:9464", target.as_str()),
            ("scrape_interval: 15s", "scrape_interval: 1s"),
            ("evaluation_interval: 15s", "evaluation_interval: 1s"),
        ] {
            config = replaced(&config, from, to);
        }
        std::fs::write(dir.path().join("prometheus.yml"), config).expect("write config");
        std::fs::create_dir(dir.path().join("rules")).expect("rules dir");
        for rules in ["recording.yml", "alerts.yml"] {
            std::fs::copy(
                src.join("rules").join(rules),
                dir.path().join("rules").join(rules),
            )
            .expect("copy rules");
        }
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn prometheus");
        Prometheus {
            child,
            base: format!("http://127.0.0.1:{port}"),
            dir,
        }
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// GET an API path with query parameters; the `data` of a successful answer.
    async fn api(&self, path: &str, params: &[(&str, &str)]) -> Option<Value> {
        let answer: Value = reqwest::Client::new()
            .get(format!("{}{path}", self.base))
            .query(params)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (answer["status"] == "success").then(|| answer["data"].clone())
    }

    /// The series an instant query returns (none when it fails).
    async fn query(&self, expr: &str) -> Vec<Value> {
        self.api("/api/v1/query", &[("query", expr)])
            .await
            .and_then(|d| d["result"].as_array().cloned())
            .unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The config the Kubernetes ConfigMap is generated from (`config/rollboard.toml`, named
/// by the generator in `config/kustomization.yaml`, which `deploy/kubernetes` uses),
/// pointed at `redis` and `http_port`, with quick jobs.
fn configmap_config(dir: &Path, redis: &RedisServer, http_port: u16) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let layout = read(&deploy().join("kubernetes/kustomization.yaml"));
    assert!(
        layout.lines().any(|l| l.trim() == "- ../../config"),
        "deploy/kubernetes/kustomization.yaml does not use the config generator"
    );
    let generator = read(&root.join("config/kustomization.yaml"));
    let (_, generated) = generator
        .split_once("- name: rollboard-config\n")
        .expect("config/kustomization.yaml generates rollboard-config");
    let file = generated
        .lines()
        .skip_while(|l| l.trim() != "files:")
        .nth(1)
        .and_then(|l| l.trim().strip_prefix("- "))
        .expect("the generator's file");
    let toml = read(&root.join("config").join(file));
    let toml = replaced(&toml, "redis://127.0.0.1:6379", &redis.url());
    // Everything on one loopback port without tokens, as the Prometheus of this test
    // scrapes it (the Deployment's ROLLBOARD__HTTP__* variables are for the cluster).
    let toml = replaced(
        &toml,
        "listen = \"127.0.0.1:9464\"",
        &format!("listen = \"127.0.0.1:{http_port}\""),
    );
    let toml = replaced(&toml, "roll = \"0 * * * * *\"", "roll = \"*/2 * * * * *\"");
    let toml = replaced(
        &toml,
        "resummarize = \"0 * * * * *\"",
        "resummarize = \"*/2 * * * * *\"",
    );
    let path = dir.join("rollboard.toml");
    std::fs::write(&path, toml).expect("write config");
    path
}

/// Every `- <key>: <name>` entry of a rules file.
fn rule_names(text: &str, key: &str) -> Vec<String> {
    let prefix = format!("- {key}: ");
    text.lines()
        .filter_map(|l| l.trim().strip_prefix(prefix.as_str()))
        .map(|n| n.trim().to_string())
        .collect()
}

/// Every panel expression of the dashboard, with its variables filled in as Grafana would.
fn panel_queries() -> Vec<(String, String)> {
    let dashboard: Value =
        serde_json::from_str(&read(&deploy().join("grafana/rollboard.json"))).expect("JSON");
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("expr");
            let expr = expr
                .replace("$__rate_interval", "30s")
                .replace("$job", "rollboard")
                .replace("$instance", ".*");
            assert!(!expr.contains('$'), "unknown variable in {expr}");
            out.push((panel["title"].as_str().unwrap_or("").to_string(), expr));
        }
    }
    out
}

/// Tips for every board of the shipped config, `n` of them from `start`.
fn tips(start: usize, n: usize) -> Value {
    let events: Vec<Value> = (start..start + n)
        .map(|i| {
            json!({"room": format!("room{}", i % 7), "user": format!("user{}", i % 13),
                   "amount": (1 + i % 50).to_string(), "value": format!("{}.25", i % 20),
                   "id": format!("e2e-{i}")})
        })
        .collect();
    Value::Array(events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_daemon_with_the_deploy_files() {
    let (_redis, _dir, http_port, config) = server_and_config(configmap_config);
    let daemon = Daemon::start(&config, http_port).await;
    let prometheus = Prometheus::start(http_port);

    // Traffic for the whole test: tips through the intake, and queries of every kind.
    let base = daemon.base.clone();
    let traffic = tokio::spawn(async move {
        let client = reqwest::Client::new();
        for round in 0.. {
            let r = client
                .post(format!("{base}/v1/events"))
                .json(&tips(round * 20, 20))
                .send()
                .await;
            assert!(
                r.is_ok_and(|r| r.status().as_u16() == 202),
                "intake refused tips"
            );
            for path in [
                "/v1/boards/rooms_7d/top?limit=5",
                "/v1/boards/fans_7d/top?scope=room1",
                "/v1/boards/tips_24h/members/user1",
                "/v1/boards/rooms_7d/members/room2/around?radius=2",
                "/readyz",
                "/v1/boards/no_such_board/top",
                "/no/such/path",
            ] {
                let _ = client.get(format!("{base}{path}")).send().await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });

    let up = wait_for(Duration::from_secs(60), || async {
        prometheus
            .api("/api/v1/targets", &[])
            .await
            .and_then(|d| d["activeTargets"].as_array().cloned())
            .is_some_and(|t| {
                t.iter()
                    .any(|t| t["labels"]["job"] == "rollboard" && t["health"] == "up")
            })
    })
    .await;
    assert!(
        up,
        "prometheus never reported the rollboard target up; log:\n{}",
        prometheus.logs()
    );

    // Every recording rule and every dashboard panel returns data.
    let recording = read(&deploy().join("prometheus/rules/recording.yml"));
    let mut queries: Vec<(String, String)> = rule_names(&recording, "record")
        .into_iter()
        .map(|r| (format!("recording rule {r}"), r))
        .collect();
    assert!(queries.len() >= 3, "recording rules not found");
    let panels = panel_queries();
    assert!(panels.len() >= 10, "dashboard queries not found");
    queries.extend(panels.into_iter().map(|(t, e)| (format!("panel {t:?}"), e)));
    let mut empty = Vec::new();
    for (what, expr) in &queries {
        let has_data = wait_for(Duration::from_secs(30), || async {
            !prometheus.query(expr).await.is_empty()
        })
        .await;
        if !has_data {
            empty.push(format!("{what}: {expr}"));
        }
    }
    assert!(
        empty.is_empty(),
        "queries that return no data:\n{}",
        empty.join("\n")
    );
    // The apply and query histograms saw real traffic, not just their zeroes.
    for expr in [
        "sum(rollboard_events_applied_total) > 0",
        "sum(rollboard_script_duration_seconds_count{script=\"fold\"}) > 0",
        "sum(rollboard_http_request_duration_seconds_count{route=\"/v1/boards/{board}/top\"}) > 0",
        // The operator's metrics, as Prometheus stored them from real scrapes.
        "rollboard_build_info{job=\"rollboard\", version!=\"\", commit!=\"\"} == 1",
        "process_resident_memory_bytes{job=\"rollboard\"} > 0",
        "process_cpu_seconds_total{job=\"rollboard\"} > 0",
        "rollboard_http_requests_total{route=\"/v1/events\", status=\"202\"} > 0",
        "rollboard_http_requests_total{route=\"/v1/boards/{board}/top\", status=\"200\"} > 0",
        "rollboard_http_requests_total{route=\"/v1/boards/{board}/top\", status=\"404\"} > 0",
        "rollboard_http_requests_total{route=\"unmatched\", status=\"404\"} > 0",
        "rollboard_intake_events_total{result=\"accepted\"} > 0",
        "min(rollboard_window_start_timestamp_seconds) > 1.7e9",
        "job:rollboard_consumers:count == 1",
    ] {
        assert!(
            wait_for(Duration::from_secs(30), || async {
                !prometheus.query(expr).await.is_empty()
            })
            .await,
            "no data for {expr}"
        );
    }

    // Every alert rule is loaded and evaluates without error.
    let alerts = rule_names(
        &read(&deploy().join("prometheus/rules/alerts.yml")),
        "alert",
    );
    assert!(alerts.len() >= 7, "alert rules not found");
    assert!(
        alerts.iter().any(|a| a == "RollboardAbsent"),
        "the alert on a missing target is not among {alerts:?}"
    );
    let healthy = wait_for(Duration::from_secs(30), || async {
        let Some(data) = prometheus.api("/api/v1/rules", &[("type", "alert")]).await else {
            return false;
        };
        let rules: Vec<Value> = data["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        alerts.iter().all(|name| {
            rules.iter().any(|r| {
                r["name"] == name.as_str() && r["health"] == "ok" && r["lastEvaluation"].is_string()
            })
        })
    })
    .await;
    let rules = prometheus.api("/api/v1/rules", &[]).await;
    assert!(
        healthy,
        "alert rules did not all load and evaluate: {rules:#?}"
    );

    // None fires, or is even pending, on a healthy daemon.
    let active_alerts = || async {
        prometheus
            .api("/api/v1/alerts", &[])
            .await
            .and_then(|d| d["alerts"].as_array().cloned())
            .unwrap_or_default()
    };
    // One exception, the one alert about the host rather than the daemon: a script call
    // slower than 100 ms, round trip included, which a loaded two-core machine can make;
    // pending only if the daemon did measure such a call.
    let unexplained = || async {
        let active = active_alerts().await;
        let (_, exposition) = daemon.get("/metrics").await;
        let slow = slow_script_calls(&exposition) > 0.0;
        active
            .into_iter()
            .filter(|a| !(slow && a["labels"]["alertname"] == "RollboardSlowScriptCalls"))
            .collect::<Vec<Value>>()
    };
    let quiet = wait_for(Duration::from_secs(20), || async {
        unexplained().await.is_empty()
    })
    .await;
    let active = unexplained().await;
    assert!(quiet, "alerts active on a healthy daemon: {active:#?}");

    // The exposition stays clean for promtool.
    let (_, body) = daemon.get("/metrics").await;
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .spawn_piped("promtool");
    {
        use std::io::Write;
        let mut stdin = check.stdin.take().expect("stdin");
        stdin.write_all(body.as_bytes()).expect("write metrics");
    }
    let out = check.wait_with_output().expect("promtool output");
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    traffic.abort();
    assert!(daemon.terminate().await.success());
}

/// Script calls the daemon measured above 100 ms (`rollboard_script_duration_seconds`:
/// every call less those in the 0.1 s bucket), from its exposition text.
fn slow_script_calls(exposition: &str) -> f64 {
    let sum = |prefix: &str, filter: &dyn Fn(&str) -> bool| -> f64 {
        exposition
            .lines()
            .filter(|l| l.starts_with(prefix) && filter(l))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    sum("rollboard_script_duration_seconds_count", &|_| true)
        - sum("rollboard_script_duration_seconds_bucket", &|l| {
            l.contains("le=\"0.1\"")
        })
}
