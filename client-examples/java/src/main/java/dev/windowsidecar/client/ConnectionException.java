package dev.windowsidecar.client;

import io.grpc.Status;
import java.net.ConnectException;
import java.net.NoRouteToHostException;
import java.net.SocketTimeoutException;
import java.net.UnknownHostException;
import java.nio.channels.UnresolvedAddressException;

/**
 * The sidecar cannot be reached: nothing listens at the address, the connection was refused or
 * timed out ({@link WindowClient.Builder#connectTimeout}). The message names the address and the
 * cause: {@code cannot reach the sidecar at 127.0.0.1:50079: connection refused}.
 */
public class ConnectionException extends WindowException {
  private static final long serialVersionUID = 1L;

  private final String address;
  private final String reason;

  /** The sidecar at {@code address} could not be reached, for {@code reason} ("connection refused"). */
  public ConnectionException(String address, String reason, Throwable cause) {
    super("cannot reach the sidecar at " + address + ": " + reason, cause);
    this.address = address;
    this.reason = reason;
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
        return "unknown host";
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
