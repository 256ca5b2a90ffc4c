//! Bearer tokens as an operator runs them: tokens guarding the intake, the queries and the
//! metrics; tokens rotated through their files while clients keep posting (a Kubernetes
//! Secret's symlink swap, SIGHUP, a file that breaks); the refusal of an anonymous intake off
//! loopback; and the admin listener.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::cli::run_rollboard;
use crate::support::config::{config_for, edit_config, write_config, write_config_url, write_file};
use crate::support::daemon::Daemon;
use crate::support::events::tips;
use crate::support::redis::{free_port, RedisServer};
use crate::support::wait::wait_for;

/// A directory laid out as the kubelet mounts a Secret: `<key>` is a symlink to
/// `..data/<key>`, `..data` a symlink to a timestamped directory; an update writes a new
/// directory and renames a new `..data` link over the old one, so a reader sees the old
/// content or the new, never a partial file.
struct SecretDir {
    dir: PathBuf,
    version: usize,
}

impl SecretDir {
    fn new(dir: &Path, key: &str, content: &str) -> SecretDir {
        std::fs::create_dir_all(dir).expect("secret dir");
        let mut secret = SecretDir {
            dir: dir.to_path_buf(),
            version: 0,
        };
        secret.update(key, content);
        std::os::unix::fs::symlink(format!("..data/{key}"), dir.join(key)).expect("key link");
        secret
    }

    fn update(&mut self, key: &str, content: &str) {
        self.version += 1;
        let version = format!("..2026_v{}", self.version);
        std::fs::create_dir(self.dir.join(&version)).expect("version dir");
        std::fs::write(self.dir.join(&version).join(key), content).expect("write key");
        let staged = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&version, &staged).expect("staged link");
        std::fs::rename(&staged, self.dir.join("..data")).expect("swap ..data");
    }
}

/// One valid tip, unique per `id`.
fn tip(id: &str) -> String {
    let now = rollboard::domain::clock::local_ms();
    format!(
        "{{\"room\":\"r1\",\"user\":\"u1\",\"amount\":1,\"value\":\"1.00\",\"id\":\"{id}\",\"ts\":{}}}",
        now - 1_000
    )
}

/// `<setting> = "<path>"` and `token_reload_interval = "<reload>"`: `[http]` lines for a
/// token file re-read every `reload`.
fn reloaded(setting: &str, path: &Path, reload: &str) -> String {
    format!(
        "{setting} = \"{}\"\ntoken_reload_interval = \"{reload}\"",
        path.display()
    )
}

/// A fresh redis-server and a daemon on it, its configuration (for `consumer`, with the
/// `[http]` lines `http`) written in `dir`.
async fn started(dir: &Path, consumer: &str, http: &str) -> (RedisServer, Daemon) {
    let redis = RedisServer::start();
    let http_port = free_port();
    let config = write_config(dir, &redis, http_port, consumer, http);
    let daemon = Daemon::start(&config, http_port).await;
    (redis, daemon)
}

/// `GET url` without a token is refused with a challenge; the answer to it with `token`.
async fn challenged_then_with(
    client: &reqwest::Client,
    url: &str,
    token: &str,
) -> reqwest::Response {
    let response = client.get(url).send().await.expect("get");
    assert_eq!(response.status().as_u16(), 401);
    assert!(response.headers().contains_key("www-authenticate"));
    client
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .expect("get")
}

