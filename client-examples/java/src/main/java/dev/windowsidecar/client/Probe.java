package dev.windowsidecar.client;

import io.grpc.Status;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.Locale;
import java.util.regex.Pattern;

/**
 * What answers at an address when a call failed below the sidecar's answers: one raw
 * connection, one line ({@code PING / HTTP/1.0}: an inline command to Redis, a request line to an
 * HTTP/1 server), and the reply's first bytes. Also the check of an address given as a URL.
 */
final class Probe {
  private Probe() {}

  /** The probe's line. */
  static final String LINE = "PING / HTTP/1.0\r\n\r\n";

  // What grpc-java says when what answered does not speak the sidecar's HTTP/2 gRPC (a Redis
  // server, an HTTP/1 server, an HTTP server's 404) or the connection broke.
  private static final Pattern TRANSPORT =
      Pattern.compile(
          "http2|http/2|protocol error|connection closed|connection reset|stream removed|goaway|"
              + "bad http|unexpected eof|network closed|first received frame was not settings|"
              + "http status code",
          Pattern.CASE_INSENSITIVE);

  /**
   * Whether {@code t} is a {@link ConnectionException} whose probe found something else than the
   * sidecar at the address (Redis, an HTTP/1 server, a TLS server reached in plaintext), which no
   * retry fixes.
   */
  static boolean notTheSidecar(Throwable t) {
    if (!(t instanceof ConnectionException c)) {
      return false;
    }
    for (String p :
        new String[] {
          "a Redis server answers", "an HTTP/1 server answers", "a TLS server answers", "an HTTP server answers"
        }) {
      if (c.reason().startsWith(p)) {
        return true;
      }
    }
    return false;
  }

  /** Whether a failed call's status came from below the sidecar's answers. */
  static boolean transportFailure(Status st) {
    String d = st.getDescription() == null ? "" : st.getDescription();
    return switch (st.getCode()) {
      case UNAVAILABLE, UNIMPLEMENTED, INTERNAL, UNKNOWN -> TRANSPORT.matcher(d).find();
      default -> false;
    };
  }

  /** A cause that needs no probe: nothing listens there, no such host, TLS failed. */
  static boolean plain(String cause) {
    String c = cause.toLowerCase(Locale.ROOT);
    return c.contains("connection refused")
        || c.contains("no such file")
        || c.contains("does not resolve")
        || c.contains("tls")
        || c.contains("certificate");
  }

  /** What kind of server sent {@code reply} to the probe's line; null when none the client knows. */
  static String whatAnswers(byte[] reply, int n, boolean tls) {
    String text = new String(reply, 0, n, StandardCharsets.ISO_8859_1);
    for (String p :
        new String[] {
          "+PONG", "-ERR", "-NOAUTH", "-WRONGPASS", "-NOPERM", "-DENIED", "-LOADING", "-MISCONF",
          "-READONLY", "-MASTERDOWN"
        }) {
      if (text.startsWith(p)) {
        return "a Redis server answers there, not the sidecar; "
            + ConnectionException.LISTEN_HINT
            + " (the sidecar reaches Redis through its own --redis-url)";
      }
    }
    if (text.startsWith("HTTP/1.")) {
      return "an HTTP/1 server answers there (the sidecar's metrics and probes port,"
          + " --metrics-listen?), not the sidecar's gRPC port; "
          + ConnectionException.LISTEN_HINT;
    }
    if (!tls && n >= 2 && reply[0] == 0x15 && reply[1] == 0x03) {
      return "a TLS server answers there and the client speaks plaintext; set"
          + " WINDOW_SIDECAR_TLS_CA (and _CERT, _KEY for mutual TLS) to connect with TLS";
    }
    return null;
  }

  /** Probes {@code address} (host:port) once; null when it cannot tell. */
  static String whatAnswersAt(String address, boolean tls) {
    if (address == null || address.startsWith("unix:")) {
      return null;
    }
    String where = address.replaceFirst("^(dns:///|dns:)", "");
    int i = where.lastIndexOf(':');
    if (i < 0) {
      return null;
    }
    int port;
    try {
      port = Integer.parseInt(where.substring(i + 1));
    } catch (NumberFormatException e) {
      return null;
    }
    String host = where.substring(0, i).replace("[", "").replace("]", "");
    try (Socket s = new Socket()) {
      s.connect(new InetSocketAddress(host.isEmpty() ? "127.0.0.1" : host, port), 1000);
      s.setSoTimeout(1000);
      OutputStream out = s.getOutputStream();
      out.write(LINE.getBytes(StandardCharsets.US_ASCII));
      out.flush();
      InputStream in = s.getInputStream();
      byte[] buf = new byte[64];
      int n = 0;
      while (n < 8) {
        int r;
        try {
          r = in.read(buf, n, buf.length - n);
        } catch (java.net.SocketTimeoutException e) {
          break;
        }
        if (r < 0) {
          break;
        }
        n += r;
      }
      return whatAnswers(buf, n, tls);
    } catch (java.io.IOException | RuntimeException e) {
      return null;
    }
  }

  /**
   * Why {@code target} is not an address the client can use (a URL where {@code host:port} or
   * {@code unix:/path} is expected); null otherwise.
   */
  static String addressProblem(String target) {
    if (target == null) {
      return null;
    }
    int i = target.indexOf("://");
    if (i <= 0) {
      return null;
    }
    String scheme = target.substring(0, i).toLowerCase(Locale.ROOT);
    if (scheme.equals("dns") || scheme.equals("unix") || scheme.equals("unix-abstract")) {
      return null;
    }
    String rest = target.substring(i + 3).split("/", 2)[0];
    rest = rest.substring(rest.lastIndexOf('@') + 1);
    if (scheme.equals("redis") || scheme.equals("rediss")) {
      return "the address is a Redis URL; "
          + ConnectionException.LISTEN_HINT
          + ", not Redis's (that one goes to the sidecar's --redis-url)";
    }
    String hint = rest.isEmpty() ? "give host:port" : "give " + rest;
    if (scheme.equals("https")) {
      hint += " and WINDOW_SIDECAR_TLS_CA for TLS";
    }
    return "the address is a URL, and the sidecar takes host:port or unix:/path: "
        + hint
        + " (WINDOW_SIDECAR_ADDR or the client's address)";
  }
}
