package dev.windowsidecar.client;

import io.grpc.netty.GrpcSslContexts;
import io.netty.handler.ssl.SslContext;
import io.netty.handler.ssl.SslContextBuilder;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;

/**
 * TLS settings of a channel to the sidecar (PEM files), and the Netty {@link SslContext} made of
 * them.
 *
 * @param ca the CA to verify the sidecar's certificate against; null: the JVM's default trust
 * @param cert the client certificate chain, for mutual TLS (with {@code key}); may be null
 * @param key the client certificate's private key (PKCS#8 PEM); null exactly when cert is
 * @param serverName the name to verify the sidecar's certificate for instead of the target's
 *     host (and the authority sent); null: the target's host, {@code localhost} on a Unix socket
 */
record Tls(Path ca, Path cert, Path key, String serverName) {
  Tls {
    if ((cert == null) != (key == null)) {
      throw new IllegalArgumentException(
          "a client certificate needs its key and a key its certificate ("
              + WindowClient.TLS_CERT_ENV
              + " and "
              + WindowClient.TLS_KEY_ENV
              + ")");
    }
    if (serverName != null && serverName.isEmpty()) {
      serverName = null;
    }
  }

  /** The client's SSL context (ALPN h2, as grpc-java wants it). */
  SslContext sslContext() {
    for (Path p : new Path[] {ca, cert, key}) {
      if (p != null && !Files.isReadable(p)) {
        throw new IllegalArgumentException("TLS file not readable: " + p);
      }
    }
    SslContextBuilder b = GrpcSslContexts.forClient();
    if (ca != null) {
      b.trustManager(ca.toFile());
    }
    if (cert != null) {
      b.keyManager(cert.toFile(), key.toFile());
    }
    try {
      return b.build();
    } catch (IOException e) {
      throw new UncheckedIOException("TLS settings " + this + ": " + e.getMessage(), e);
    }
  }
}
