package dev.windowsidecar.client;

import io.grpc.Status;

/**
 * The base of the client's own exceptions, the same hierarchy in every window-sidecar client
 * (client-examples/README.md): a failed call of the client, with the gRPC status underneath
 * ({@link #getStatus()}; the {@link io.grpc.StatusRuntimeException} is the cause), so that an
 * application catches these without importing gRPC.
 *
 * <ul>
 *   <li>{@link ConnectionException}: the sidecar cannot be reached (names the address and the
 *       cause, and what answers there instead: Redis, an HTTP/1 server, a URL);
 *   <li>{@link RedisUnavailableException}: the sidecar answered, and said Redis is unavailable;
 *   <li>{@link RefusedException}: the sidecar refused the call (token, policy, request, limit);
 *   <li>{@link CallTimeoutException}: the sidecar was reached but did not answer in time;
 *   <li>{@link RejectedException}: the sidecar refused a command or an outcome of a delivery;
 *   <li>{@link SubscriptionEndedException}: a subscription stopped for good;
 *   <li>{@link AlreadySettledException}: a command or an outcome after the delivery's outcome.
 * </ul>
 *
 * A {@code WindowException} itself is any other failed call, for example {@code
 * UNAUTHENTICATED} without the sidecar's token.
 */
public class WindowException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** The status (transient: a status is not serializable). */
  private final transient Status status;

  /** An exception with this message and the status of {@code cause} (if it has one). */
  public WindowException(String message, Throwable cause) {
    super(message, cause);
    this.status = cause == null ? null : Status.fromThrowable(cause);
  }

  /** An exception with this message and no status. */
  public WindowException(String message) {
    super(message);
    this.status = null;
  }

  /**
   * The gRPC status of the failed call (its code and description), or null when the error is not
   * a call's.
   */
  public Status getStatus() {
    return status;
  }

  /**
   * A failed call's throwable as the client's exception: a {@link ConnectionException} when the
   * transport could not reach {@code address}, the throwable itself when it is one of ours, else
   * a {@link WindowException} saying {@code "<call>: <CODE>: <description>"}.
   */
  static WindowException of(String call, String address, Throwable t) {
    return of(call, address, t, false, 0);
  }

  /** The sidecar's own messages for an unavailable Redis (its UNAVAILABLE answers). */
  static final String[] REDIS_UNAVAILABLE = {
    "Redis is unreachable", "Redis did not answer in time", "authentication to Redis failed"
  };

  /**
   * The client's exception for a failed call, by its cause: a transport that failed (the address
   * probed once to say what answers there instead: Redis, an HTTP/1 server, TLS), the sidecar's
   * answer that Redis is unavailable, a refusal, a deadline ({@code timeoutMs}, 0 when unknown),
   * or a {@code WindowException} with the status.
   */
  static WindowException of(String call, String address, Throwable t, boolean tls, long timeoutMs) {
    if (t instanceof java.util.concurrent.CompletionException && t.getCause() != null) {
      t = t.getCause();
    }
    if (t instanceof WindowException w) {
      return w;
    }
    Status st = Status.fromThrowable(t);
    String description = st.getDescription() == null ? "" : st.getDescription();
    if (st.getCode() == Status.Code.UNAVAILABLE) {
      for (String marker : REDIS_UNAVAILABLE) {
        if (description.contains(marker)) {
          return new RedisUnavailableException(address, call, description, t);
        }
      }
    }
    String cause = ConnectionException.causeOf(t);
    if (cause != null) {
      if (!Probe.plain(cause)) {
        String seen = Probe.whatAnswersAt(address, tls);
        if (seen != null) {
          cause = seen;
        }
      }
      return new ConnectionException(address, cause, t);
    }
    if (Probe.transportFailure(st)) {
      String seen = Probe.whatAnswersAt(address, tls);
      if (seen == null) {
        java.util.regex.Matcher m =
            java.util.regex.Pattern.compile(
                    "(?:http2 header with status:|HTTP status code) (\\d+)",
                    java.util.regex.Pattern.CASE_INSENSITIVE).matcher(description);
        seen =
            m.find()
                ? "an HTTP server answers there with " + m.group(1) + ", not the sidecar's gRPC service"
                : "the connection failed (" + st.getCode() + ": " + description + ")";
      }
      return new ConnectionException(address, seen, t);
    }
    if (st.getCode() == Status.Code.DEADLINE_EXCEEDED) {
      return new CallTimeoutException(address, call, timeoutMs, t);
    }
    if (RefusedException.STEPS.containsKey(st.getCode())) {
      return new RefusedException(address, call, st.getCode(), description, t);
    }
    return new WindowException(call + ": " + st.getCode() + (description.isEmpty() ? "" : ": " + description), t);
  }
}
