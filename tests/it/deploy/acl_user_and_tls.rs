//! Security as an operator deploys it: the shipped least-privilege ACL user (and a clear
//! refusal when a permission is missing), `rediss://` with a verified server certificate and
//! mutual TLS, and passwords that never show in errors or logs.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::support::acl::{acl_server, acl_url, Server, PASSWORD};
use crate::support::cli::{assert_contains, SpawnPiped};
use crate::support::config::{write_config_url, BOARDS};
use crate::support::daemon::Daemon;
use crate::support::events::{tips, tips_total};
use crate::support::keys::{intake_stream, schema};
use crate::support::redis::free_port;
use crate::support::sse::{entered, feed_boards, Sse};
use crate::support::wait::wait_for;

fn rollboard(config: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rollboard"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("ROLLBOARD_CONFIG")
        .env_remove("ROLLBOARD_INTAKE_TOKEN")
        .env_remove("ROLLBOARD_QUERY_TOKEN")
        .env_remove("ROLLBOARD_METRICS_TOKEN")
        .output()
        .expect("run rollboard")
}

fn rollboard_stdin(config: &Path, args: &[&str], input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rollboard"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("ROLLBOARD_CONFIG")
        .spawn_piped("spawn rollboard");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write events");
    child.wait_with_output().expect("wait")
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The sum of the totals on the first page of `rooms_7d`, as the CLI reports it.
fn rooms_total(config: &Path) -> Option<i64> {
    let out = rollboard(config, &["top", "rooms_7d", "--json", "--limit", "100"]);
    if !out.status.success() {
        return None;
    }
    let page: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    page["entries"]
        .as_array()?
        .iter()
        .map(|e| e["total"].as_i64())
        .sum()
}

#[tokio::test]
async fn the_shipped_acl_user_runs_the_daemon_and_the_cli_end_to_end() {
    let dir = tempfile::tempdir().expect("dir");
    let redis = acl_server(dir.path(), &[]);
    // The default user is off: nothing gets in without the rollboard user's password.
    let anonymous = Command::new("redis-cli")
        .args(["-p", &redis.port.to_string(), "PING"])
        .output()
        .expect("redis-cli");
    assert!(
        String::from_utf8_lossy(&anonymous.stdout).contains("NOAUTH"),
        "{anonymous:?}"
    );

    let http_port = free_port();
    let config = write_config_url(dir.path(), &acl_url(&redis), http_port, "acl", "");
    feed_boards(&config);
    let daemon = Daemon::start(&config, http_port).await;
    // The change feed: read by the daemon with the user's XINFO, XRANGE and XREAD.
    let mut feed = Sse::open(&daemon, "/v1/boards/rooms_7d/changes", None).await;
    let store = rollboard::store::Store::connect(
        &acl_url(&redis),
        "rb",
        1,
        rollboard::store::Reconnect::Never,
    )
    .await
    .expect("connect as the rollboard user");
    let id = entered(
        &store,
        &schema().changes("rooms_7d", None, None),
        "r1",
        1,
        5,
    )
    .await;
    let event = feed.next_event(Duration::from_secs(10)).await;
    assert_eq!(event.and_then(|e| e.id), Some(id), "{}", daemon.logs());
    drop(feed);

    let sent = rollboard_stdin(&config, &["send"], &tips("cli", 40));
    assert!(sent.status.success(), "{}", text(&sent));
    let body = format!("[{}]", tips("http", 20).trim().replace('\n', ","));
    let posted = reqwest::Client::new()
        .post(format!("{}/v1/events", daemon.base))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("post");
    assert_eq!(posted.status().as_u16(), 202);

    let want = tips_total(40) + tips_total(20);
    let applied = wait_for(Duration::from_secs(30), || async {
        rooms_total(&config) == Some(want)
    })
    .await;
    assert!(
        applied,
        "total {:?}, want {want}; daemon log:\n{}",
        rooms_total(&config),
        daemon.logs()
    );
    let (status, _) = daemon.get("/readyz").await;
    assert_eq!(status, 200);
    // The user's WATCH, MULTI and EXEC: the events were judged in the worker.
    let judged = daemon
        .metric("rollboard_judged_instances_total", &[("by", "worker")])
        .await;
    assert!(
        judged > 0.0,
        "nothing judged in the worker; log:\n{}",
        daemon.logs()
    );

    for args in [
        &["roll"][..],
        &["verify", "--strict"],
        &["rank", "rooms_7d", "r1", "--json"],
        &["around", "rooms_7d", "r1", "--json"],
        &["top", "fans_7d", "--scope", "r1", "--json"],
        &["rebuild", "fans_7d", "--scope", "r1"],
    ] {
        let out = rollboard(&config, args);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        assert!(
            !text(&out).contains(PASSWORD),
            "{args:?} shows the password"
        );
    }
    let logs = daemon.logs();
    assert!(!logs.contains(PASSWORD), "the daemon logged the password");
    assert!(!logs.contains("NOPERM"), "a permission is missing:\n{logs}");
    let status = daemon.terminate().await;
    assert!(status.success());
}

/// `rollboard run` with `config`, which must exit by itself (not retry) within 20 s.
async fn run_until_exit(config: &Path) -> Output {
    let log = config.with_extension("run.log");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_rollboard"))
        .arg("--config")
        .arg(config)
        .arg("run")
        .env_remove("ROLLBOARD_CONFIG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .kill_on_drop(true)
        .spawn()
        .expect("run rollboard");
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
    let stderr = std::fs::read(&log).unwrap_or_default();
    match status {
        Ok(status) => Output {
            status: status.expect("wait"),
            stdout: Vec::new(),
            stderr,
        },
        Err(_) => panic!(
            "the daemon kept retrying instead of exiting:\n{}",
            String::from_utf8_lossy(&stderr)
        ),
    }
}

#[tokio::test]
async fn a_missing_command_or_key_permission_stops_the_daemon_naming_it() {
    let dir = tempfile::tempdir().expect("dir");
    let redis = acl_server(dir.path(), &["+xack"]);
    let http_port = free_port();
    let config = write_config_url(dir.path(), &acl_url(&redis), http_port, "noack", "");
    let out = run_until_exit(&config).await;
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(64), "{shown}");
    assert!(shown.contains("XACK on key rb:events"), "{shown}");
    assert!(!shown.contains(PASSWORD), "{shown}");

    // A tool run says the same and exits 64 too.
    let out = rollboard(&config, &["top", "rooms_7d"]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    assert_contains(&text(&out), "XACK on key rb:events");

    // Keys outside the user's pattern (here: another key prefix) are named too.
    let other = dir.path().join("other.toml");
    let config_text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(
        &other,
        config_text.replacen("[ingest]", "key_prefix = \"other\"\n[ingest]", 1),
    )
    .expect("write");
    let redis_full = acl_server(dir.path(), &[]);
    let other_text = std::fs::read_to_string(&other)
        .expect("config")
        .replace(&acl_url(&redis), &acl_url(&redis_full));
    std::fs::write(&other, other_text).expect("write");
    let out = rollboard(&other, &["top", "rooms_7d"]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    assert_contains(&text(&out), "key other:{rooms_7d}:meta");
    assert!(!text(&out).contains(intake_stream()), "{}", text(&out));

    // A board with a change feed needs the feed's stream commands.
    let redis_noxread = acl_server(dir.path(), &["+xread"]);
    let feeds = dir.path().join("feeds.toml");
    std::fs::write(
        &feeds,
        config_text.replace(&acl_url(&redis), &acl_url(&redis_noxread)),
    )
    .expect("write");
    feed_boards(&feeds);
    let out = rollboard(&feeds, &["top", "rooms_7d"]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    assert_contains(
        &text(&out),
        "permissions rollboard needs (grant them as in deploy/redis/users.acl): XREAD",
    );

    // Without EVAL the probe itself is refused, and that is named.
    let redis_noeval = acl_server(dir.path(), &["+eval"]);
    let noeval = dir.path().join("noeval.toml");
    std::fs::write(
        &noeval,
        config_text.replace(&acl_url(&redis), &acl_url(&redis_noeval)),
    )
    .expect("write");
    let out = rollboard(&noeval, &["top", "rooms_7d"]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    assert!(text(&out).contains("EVAL"), "{}", text(&out));
}

/// A CA and a certificate it signed, as PEM files in `dir`.
struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

fn pki(dir: &Path, name: &str) -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let write = |file: &str, pem: String| {
        let path = dir.join(format!("{name}-{file}"));
        std::fs::write(&path, pem).expect("write pem");
        path
    };
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("rollboard test CA {name}"));
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params.self_signed(&ca_key).expect("ca cert");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);

    let leaf = |names: Vec<String>| {
        let key = KeyPair::generate().expect("key");
        let params = CertificateParams::new(names).expect("params");
        let cert = params.signed_by(&key, &issuer).expect("signed");
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf(vec!["localhost".into(), "127.0.0.1".into()]);
    let (client_cert, client_key) = leaf(vec!["rollboard-client".into()]);
    Pki {
        ca: write("ca.pem", ca_cert.pem()),
        server_cert: write("server.pem", server_cert),
        server_key: write("server.key", server_key),
        client_cert: write("client.pem", client_cert),
        client_key: write("client.key", client_key),
    }
}

fn tls_server(pki: &Pki, client_certs: bool) -> Server {
    let path = |p: &PathBuf| p.display().to_string();
    Server::start(
        &[
            "--tls-cert-file".into(),
            path(&pki.server_cert),
            "--tls-key-file".into(),
            path(&pki.server_key),
            "--tls-ca-cert-file".into(),
            path(&pki.ca),
            "--tls-auth-clients".into(),
            if client_certs { "yes" } else { "no" }.into(),
        ],
        true,
    )
}

/// A config for the CLI reaching `url` with the `[redis]` lines `redis`.
fn tls_config(dir: &Path, name: &str, url: &str, redis: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!("[redis]\nurl = \"{url}\"\n{redis}\n{BOARDS}"),
    )
    .expect("write config");
    path
}

#[test]
fn rediss_verifies_the_server_certificate_against_the_configured_ca() {
    let dir = tempfile::tempdir().expect("dir");
    let good = pki(dir.path(), "good");
    let other = pki(dir.path(), "other");
    let redis = tls_server(&good, false);
    let url = format!("rediss://127.0.0.1:{}", redis.port);

    let config = tls_config(
        dir.path(),
        "good",
        &url,
        &format!("tls_ca_file = \"{}\"", good.ca.display()),
    );
    let sent = rollboard_stdin(&config, &["send"], &tips("tls", 30));
    assert!(sent.status.success(), "{}", text(&sent));
    let rolled = rollboard(&config, &["roll"]);
    assert!(rolled.status.success(), "{}", text(&rolled));
    let out = rollboard(&config, &["verify"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = rollboard(&config, &["top", "rooms_7d", "--json"]);
    assert!(out.status.success(), "{}", text(&out));

    // A certificate from another CA is refused, saying why.
    let config = tls_config(
        dir.path(),
        "wrong",
        &url,
        &format!("tls_ca_file = \"{}\"", other.ca.display()),
    );
    let out = rollboard(&config, &["top", "rooms_7d"]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    let shown = text(&out);
    assert!(
        shown.contains("TLS handshake failed") && shown.contains("UnknownIssuer"),
        "{shown}"
    );

    // Plain redis:// to a TLS-only port does not silently work either.
    let config = tls_config(
        dir.path(),
        "plain",
        &format!("redis://127.0.0.1:{}", redis.port),
        "",
    );
    let out = rollboard(&config, &["top", "rooms_7d"]);
    assert!(!out.status.success(), "{}", text(&out));
}

#[tokio::test]
async fn wrong_credentials_or_an_untrusted_certificate_stop_the_daemon() {
    let dir = tempfile::tempdir().expect("dir");
    let redis = acl_server(dir.path(), &[]);
    let url = format!("redis://rollboard:not-{PASSWORD}@127.0.0.1:{}", redis.port);
    let config = write_config_url(dir.path(), &url, free_port(), "wrongpass", "");
    let out = run_until_exit(&config).await;
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    assert!(text(&out).contains("WRONGPASS"), "{}", text(&out));
    assert!(!text(&out).contains(PASSWORD), "{}", text(&out));

    let good = pki(dir.path(), "server");
    let other = pki(dir.path(), "untrusted");
    let tls = tls_server(&good, false);
    let url = format!("rediss://127.0.0.1:{}", tls.port);
    let config = tls_config(
        dir.path(),
        "untrusted",
        &url,
        &format!(
            "tls_ca_file = \"{}\"\n[http]\nlisten = \"127.0.0.1:{}\"",
            other.ca.display(),
            free_port()
        ),
    );
    let out = run_until_exit(&config).await;
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    assert!(text(&out).contains("UnknownIssuer"), "{}", text(&out));
}

#[test]
fn mutual_tls_presents_the_configured_client_certificate() {
    let dir = tempfile::tempdir().expect("dir");
    let pki = pki(dir.path(), "mtls");
    let redis = tls_server(&pki, true);
    let url = format!("rediss://127.0.0.1:{}", redis.port);
    let ca = format!("tls_ca_file = \"{}\"", pki.ca.display());

    let with_cert = tls_config(
        dir.path(),
        "with",
        &url,
        &format!(
            "{ca}\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"",
            pki.client_cert.display(),
            pki.client_key.display()
        ),
    );
    let out = rollboard_stdin(&with_cert, &["send"], &tips("m", 5));
    assert!(out.status.success(), "{}", text(&out));
    let out = rollboard(&with_cert, &["verify"]);
    assert!(out.status.success(), "{}", text(&out));

    let without = tls_config(dir.path(), "without", &url, &ca);
    let out = rollboard(&without, &["top", "rooms_7d"]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    assert!(text(&out).contains("CertificateRequired"), "{}", text(&out));
}

#[test]
fn tls_settings_are_checked_at_start_naming_the_key() {
    let dir = tempfile::tempdir().expect("dir");
    let pki = pki(dir.path(), "cfg");
    let cases = [
        (
            "redis://127.0.0.1:1",
            format!("tls_ca_file = \"{}\"", pki.ca.display()),
            "redis.tls_ca_file",
        ),
        (
            "rediss://127.0.0.1:1",
            "tls_ca_file = \"/nonexistent/ca.pem\"".to_string(),
            "redis.tls_ca_file",
        ),
        (
            "rediss://127.0.0.1:1",
            format!("tls_cert_file = \"{}\"", pki.client_cert.display()),
            "redis.tls_key_file",
        ),
        (
            "rediss://127.0.0.1:1",
            format!(
                "tls_cert_file = \"{}\"\ntls_key_file = \"{}\"",
                pki.client_cert.display(),
                pki.ca.display()
            ),
            "redis.tls_key_file",
        ),
        (
            "rediss://127.0.0.1:1",
            format!("tls_ca_file = \"{}\"", pki.client_key.display()),
            "redis.tls_ca_file",
        ),
        (
            "rediss://127.0.0.1:1",
            "tls_ca_fil = \"x\"".to_string(),
            "tls_ca_fil",
        ),
    ];
    for (i, (url, lines, key)) in cases.iter().enumerate() {
        let config = tls_config(dir.path(), &format!("bad{i}"), url, lines);
        let out = rollboard(&config, &["top", "rooms_7d"]);
        assert_eq!(out.status.code(), Some(64), "{lines}: {}", text(&out));
        assert!(text(&out).contains(key), "{lines}: {}", text(&out));
    }
}

#[tokio::test]
async fn passwords_in_the_url_never_show_in_errors_or_logs() {
    let dir = tempfile::tempdir().expect("dir");
    // Nothing listens there: the daemon logs its connection errors.
    let url = format!("redis://rollboard:{PASSWORD}@127.0.0.1:{}", free_port());
    let http_port = free_port();
    let config = write_config_url(dir.path(), &url, http_port, "secret", "");
    let daemon = Daemon::spawn(&config, http_port);
    // No port opens before Redis answers the start-up checks: the log is what shows.
    daemon.wait_log("cannot connect to redis yet").await;
    assert!(!daemon.logs().contains(PASSWORD), "{}", daemon.logs());
    daemon.kill().await;

    let out = rollboard(&config, &["top", "rooms_7d"]);
    assert!(!out.status.success());
    assert!(!text(&out).contains(PASSWORD), "{}", text(&out));
    assert!(text(&out).contains("rollboard:***@"), "{}", text(&out));

    let bad = tls_config(
        dir.path(),
        "badurl",
        &format!("redis://rollboard:{PASSWORD}@127.0.0.1:notaport"),
        "",
    );
    let out = rollboard(&bad, &["top", "rooms_7d"]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    assert!(!text(&out).contains(PASSWORD), "{}", text(&out));
}
