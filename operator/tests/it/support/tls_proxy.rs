//! A TLS front for a plain-HTTP server on 127.0.0.1 (as an Ingress would be): a
//! self-signed certificate for 127.0.0.1, every connection piped to the backend.

use std::sync::Arc;

/// A TLS acceptor with a fresh self-signed certificate for 127.0.0.1 and localhost (HTTP/1.1),
/// and the certificate's PEM (what a client is told to trust).
pub fn self_signed() -> (tokio_rustls::TlsAcceptor, String) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cert =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .unwrap();
    let pem = cert.cert.pem();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    (tokio_rustls::TlsAcceptor::from(Arc::new(config)), pem)
}

/// Serves TLS on a free port of 127.0.0.1 and pipes each connection to `backend`
/// (`127.0.0.1:PORT`); its `https://` base and the certificate's PEM.
pub async fn start(backend: String) -> (String, String) {
    let (acceptor, pem) = self_signed();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let backend = backend.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut plain) = tokio::net::TcpStream::connect(&backend).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    (format!("https://127.0.0.1:{}", addr.port()), pem)
}
