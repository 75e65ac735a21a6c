package dev.windowsidecar.client;

import io.grpc.Status;
import java.net.ConnectException;
import java.net.NoRouteToHostException;
import java.net.SocketTimeoutException;
import java.net.UnknownHostException;
import java.nio.channels.UnresolvedAddressException;

/**
 * The sidecar cannot be reached: nothing listens at the address, the connection was refused or
 * timed out ({@link WindowClient.Builder#connectTimeout}), the host name does not resolve, TLS
 * failed, or what answers there is not the sidecar (a Redis server, an HTTP/1 server such as the
 * sidecar's metrics port, a URL given where {@code host:port} is expected). The message names the
 * address, the cause and what to do: {@code cannot reach the sidecar at 127.0.0.1:50079:
 * connection refused; nothing listens there: …}.
 */
public class ConnectionException extends WindowException {
  private static final long serialVersionUID = 1L;

  private final String address;
  private final String reason;

  /** The sidecar at {@code address} could not be reached, for {@code reason} ("connection refused"). */
  public ConnectionException(String address, String reason, Throwable cause) {
    super(message(address, reason), cause);
    this.address = address;
    this.reason = reason;
  }

  /** Where a message tells the user to point the client. */
  static final String LISTEN_HINT =
      "set WINDOW_SIDECAR_ADDR (or the client's address) to the sidecar's gRPC address, its"
          + " --listen (127.0.0.1:50051 by default)";

  private static String message(String address, String reason) {
    String step = nextStep(reason);
    return "cannot reach the sidecar at " + address + ": " + reason + (step.isEmpty() ? "" : "; " + step);
  }

  /** What to do about an unreachable sidecar, by its cause. */
  static String nextStep(String cause) {
    String text = cause.toLowerCase(java.util.Locale.ROOT);
    for (String p :
        new String[] {"a redis server", "an http/1 server", "a tls server", "an http server", "the address is a"}) {
      if (text.startsWith(p)) {
        return "";
      }
    }
    if (text.contains("connection refused") || text.contains("no such file or directory")) {
      return "nothing listens there: start the sidecar, or " + LISTEN_HINT;
    }
    if (text.contains("unknown host") || text.contains("does not resolve")) {
      return "check the host name in the address";
    }
    if (text.contains("tls") || text.contains("ssl") || text.contains("certificate") || text.contains("handshake")) {
      return "check WINDOW_SIDECAR_TLS_CA (and _CERT, _KEY) against the sidecar's --tls-cert, or unset"
          + " them for a plaintext sidecar";
    }
    if (text.contains("timed out") || text.contains("timeout")) {
      return "check the address, and that no firewall drops the connection";
    }
    return "is the sidecar running there? " + LISTEN_HINT;
  }

  /** The address the client dialled. */
  public String address() {
    return address;
  }

  /** The transport's reason, in a few words ("connection refused"). */
  public String reason() {
    return reason;
  }

  /**
   * Whether {@code t}, a failed call, is the transport failing to reach the sidecar, and why: an
   * {@code UNAVAILABLE} status whose cause is a connection error (grpc-java keeps Netty's
   * exception as the cause), or a connect timeout. Null when it is something else (for example
   * the sidecar's own UNAVAILABLE when Redis is unreachable).
   */
  static String causeOf(Throwable t) {
    Status st = Status.fromThrowable(t);
    if (st.getCode() != Status.Code.UNAVAILABLE && st.getCode() != Status.Code.DEADLINE_EXCEEDED) {
      return null;
    }
    for (Throwable c = t; c != null; c = c.getCause()) {
      String msg = c.getMessage() == null ? "" : c.getMessage();
      String lower = msg.toLowerCase(java.util.Locale.ROOT);
      if (lower.contains("connection refused")) {
        return "connection refused";
      }
      if (c instanceof SocketTimeoutException || lower.contains("connection timed out")) {
        return "connection timed out";
      }
      if (c instanceof NoRouteToHostException) {
        return "no route to host";
      }
      if (c instanceof UnknownHostException || c instanceof UnresolvedAddressException) {
        return "the host name does not resolve";
      }
      if (c instanceof javax.net.ssl.SSLException) {
        return "the TLS handshake failed (" + msg + ")";
      }
      if (lower.contains("no such file or directory")) {
        return "no such file or directory";
      }
      if (c instanceof ConnectException) {
        return msg.isEmpty() ? "connection failed" : msg;
      }
    }
    return null;
  }
}