/// The status of `POST /v1/events` with one tip, carrying `token` when given.
async fn post(client: &reqwest::Client, base: &str, token: Option<&str>, id: &str) -> u16 {
    let mut request = client
        .post(format!("{base}/v1/events"))
        .header("content-type", "application/json")
        .body(tip(id));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.map_or(0, |r| r.status().as_u16())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_through_a_mounted_secret_refuses_no_request_with_a_valid_token() {
    let dir = tempfile::tempdir().expect("dir");
    let (old, new) = ("rotation-old-token-3b7e", "rotation-new-token-91cd");
    let secret = dir.path().join("tokens");
    let mut mount = SecretDir::new(&secret, "intake", &format!("{old}\n"));
    let http = reloaded("intake_token_file", &secret.join("intake"), "1s");
    let (_redis, daemon) = started(dir.path(), "rotate", &http).await;
    let client = reqwest::Client::new();

    // The client posts without pause, with the old token until told to use the new one.
    let use_new = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let producer = {
        let (client, base) = (client.clone(), daemon.base.clone());
        let (use_new, stop) = (use_new.clone(), stop.clone());
        let (sent, refused) = (sent.clone(), refused.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                i += 1;
                let token = if use_new.load(Ordering::SeqCst) {
                    new
                } else {
                    old
                };
                let status = post(&client, &base, Some(token), &format!("rot-{i}")).await;
                sent.fetch_add(1, Ordering::SeqCst);
                if status != 202 {
                    refused.fetch_add(1, Ordering::SeqCst);
                    eprintln!("request {i} answered {status}");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let sent_after = |n: usize| {
        let sent = sent.clone();
        async move {
            let target = sent.load(Ordering::SeqCst) + n;
            wait_for(Duration::from_secs(20), || async {
                sent.load(Ordering::SeqCst) >= target
            })
            .await
        }
    };
    assert!(sent_after(10).await);
    assert_eq!(post(&client, &daemon.base, Some(new), "probe-0").await, 401);

    // Step 1: the Secret holds both; once the daemon takes the new one, the client moves.
    mount.update("intake", &format!("{old}\n{new}\n"));
    let both = wait_for(Duration::from_secs(10), || async {
        post(&client, &daemon.base, Some(new), "probe-1").await == 202
    })
    .await;
    assert!(both, "the new token was never accepted:\n{}", daemon.logs());
    assert!(sent_after(10).await);
    use_new.store(true, Ordering::SeqCst);
    assert!(sent_after(10).await);

    // Step 2: the Secret holds only the new token; the old one is refused from then on.
    mount.update("intake", &format!("{new}\n"));
    let retired = wait_for(Duration::from_secs(10), || async {
        post(&client, &daemon.base, Some(old), "probe-2").await == 401
    })
    .await;
    assert!(
        retired,
        "the old token is still accepted:\n{}",
        daemon.logs()
    );
    assert!(sent_after(10).await);
    stop.store(true, Ordering::SeqCst);
    producer.await.expect("producer");

    assert_eq!(post(&client, &daemon.base, Some(old), "probe-3").await, 401);
    assert_eq!(post(&client, &daemon.base, None, "probe-4").await, 401);
    assert_eq!(refused.load(Ordering::SeqCst), 0, "{}", daemon.logs());
    assert!(sent.load(Ordering::SeqCst) >= 50);
    let logs = daemon.logs();
    assert!(logs.contains("tokens re-read"), "{logs}");
    assert!(!logs.contains(old) && !logs.contains(new), "{logs}");
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn sighup_re_reads_the_token_files_at_once() {
    let dir = tempfile::tempdir().expect("dir");
    let (first, second) = ("hup-reader-token-1a", "hup-reader-token-2b");
    let file = write_file(dir.path(), "reader.token", first);
    // Polled hourly: only the signal can explain a re-read within the test.
    let http = reloaded("query_token_file", &file, "1h");
    let (_redis, daemon) = started(dir.path(), "hup", &http).await;
    let client = reqwest::Client::new();
    let boards = format!("{}/v1/boards", daemon.base);
    let status = |token: &'static str| {
        let request = client.get(&boards).bearer_auth(token);
        async move { request.send().await.map_or(0, |r| r.status().as_u16()) }
    };
    assert_eq!(status(first).await, 200);

    std::fs::write(&file, second).expect("write");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(status(second).await, 401, "re-read without a signal");
    assert_eq!(status(first).await, 200);

    daemon.send_signal("HUP");
    let reread = wait_for(Duration::from_secs(5), || async {
        status(second).await == 200
    })
    .await;
    assert!(reread, "SIGHUP did not re-read:\n{}", daemon.logs());
    assert_eq!(status(first).await, 401);
    assert_eq!(
        daemon.get("/healthz").await.0,
        200,
        "SIGHUP ended the daemon"
    );
    assert!(daemon.logs().contains("SIGHUP"));
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn an_emptied_or_removed_token_file_keeps_the_last_tokens() {
    let dir = tempfile::tempdir().expect("dir");
    let (kept, next) = ("kept-intake-token-77", "next-intake-token-88");
    let file = write_file(dir.path(), "intake.token", &format!("{kept}\n"));
    let reload = reloaded("intake_token_file", &file, "1s");
    let (_redis, daemon) = started(dir.path(), "empty", &reload).await;
    let client = reqwest::Client::new();
    assert_eq!(post(&client, &daemon.base, Some(kept), "e-0").await, 202);

    std::fs::write(&file, "\n").expect("empty the file");
    daemon.wait_log("the token file is empty").await;
    assert_eq!(post(&client, &daemon.base, Some(kept), "e-1").await, 202);
    assert_eq!(post(&client, &daemon.base, None, "e-2").await, 401);
    assert_eq!(post(&client, &daemon.base, Some(""), "e-3").await, 401);
    let stale = [("role", "intake")];
    assert_eq!(
        daemon.metric("rollboard_token_file_stale", &stale).await,
        1.0
    );

    std::fs::remove_file(&file).expect("remove the file");
    daemon.wait_log("cannot read the token file").await;
    assert_eq!(post(&client, &daemon.base, Some(kept), "e-4").await, 202);
    assert_eq!(post(&client, &daemon.base, None, "e-5").await, 401);

    std::fs::write(&file, next).expect("write");
    let replaced = wait_for(Duration::from_secs(10), || async {
        post(&client, &daemon.base, Some(next), "e-6").await == 202
    })
    .await;
    assert!(replaced, "{}", daemon.logs());
    assert_eq!(post(&client, &daemon.base, Some(kept), "e-7").await, 401);
    assert_eq!(
        daemon.metric("rollboard_token_file_stale", &stale).await,
        0.0
    );
    assert_eq!(
        daemon.metric("rollboard_token_reloads_total", &stale).await,
        1.0
    );
    let logs = daemon.logs();
    assert!(!logs.contains(kept) && !logs.contains(next), "{logs}");
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn an_anonymous_intake_off_loopback_is_refused_unless_allowed() {
    let redis = RedisServer::start();
    let (_dir, http_port, config) = config_for(&redis, "anon", "");
    let loopback = format!("listen = \"127.0.0.1:{http_port}\"");
    let exposed = format!("listen = \"0.0.0.0:{http_port}\"");
    edit_config(&config, &loopback, &exposed);

    // Refused before anything else: no Redis call, no port opened.
    let out = run_rollboard(&config, &["run"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("http.allow_anonymous") && stderr.contains("http.listen"),
        "{stderr}"
    );
    assert!(std::net::TcpListener::bind(("0.0.0.0", http_port)).is_ok());

    edit_config(
        &config,
        &exposed,
        &format!("{exposed}\nallow_anonymous = true"),
    );
    let daemon = Daemon::start(&config, http_port).await;
    let client = reqwest::Client::new();
    assert_eq!(post(&client, &daemon.base, None, "anon-0").await, 202);
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn admin_listen_serves_metrics_and_probes_and_the_api_port_does_not() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("dir");
    let token = write_file(dir.path(), "intake.token", "admin-test-intake-token\n");
    let (api_port, admin_port) = (free_port(), free_port());
    let config = write_config(
        dir.path(),
        &redis,
        api_port,
        "admin",
        &format!(
            "admin_listen = \"127.0.0.1:{admin_port}\"\nintake_token_file = \"{}\"",
            token.display()
        ),
    );
    // An intake with a token may listen on every address.
    edit_config(
        &config,
        &format!("listen = \"127.0.0.1:{api_port}\""),
        &format!("listen = \"0.0.0.0:{api_port}\""),
    );
    let admin = Daemon::spawn(&config, admin_port);
    admin.wait_up().await;
    let api = format!("http://127.0.0.1:{api_port}");
    let get = |url: String| async move {
        reqwest::get(url)
            .await
            .map_or(0, |response| response.status().as_u16())
    };

    let ready = admin.readyz_becomes(200, Duration::from_secs(20)).await;
    assert!(ready, "{}", admin.logs());
    let (status, body) = admin.get("/metrics").await;
    assert_eq!(status, 200);
    assert!(body.contains("rollboard_events_applied_total"));
    assert_eq!(admin.get("/healthz").await.0, 200);
    assert_eq!(admin.get("/v1/boards").await.0, 404);

    assert_eq!(get(format!("{api}/v1/boards")).await, 200);
    for path in ["/metrics", "/healthz", "/readyz"] {
        assert_eq!(get(format!("{api}{path}")).await, 404, "{path}");
    }
    let client = reqwest::Client::new();
    assert_eq!(
        post(&client, &api, Some("admin-test-intake-token"), "adm-0").await,
        202
    );
    assert_eq!(post(&client, &api, None, "adm-1").await, 401);
    assert!(admin.logs().contains("admin http listening"));
    assert!(admin.terminate().await.success());
}

#[tokio::test]
async fn bearer_tokens_guard_the_intake_and_the_queries() {
    let (producer, reader) = ("producer-token-41f9", "reader-token-8c2d");
    let dir = tempfile::tempdir().expect("dir");
    let producer_file = write_file(dir.path(), "producer.token", &format!("{producer}\n"));
    let reader_file = write_file(dir.path(), "reader.token", reader);
    let http = format!(
        "intake_token_file = \"{}\"\nquery_token_file = \"{}\"",
        producer_file.display(),
        reader_file.display()
    );
    let (_redis, daemon) = started(dir.path(), "auth", &http).await;
    let client = reqwest::Client::new();
    let events = format!("[{}]", tips("auth", 3).trim().replace('\n', ","));
    let post = |auth: Option<String>| {
        let mut request = client
            .post(format!("{}/v1/events", daemon.base))
            .header("content-type", "application/json")
            .body(events.clone());
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        request.send()
    };

    for auth in [
        None,
        Some(format!("Bearer {reader}")),
        Some(format!("Bearer {producer}x")),
        Some(format!("Basic {producer}")),
        Some("Bearer ".to_string()),
    ] {
        let response = post(auth.clone()).await.expect("post");
        assert_eq!(response.status().as_u16(), 401, "{auth:?}");
        let challenge = response
            .headers()
            .get("www-authenticate")
            .expect("WWW-Authenticate")
            .to_str()
            .expect("ascii")
            .to_string();
        assert!(challenge.starts_with("Bearer"), "{challenge}");
        let body: serde_json::Value = response.json().await.expect("json");
        assert!(body["error"].is_string(), "{body}");
    }
    let response = post(Some(format!("bearer {producer}")))
        .await
        .expect("post");
    assert_eq!(response.status().as_u16(), 202);

    let top = format!("{}/v1/boards/rooms_7d/top", daemon.base);
    let response = challenged_then_with(&client, &top, producer).await;
    assert_eq!(
        response.status().as_u16(),
        401,
        "the producer is not a reader"
    );
    let applied = wait_for(Duration::from_secs(20), || async {
        let response = client.get(&top).bearer_auth(reader).send().await;
        match response {
            Ok(r) if r.status().as_u16() == 200 => r
                .json::<serde_json::Value>()
                .await
                .is_ok_and(|page| page["count"] == 3),
            _ => false,
        }
    })
    .await;
    assert!(applied, "{}", daemon.logs());

    // No operator token configured: /metrics is open, and the probes always are.
    assert_eq!(daemon.get("/metrics").await.0, 200);
    assert_eq!(daemon.get("/healthz").await.0, 200);
    assert_eq!(daemon.get("/readyz").await.0, 200);

    let logs = daemon.logs();
    assert!(!logs.contains(producer) && !logs.contains(reader), "{logs}");
    daemon.terminate().await;
}

#[tokio::test]
async fn the_operator_token_from_the_environment_guards_metrics() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("dir");
    let http_port = free_port();
    let config = write_config_url(dir.path(), &redis.url(), http_port, "operator", "");
    let token = "operator-token-from-env-5e1";
    let log = dir.path().join("operator.log");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_rollboard"))
        .arg("--config")
        .arg(&config)
        .arg("run")
        .env_remove("ROLLBOARD_CONFIG")
        .env("ROLLBOARD_METRICS_TOKEN", token)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn rollboard run");
    let base = format!("http://127.0.0.1:{http_port}");
    let client = reqwest::Client::new();
    let up = wait_for(Duration::from_secs(20), || async {
        client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    assert!(up, "{}", std::fs::read_to_string(&log).unwrap_or_default());

    let metrics = format!("{base}/metrics");
    let response = challenged_then_with(&client, &metrics, token).await;
    assert_eq!(response.status().as_u16(), 200);
    assert!(response
        .text()
        .await
        .expect("body")
        .contains("rollboard_events_applied_total"));
    // Only /metrics is the operator's: the other roles have no token here.
    let top = client
        .get(format!("{base}/v1/boards/rooms_7d/top"))
        .send()
        .await
        .expect("get");
    assert_eq!(top.status().as_u16(), 200);

    child.kill().await.expect("kill");
    let logs = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!logs.contains(token), "{logs}");
}
