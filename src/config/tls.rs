//! The TLS side of `[redis]`: the CA, client certificate and key files, read and checked
//! into the rustls client configuration the connections use.

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Files that configure TLS to Redis: the CA that signed the server's certificate and,
/// for mutual TLS, the client's certificate chain and key (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificates to trust instead of the system's (`redis.tls_ca_file`).
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain (`redis.tls_cert_file`).
    pub cert_file: Option<PathBuf>,
    /// Client private key (`redis.tls_key_file`).
    pub key_file: Option<PathBuf>,
}

/// A TLS file that cannot be used, with the setting that names it.
#[derive(Debug, thiserror::Error)]
#[error("{key} = {path:?}: {reason}")]
pub struct TlsError {
    /// The setting, e.g. `redis.tls_ca_file`.
    pub key: &'static str,
    /// The file.
    pub path: std::path::PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

/// The rustls client configuration for `files`: the server's certificate is verified
/// against the CA file (the system's roots when there is none), and a client certificate
/// is presented when one is given (mutual TLS).
pub fn tls_client_config(files: &TlsFiles) -> Result<rustls::ClientConfig, TlsError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::PrivateKeyDer;

    let roots = roots(files.ca_file.as_deref())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| {
            fail(
                "redis.tls_ca_file",
                files.ca_file.as_deref().unwrap_or("".as_ref()),
                e.to_string(),
            )
        })?
        .with_root_certificates(roots);
    match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => {
            let chain = certs("redis.tls_cert_file", cert)?;
            let private = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                fail(
                    "redis.tls_key_file",
                    key,
                    format!("cannot read a PEM private key: {e}"),
                )
            })?;
            builder.with_client_auth_cert(chain, private).map_err(|e| {
                fail(
                    "redis.tls_key_file",
                    key,
                    format!("does not fit redis.tls_cert_file: {e}"),
                )
            })
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

/// The certificates the server's must chain to: those of the CA file, else the system's.
fn roots(ca_file: Option<&Path>) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for cert in certs("redis.tls_ca_file", path)? {
                roots.add(cert).map_err(|e| {
                    fail(
                        "redis.tls_ca_file",
                        path,
                        format!("not a CA certificate: {e}"),
                    )
                })?;
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(native.certs);
        }
    }
    Ok(roots)
}

/// The PEM certificates in the file `path` (at least one), named by `key`.
fn certs(
    key: &'static str,
    path: &Path,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, TlsError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| fail(key, path, format!("cannot read PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(fail(key, path, "holds no PEM certificate".into()));
    }
    Ok(certs)
}

fn fail(key: &'static str, path: &Path, reason: String) -> TlsError {
    TlsError {
        key,
        path: path.to_path_buf(),
        reason,
    }
}
